"""Anthropic's Messages API through the official SDK.

System messages become the ``system`` parameter; tool calls are ``tool_use`` blocks and
tool results ``tool_result`` blocks, merged into one user message as the API requires.
The SDK's own retries are off (``max_retries=0``): the runtime retries.

Usage is normalised to OpenAI's convention so budgets and limiters read one meaning:
``input_tokens`` is the whole prompt (Anthropic's ``input_tokens`` plus
``cache_read_input_tokens`` plus ``cache_creation_input_tokens``); ``cache_read_tokens``
and ``cache_write_tokens`` say how many of them were read from or written to the cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import AsyncIterable, Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from .._errors import (
    ConfigError,
    ContextOverflow,
    MainspringError,
    MissingExtra,
    Overloaded,
    PermissionDenied,
    QuotaExhausted,
    RateLimited,
    TransientError,
)
from ._common import error_fields, rate_limit_headers, retry_after_from_headers
from ._sdk import LOCAL_API_KEY, SdkModel
from ._types import (
    AssistantMessage,
    FinishReason,
    Message,
    ModelResponse,
    ModelSettings,
    SystemMessage,
    ToolCall,
    ToolCallDelta,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)

try:
    import anthropic
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("AnthropicModel", "anthropic", exc.name) from exc

__all__ = [
    "AnthropicModel",
    "assemble_events",
    "map_status_error",
    "messages_to_wire",
    "response_from_wire",
]

_STOP: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "refusal",
}

_CONTEXT_WORDS = re.compile(r"prompt is too long|context window|too many tokens", re.IGNORECASE)
_QUOTA_WORDS = re.compile(r"credit balance|billing|spend limit|quota", re.IGNORECASE)


class AnthropicModel(SdkModel[anthropic.AsyncAnthropic]):
    """A Claude model behind the Anthropic Messages API (tool use included).

    Args:
        model_id: the model's name (``"claude-sonnet-4-5"``).
        base_url: another endpoint of the same API (a proxy, a gateway, a fake server);
            ``None`` for Anthropic's.
        api_key: the key; ``None`` lets the SDK find it (``ANTHROPIC_API_KEY`` and the
            SDK's other credential sources). With a ``base_url`` (or
            ``ANTHROPIC_BASE_URL``) and no key anywhere, a placeholder is sent, as
            local servers and keyless gateways ask for none (the OpenAI adapter does
            the same); a server that wants one answers 401: :class:`PermissionDenied`.
        timeout_s: the deadline of one request; past it, :class:`TransientError`.
        client: an ``anthropic.AsyncAnthropic`` to use instead of making one (its
            retries are turned off). Without it, one client is made per event loop.
        max_tokens: the reply's token cap when the request's settings give none (the
            API requires one).
        stream: ask for a streamed reply (``stream: true``) so the runtime can show its
            text as it forms (:meth:`stream`, docs/streaming.md); the reply assembled
            from the events is the one :meth:`request` returns.

    Raises:
        ConfigError: ``model_id`` is empty or ``max_tokens`` is not positive.
    """

    provider = "anthropic"
    sdk = anthropic
    stream_kwargs: ClassVar[Mapping[str, Any]] = {"stream": True}

    def __init__(
        self,
        model_id: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        client: anthropic.AsyncAnthropic | None = None,
        max_tokens: int = 4096,
        stream: bool = False,
    ) -> None:
        super().__init__(
            model_id,
            base_url=base_url,
            api_key=api_key,
            timeout_s=timeout_s,
            client=client,
            stream=stream,
        )
        if max_tokens < 1:
            raise ConfigError(f"AnthropicModel max_tokens must be positive, got {max_tokens!r}")
        self.max_tokens = max_tokens

    def _make_client(self) -> anthropic.AsyncAnthropic:
        key = self._api_key or os.environ.get("ANTHROPIC_API_KEY")
        if key is None and (self.base_url or os.environ.get("ANTHROPIC_BASE_URL")):
            key = LOCAL_API_KEY  # the SDK insists on credentials; a local server needs none
        return anthropic.AsyncAnthropic(
            api_key=key,
            base_url=self.base_url,
            timeout=self.timeout_s,
            max_retries=0,
        )

    def _resource(self, client: anthropic.AsyncAnthropic) -> Any:
        return client.messages

    def _response(
        self, data: Mapping[str, Any], headers: Mapping[str, str], latency_s: float
    ) -> ModelResponse:
        return response_from_wire(data, headers=headers, latency_s=latency_s, model=self.model_id)

    async def _assemble(
        self,
        events: AsyncIterable[Any],
        on_text: Callable[[str], None],
        on_tool_call: Callable[[ToolCallDelta], None] | None,
    ) -> dict[str, Any]:
        return await assemble_events(events, on_text, on_tool_call)

    def _status_error(
        self, status: int, body: object, headers: Mapping[str, str]
    ) -> MainspringError:
        return map_status_error(status, body, headers, model=self.name)

    @contextlib.contextmanager
    def _mapped_errors(self) -> Iterator[None]:
        """The SDK's errors as mainspring's (see :class:`SdkModel`), and its missing
        credentials as :class:`PermissionDenied`."""
        try:
            with super()._mapped_errors():
                yield
        except TypeError as exc:
            # The SDK's way of saying it found no credentials, before any request is sent.
            if "authentication" not in str(exc):
                raise
            raise PermissionDenied(
                f"{self.name}: no API key: set ANTHROPIC_API_KEY or pass api_key= ({exc})"
            ) from exc

    def _request_kwargs(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None,
    ) -> dict[str, Any]:
        system, wire = messages_to_wire(messages)
        kwargs: dict[str, Any] = {
            "model": self.model_id,
            "messages": wire,
            "max_tokens": self.max_tokens,
            "timeout": self.timeout_s,
        }
        if system:
            kwargs["system"] = system
        if tools:
            kwargs["tools"] = tools_to_wire(tools)
        if settings is not None:
            if settings.max_tokens is not None:
                kwargs["max_tokens"] = settings.max_tokens
            if settings.stop:
                kwargs["stop_sequences"] = list(settings.stop)
            # Sampling knobs go through extra_body: SDK releases differ on which of them
            # they take as keyword arguments, the wire has always taken them.
            extra: dict[str, Any] = {}
            if settings.temperature is not None:
                extra["temperature"] = settings.temperature
            if settings.top_p is not None:
                extra["top_p"] = settings.top_p
            extra.update(settings.extra)
            if extra:
                kwargs["extra_body"] = extra
        return kwargs


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    # The API wants an object here even for a call the model botched earlier; the tool
    # result that follows it already tells the model what was wrong.
    return value if isinstance(value, dict) else {}


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.text:  # the API refuses empty text blocks
        blocks.append({"type": "text", "text": message.text})
    blocks.extend(
        {
            "type": "tool_use",
            "id": call.id,
            "name": call.name,
            "input": _tool_input(call.arguments),
        }
        for call in message.tool_calls
    )
    return blocks


def _tool_result_block(message: ToolResultMessage) -> dict[str, Any]:
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": message.tool_call_id,
        "content": message.content,
    }
    if message.is_error:
        block["is_error"] = True
    return block


def messages_to_wire(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """Provider-neutral messages as the Messages API's ``(system, messages)``.

    System messages, wherever they are, are joined into ``system``. Turns alternate:
    consecutive user-side content (tool results, then user text) becomes one user
    message, consecutive assistant content one assistant message.
    """
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for message in messages:
        if isinstance(message, SystemMessage):
            system.append(message.content)
        elif isinstance(message, UserMessage):
            add("user", [{"type": "text", "text": message.content}] if message.content else [])
        elif isinstance(message, AssistantMessage):
            add("assistant", _assistant_blocks(message))
        elif isinstance(message, ToolResultMessage):
            add("user", [_tool_result_block(message)])
        else:  # pragma: no cover - typed away
            raise ConfigError(f"not a message: {message!r}")
    return "\n\n".join(system), out


def tools_to_wire(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Tool specifications as Messages API tools."""
    return [
        {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
        for tool in tools
    ]


def response_from_wire(
    data: Mapping[str, Any],
    *,
    headers: Mapping[str, str],
    latency_s: float,
    model: str,
) -> ModelResponse:
    """A Messages API response body as a :class:`ModelResponse`."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in data.get("content") or []:
        kind = block.get("type")
        if kind == "text":
            texts.append(block.get("text") or "")
        elif kind == "tool_use":
            calls.append(
                ToolCall(
                    id=str(block.get("id") or f"toolu_{len(calls)}"),
                    name=str(block.get("name") or ""),
                    arguments=json.dumps(block.get("input") or {}),
                )
            )
        # thinking and server-tool blocks are not part of the neutral reply
    stop = data.get("stop_reason")
    finish: FinishReason = _STOP.get(stop or "", "other")
    if stop is None:
        finish = "tool_calls" if calls else "stop"
    usage = data.get("usage") or {}
    cache_read = int(usage.get("cache_read_input_tokens") or 0)
    cache_write = int(usage.get("cache_creation_input_tokens") or 0)
    return ModelResponse(
        text="".join(texts) if texts else None,
        tool_calls=tuple(calls),
        finish_reason=finish,
        usage=Usage(
            input_tokens=int(usage.get("input_tokens") or 0) + cache_read + cache_write,
            output_tokens=int(usage.get("output_tokens") or 0),
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
        ),
        model=str(data.get("model") or model),
        rate_limit=rate_limit_headers(headers),
        latency_s=latency_s,
    )


class _Assembly:
    """The message being rebuilt from a stream's events, one method per kind of event."""

    def __init__(
        self, on_text: Callable[[str], None], on_tool_call: Callable[[ToolCallDelta], None] | None
    ) -> None:
        self.on_text = on_text
        self.on_tool_call = on_tool_call
        self.message: dict[str, Any] = {"content": [], "usage": {}}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial: dict[int, list[str]] = {}
        self.calls: dict[int, int] = {}  # a tool_use block's index -> its place among the calls

    def tool_piece(self, index: int, piece: str) -> None:
        if self.on_tool_call is not None and index in self.calls:
            block = self.blocks[index]
            self.on_tool_call(
                ToolCallDelta(
                    index=self.calls[index],
                    id=str(block.get("id") or ""),
                    name=str(block.get("name") or ""),
                    arguments=piece,
                )
            )

    def message_start(self, data: Mapping[str, Any]) -> None:
        self.message = dict(data.get("message") or {})
        self.message["usage"] = dict(self.message.get("usage") or {})

    def block_start(self, index: int, data: Mapping[str, Any]) -> None:
        self.blocks[index] = dict(data.get("content_block") or {})
        if self.blocks[index].get("type") == "tool_use":
            self.calls[index] = len(self.calls)
            self.tool_piece(index, "")

    def block_delta(self, index: int, data: Mapping[str, Any]) -> None:
        delta = data.get("delta") or {}
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        if delta.get("type") == "text_delta" and block.get("type") == "text":
            block["text"] = (block.get("text") or "") + delta.get("text", "")
            if delta.get("text"):
                self.on_text(delta["text"])
        elif delta.get("type") == "input_json_delta":
            piece = delta.get("partial_json") or ""
            self.partial.setdefault(index, []).append(piece)
            if piece:
                self.tool_piece(index, piece)

    def block_stop(self, index: int) -> None:
        if index in self.partial:
            text = "".join(self.partial.pop(index))
            self.blocks[index]["input"] = json.loads(text) if text.strip() else {}

    def message_delta(self, data: Mapping[str, Any]) -> None:
        delta = data.get("delta") or {}
        for key in ("stop_reason", "stop_sequence"):
            if key in delta:
                self.message[key] = delta[key]
        usage = data.get("usage") or {}
        self.message["usage"].update({k: v for k, v in usage.items() if v is not None})

    def result(self) -> dict[str, Any]:
        self.message["content"] = [self.blocks[i] for i in sorted(self.blocks)]
        return self.message


async def assemble_events(
    events: AsyncIterable[Any],
    on_text: Callable[[str], None],
    on_tool_call: Callable[[ToolCallDelta], None] | None = None,
) -> dict[str, Any]:
    """Streamed Messages API events as the message a non-streamed request gets,
    handing each text delta to ``on_text`` and, for a ``tool_use`` block, its start
    (id and tool name, from ``content_block_start``) and each ``input_json_delta`` to
    ``on_tool_call`` as they arrive (numbered among the reply's tool calls)."""
    assembly = _Assembly(on_text, on_tool_call)
    async for event in events:
        data = event if isinstance(event, Mapping) else event.model_dump(mode="json")
        kind = data.get("type")
        index = int(data.get("index") or 0)
        if kind == "message_start":
            assembly.message_start(data)
        elif kind == "content_block_start":
            assembly.block_start(index, data)
        elif kind == "content_block_delta":
            assembly.block_delta(index, data)
        elif kind == "content_block_stop":
            assembly.block_stop(index)
        elif kind == "message_delta":
            assembly.message_delta(data)
    return assembly.result()


def map_status_error(
    status: int, body: object, headers: Mapping[str, str], *, model: str
) -> MainspringError:
    """The mainspring error for an HTTP error from the Messages API.

    429 → :class:`RateLimited` (``retry_after`` from ``retry-after`` or the exhausted
    ``anthropic-ratelimit-*-reset``); 529 / ``overloaded_error`` → :class:`Overloaded`
    (back-pressure, ``retry_after`` only from ``retry-after``); 408, 409 and other 5xx →
    :class:`TransientError`; billing and credit errors → :class:`QuotaExhausted`;
    401/403 → :class:`PermissionDenied`; "prompt is too long" and 413 →
    :class:`ContextOverflow`; any other 4xx → :class:`ConfigError`.
    """
    err_type, code, message = error_fields(body)
    label = code or err_type
    detail = f"{model}: HTTP {status}" + (f" {label}" if label else "") + f": {message or body!r}"
    if status == 429:
        return RateLimited(
            detail,
            retry_after=retry_after_from_headers(headers),
            headers=rate_limit_headers(headers),
        )
    if status == 529 or err_type == "overloaded_error":
        # Only an explicit retry-after counts: rate-limit resets say nothing about when
        # an overloaded server recovers.
        return Overloaded(detail, retry_after=retry_after_from_headers(headers, resets=False))
    if status in (408, 409) or status >= 500:
        return TransientError(detail, retry_after=retry_after_from_headers(headers, resets=False))
    if (
        status == 402
        or err_type == "billing_error"
        or (code is not None and _QUOTA_WORDS.search(code.replace("_", " ")))
        or (status == 400 and message is not None and _QUOTA_WORDS.search(message))
    ):
        return QuotaExhausted(detail)
    if status in (401, 403):
        return PermissionDenied(detail)
    if status == 413 or (message is not None and _CONTEXT_WORDS.search(message)):
        return ContextOverflow(detail)
    return ConfigError(detail)
