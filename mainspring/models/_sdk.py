"""What the OpenAI and Anthropic adapters share: both official SDKs come from one
generator, so one request goes the same way through either.

The flow lives here once: the client of this event loop (or the caller's, its retries
off), the raw-response call (its headers carry the rate limits), the parse that newer
SDKs make awaitable, the timing, a streamed reply assembled into the body a plain one
has, and the SDKs' errors mapped to mainspring's. Each adapter says only what is its
provider's: the client it builds, the resource that sends (``chat.completions``,
``messages``), the wire format both ways and the meaning of an HTTP error.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from abc import abstractmethod
from collections.abc import AsyncIterable, Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, ClassVar, Generic, TypeVar

from .._errors import ConfigError, MainspringError, TransientError
from ._base import Model
from ._common import LoopClients, transport_errors
from ._types import Message, ModelResponse, ModelSettings, ToolCallDelta, ToolSpec

__all__ = ["LOCAL_API_KEY", "SdkModel"]

# Local servers and keyless gateways ignore the key, but the SDKs refuse to send without one.
LOCAL_API_KEY = "not-needed"

C = TypeVar("C")


class SdkModel(Model, Generic[C]):
    """A model behind an official provider SDK's async client ``C``.

    Subclasses set :attr:`sdk` and :attr:`stream_kwargs` and implement the hooks below;
    :meth:`request`, :meth:`stream`, :meth:`warm` and :meth:`aclose` are the same for
    every such SDK.
    """

    #: The SDK's module: its errors (``APIStatusError``, ``APITimeoutError``,
    #: ``APIConnectionError``, ``APIError``) are spelled alike in both SDKs.
    sdk: ModuleType
    #: What a streamed request adds to the request's arguments.
    stream_kwargs: ClassVar[Mapping[str, Any]]

    def __init__(
        self,
        model_id: str,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout_s: float,
        client: Any,
        stream: bool,
    ) -> None:
        self.streams = stream
        if not model_id or not model_id.strip():
            raise ConfigError(f"{type(self).__name__} needs a model id, got {model_id!r}")
        self.model_id = model_id
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.name = f"{self.provider}:{model_id}" + (f"@{base_url}" if base_url else "")
        self._api_key = api_key
        self._given: C | None = client.with_options(max_retries=0) if client is not None else None
        self._clients: LoopClients[C] = LoopClients(self._make_client, _close_client)

    # -- what each provider says ---------------------------------------------------------

    @abstractmethod
    def _make_client(self) -> C:
        """A new client for this event loop, its retries off (the runtime retries)."""

    @abstractmethod
    def _resource(self, client: C) -> Any:
        """The SDK resource that sends a request (``client.chat.completions``,
        ``client.messages``); the client builds it lazily on first access."""

    @abstractmethod
    def _request_kwargs(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None,
    ) -> dict[str, Any]:
        """The SDK call's arguments for a request."""

    @abstractmethod
    def _response(
        self, data: Mapping[str, Any], headers: Mapping[str, str], latency_s: float
    ) -> ModelResponse:
        """A response body, as the API sends it, read as a :class:`ModelResponse`."""

    @abstractmethod
    async def _assemble(
        self,
        events: AsyncIterable[Any],
        on_text: Callable[[str], None],
        on_tool_call: Callable[[ToolCallDelta], None] | None,
    ) -> dict[str, Any]:
        """A streamed reply's events as the body a plain request gets, handing out the
        deltas as they arrive."""

    @abstractmethod
    def _status_error(
        self, status: int, body: object, headers: Mapping[str, str]
    ) -> MainspringError:
        """The mainspring error for an HTTP error answer."""

    # -- the same for every SDK ------------------------------------------------------------

    def _client(self) -> C:
        return self._given if self._given is not None else self._clients.get()

    async def warm(self) -> None:
        """Make this event loop's client and its lazily built resources (see
        :meth:`Model.warm`)."""
        self._resource(self._client())

    async def aclose(self) -> None:
        """Close this event loop's HTTP client (a ``client=`` given by the caller is theirs)."""
        await self._clients.aclose()

    async def request(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        settings: ModelSettings | None = None,
    ) -> ModelResponse:
        """Send one request; see :meth:`Model.request`."""
        kwargs = self._request_kwargs(messages, tools, settings)
        client = self._client()
        started = time.perf_counter()
        with self._mapped_errors():
            raw: Any = await self._resource(client).with_raw_response.create(**kwargs)
            parsed = await _parsed(raw)
        latency = time.perf_counter() - started
        return self._response(parsed.model_dump(mode="json"), raw.headers, latency)

    async def stream(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        settings: ModelSettings | None = None,
        on_text: Callable[[str], None],
        on_tool_call: Callable[[ToolCallDelta], None] | None = None,
    ) -> ModelResponse:
        """Send one streamed request, handing out its text deltas and its tool calls'
        argument deltas; see :meth:`Model.stream`. The events are assembled into the
        body a plain request gets, read as :meth:`request` reads it."""
        kwargs = {**self._request_kwargs(messages, tools, settings), **self.stream_kwargs}
        client = self._client()
        started = time.perf_counter()
        with self._mapped_errors():
            raw: Any = await self._resource(client).with_raw_response.create(**kwargs)
            events = await _parsed(raw)
            body = await self._assemble(events, on_text, on_tool_call)
        return self._response(body, raw.headers, time.perf_counter() - started)

    @contextlib.contextmanager
    def _mapped_errors(self) -> Iterator[None]:
        """The SDK's errors as mainspring's."""
        sdk = self.sdk
        try:
            yield
        except sdk.APIStatusError as exc:
            raise self._status_error(exc.status_code, exc.body, exc.response.headers) from exc
        except sdk.APITimeoutError as exc:
            raise TransientError(f"{self.name}: request timed out after {self.timeout_s}s") from exc
        except sdk.APIConnectionError as exc:
            raise TransientError(f"{self.name}: connection failed: {exc}") from exc
        except sdk.APIError as exc:  # an error event in the middle of a stream
            raise TransientError(f"{self.name}: the stream broke off: {exc}") from exc
        except transport_errors() as exc:  # the connection dropped in the middle of a stream
            raise TransientError(f"{self.name}: the stream broke off: {exc!r}") from exc


async def _parsed(raw: Any) -> Any:
    """A raw response's parsed body: newer SDKs' raw responses parse asynchronously."""
    parsed = raw.parse()
    if inspect.isawaitable(parsed):
        parsed = await parsed
    return parsed


async def _close_client(client: Any) -> None:
    await client.close()
