"""The :class:`Model` extension point: one async ``request()``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self

from ._types import Message, ModelResponse, ModelSettings, ToolCallDelta, ToolSpec

__all__ = ["Model"]


class Model(ABC):
    """A chat model behind one async call.

    Adapters translate the provider-neutral messages to the provider's wire format and
    map every provider failure into mainspring's error tree (``TransientError``,
    ``RateLimited``, ``ContextOverflow``, ``PermissionDenied``, ``QuotaExhausted``,
    ``ConfigError``). They never retry: the runtime retries, once, coordinated with the
    rate limiter and the journal.

    Attributes:
        name: ``"provider:model_id"``, the spelling :func:`~mainspring.models.resolve_model`
            accepts (e.g. ``"openai:gpt-4.1-mini"``); used in traces and price tables.
        provider: ``"openai"``, ``"anthropic"``, ``"scripted"``, ...; with ``model_id``
            it names the rate-limit bucket.
        model_id: the provider's name of the model (``"gpt-4.1-mini"``).
    """

    name: str
    provider: str
    model_id: str
    #: Whether :meth:`stream` hands out text as it is generated (adapters built with
    #: ``stream=True``, a :class:`ScriptedModel` given chunks). When ``False`` the
    #: runtime calls :meth:`request` and writes no live stream.
    streams: bool = False
    #: Whether requests leave the process for a provider's API. The limits an App learns
    #: from provider headers (on by default) apply to remote models only; a local model
    #: (a :class:`ScriptedModel`) is limited only by limits declared for it.
    remote: bool = True

    @abstractmethod
    async def request(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        settings: ModelSettings | None = None,
    ) -> ModelResponse:
        """Send one request and return the model's reply.

        Args:
            messages: the conversation, oldest first.
            tools: the tools the model may call.
            settings: sampling settings; ``None`` keeps the model's defaults.

        Returns:
            The reply: text and/or tool calls, finish reason, usage, rate-limit headers.

        Raises:
            TransientError: network trouble, a timeout, a 5xx or an overload; retry later.
            RateLimited: the provider refused for rate; retry after ``retry_after``.
            ContextOverflow: the prompt is longer than the model's context.
            PermissionDenied: credentials are missing, wrong or not allowed.
            QuotaExhausted: the account is out of credit or quota.
            ConfigError: the request itself is wrong (unknown model, bad parameter).
        """

    async def stream(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        settings: ModelSettings | None = None,
        on_text: Callable[[str], None],
        on_tool_call: Callable[[ToolCallDelta], None] | None = None,
    ) -> ModelResponse:
        """Send one request, calling ``on_text`` with each piece of the reply's text and
        ``on_tool_call`` with each piece of its tool calls' arguments as they arrive,
        and return the same reply :meth:`request` would (tool calls included). Errors
        are those of :meth:`request`; one raised after some output was handed out
        means that output is void (the runtime starts a new stream on retry).

        A model of your own that streams overrides this; one that predates
        ``on_tool_call`` (its ``stream`` takes no such argument) still works: the
        runtime then streams its text only.

        The default has nothing to stream: it calls :meth:`request` and hands out the
        whole text and each whole tool call at once."""
        reply = await self.request(messages, tools=tools, settings=settings)
        if reply.text:
            on_text(reply.text)
        if on_tool_call is not None:
            for index, call in enumerate(reply.tool_calls):
                on_tool_call(
                    ToolCallDelta(index=index, id=call.id, name=call.name, arguments=call.arguments)
                )
        return reply

    async def warm(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Do now the one-time work of a first request (an HTTP client, its lazy
        imports), so that a rate-limited request leaves when its slot says. The
        default has none."""

    async def aclose(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Release network resources (HTTP connections). The default has none."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
