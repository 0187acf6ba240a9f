"""OpenAI Chat Completions, and any OpenAI-compatible endpoint, through the official SDK.

``OpenAIModel("gpt-4.1-mini")`` talks to OpenAI; with ``base_url`` it talks to vLLM,
Ollama (``http://127.0.0.1:11434/v1``), llama.cpp's server, LM Studio or any other
server of the same wire protocol. The SDK's own retries are off (``max_retries=0``):
the runtime retries, coordinated with its rate limiter and journal.

Usage is reported as OpenAI counts it: ``input_tokens`` is the whole prompt, cached
tokens included; ``cache_read_tokens`` says how many of them came from the cache.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterable, Callable, Mapping, Sequence
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
    import openai
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("OpenAIModel", "openai", exc.name) from exc

__all__ = [
    "OpenAIModel",
    "assemble_chunks",
    "map_status_error",
    "messages_to_wire",
    "response_from_wire",
]

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}

_OVERLOADED = re.compile(r"overload", re.IGNORECASE)
_QUOTA_CODES = {"insufficient_quota", "billing_hard_limit_reached", "billing_not_active"}
_CONTEXT_CODES = {"context_length_exceeded", "exceed_context_size_error"}
# vLLM, llama.cpp, Ollama and LM Studio say it in words rather than with OpenAI's code.
_CONTEXT_WORDS = re.compile(
    r"maximum context length|context[ _]length|context window|context size"
    r"|prompt is too long|too many tokens|reduce the length",
    re.IGNORECASE,
)


class OpenAIModel(SdkModel[openai.AsyncOpenAI]):
    """A chat model behind the OpenAI Chat Completions API (function calling included).

    Args:
        model_id: the model's name at the endpoint (``"gpt-4.1-mini"``, ``"llama3"``).
        base_url: an OpenAI-compatible endpoint, ``/v1`` included
            (``"http://127.0.0.1:11434/v1"``); ``None`` reads ``OPENAI_BASE_URL``, else
            OpenAI itself.
        api_key: the key; ``None`` reads ``OPENAI_API_KEY``. With a ``base_url`` (or
            ``OPENAI_BASE_URL``) and no key anywhere, a placeholder is sent, as local
            servers ask for none; one that wants a key answers 401:
            :class:`PermissionDenied`.
        timeout_s: the deadline of one request; past it, :class:`TransientError`.
        client: an ``openai.AsyncOpenAI`` to use instead of making one (its retries are
            turned off). Without it, one client is made per event loop.
        stream: ask for a streamed reply (``stream: true`` with the usage chunk) so the
            runtime can show its text as it forms (:meth:`stream`, docs/streaming.md);
            the reply assembled is the one :meth:`request` returns.

    Raises:
        ConfigError: ``model_id`` is empty.
    """

    provider = "openai"
    sdk = openai
    stream_kwargs: ClassVar[Mapping[str, Any]] = {
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    def __init__(
        self,
        model_id: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        client: openai.AsyncOpenAI | None = None,
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
        # OpenAI's own endpoint wants max_completion_tokens (o-series refuse max_tokens);
        # compatible servers mostly know only max_tokens.
        self._official = base_url is None and not os.environ.get("OPENAI_BASE_URL")

    def _make_client(self) -> openai.AsyncOpenAI:
        key = self._api_key or os.environ.get("OPENAI_API_KEY")
        if key is None and (self.base_url is not None or os.environ.get("OPENAI_BASE_URL")):
            key = LOCAL_API_KEY  # a compatible server (base_url= or OPENAI_BASE_URL)
        if key is None:
            raise PermissionDenied(
                f"{self.name}: no API key: set OPENAI_API_KEY or pass api_key=; for a local "
                "OpenAI-compatible server give its base_url (or set OPENAI_BASE_URL)"
            )
        return openai.AsyncOpenAI(
            api_key=key, base_url=self.base_url, timeout=self.timeout_s, max_retries=0
        )

    def _resource(self, client: openai.AsyncOpenAI) -> Any:
        return client.chat.completions

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
        return await assemble_chunks(events, on_text, on_tool_call)

    def _status_error(
        self, status: int, body: object, headers: Mapping[str, str]
    ) -> MainspringError:
        return map_status_error(status, body, headers, model=self.name)

    def _request_kwargs(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None,
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model_id,
            "messages": messages_to_wire(messages),
            "timeout": self.timeout_s,
        }
        if tools:
            kwargs["tools"] = tools_to_wire(tools)
        if settings is not None:
            if settings.temperature is not None:
                kwargs["temperature"] = settings.temperature
            if settings.top_p is not None:
                kwargs["top_p"] = settings.top_p
            if settings.max_tokens is not None:
                key = "max_completion_tokens" if self._official else "max_tokens"
                kwargs[key] = settings.max_tokens
            if settings.stop:
                kwargs["stop"] = list(settings.stop)
            if settings.extra:
                # extra_body reaches the wire as is, whatever this SDK version's kwargs.
                kwargs["extra_body"] = dict(settings.extra)
        return kwargs


def messages_to_wire(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Provider-neutral messages as Chat Completions ``messages``."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            out.append({"role": "system", "content": message.content})
        elif isinstance(message, UserMessage):
            out.append({"role": "user", "content": message.content})
        elif isinstance(message, AssistantMessage):
            wire: dict[str, Any] = {"role": "assistant", "content": message.text}
            if message.tool_calls:
                wire["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for call in message.tool_calls
                ]
            elif message.text is None:
                wire["content"] = ""  # some compatible servers refuse a null content
            out.append(wire)
        elif isinstance(message, ToolResultMessage):
            content = message.content
            # The wire has no error flag: say it in the text so the model knows it failed.
            if message.is_error and not content.lower().startswith("error"):
                content = f"Error: {content}"
            out.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": content})
        else:  # pragma: no cover - typed away
            raise ConfigError(f"not a message: {message!r}")
    return out


def tools_to_wire(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Tool specifications as Chat Completions function tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
        for tool in tools
    ]


def _text_of(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # some compatible servers send content parts
        parts = [p.get("text", "") for p in content if isinstance(p, Mapping)]
        return "".join(parts)
    return str(content)


def response_from_wire(
    data: Mapping[str, Any],
    *,
    headers: Mapping[str, str],
    latency_s: float,
    model: str,
) -> ModelResponse:
    """A Chat Completions response body as a :class:`ModelResponse`.

    Raises:
        TransientError: the body has no choice to read (a broken reply; try again).
    """
    choices = data.get("choices") or []
    if not choices:
        raise TransientError(f"openai:{model}: the response has no choices: {dict(data)!r:.300}")
    choice = choices[0]
    message = choice.get("message") or {}
    text = _text_of(message.get("content"))
    calls: list[ToolCall] = []
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):  # a few servers send an object, not JSON text
            arguments = json.dumps(arguments if arguments is not None else {})
        calls.append(
            ToolCall(
                id=call.get("id") or f"call_{i}",
                name=function.get("name") or "",
                arguments=arguments,
            )
        )
    raw_reason = choice.get("finish_reason")
    finish: FinishReason = _FINISH.get(raw_reason or "", "other")
    if raw_reason is None or (calls and finish == "stop"):
        # Some compatible servers say "stop" (or nothing) even when they called tools.
        finish = "tool_calls" if calls else "stop"
    refusal = message.get("refusal")
    if refusal:
        finish = "refusal"
        text = text or refusal
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return ModelResponse(
        text=text,
        tool_calls=tuple(calls),
        finish_reason=finish,
        usage=Usage(
            input_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
            cache_read_tokens=int(details.get("cached_tokens") or 0),
        ),
        model=str(data.get("model") or model),
        rate_limit=rate_limit_headers(headers),
        latency_s=latency_s,
    )


async def assemble_chunks(
    chunks: AsyncIterable[Any],
    on_text: Callable[[str], None],
    on_tool_call: Callable[[ToolCallDelta], None] | None = None,
) -> dict[str, Any]:
    """``chat.completion.chunk`` events (the first choice's) as a Chat Completions
    body, handing each text delta to ``on_text`` and each piece of a tool call's
    arguments to ``on_tool_call`` (with the call's index, and its id and name as far
    as they came: in its first delta) as they arrive."""
    texts: list[str] = []
    refusals: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    usage: Any = None
    model = ""
    async for chunk in chunks:
        data = chunk if isinstance(chunk, Mapping) else chunk.model_dump(mode="json")
        model = data.get("model") or model
        usage = data.get("usage") or usage
        for choice in data.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                texts.append(delta["content"])
                on_text(delta["content"])
            if delta.get("refusal"):
                refusals.append(delta["refusal"])
            for part in delta.get("tool_calls") or []:
                slot = calls.setdefault(
                    int(part.get("index") or 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                fresh = slot["id"] is None and not slot["function"]["name"]
                slot["id"] = part.get("id") or slot["id"]
                function = part.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                piece = function.get("arguments") or ""
                slot["function"]["arguments"] += piece
                if on_tool_call is not None and (piece or fresh):
                    on_tool_call(
                        ToolCallDelta(
                            index=int(part.get("index") or 0),
                            id=slot["id"] or "",
                            name=slot["function"]["name"],
                            arguments=piece,
                        )
                    )
            finish = choice.get("finish_reason") or finish
    message = {
        "role": "assistant",
        "content": "".join(texts) if texts else None,
        "refusal": "".join(refusals) or None,
        "tool_calls": [calls[i] for i in sorted(calls)] or None,
    }
    return {
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }


def map_status_error(
    status: int, body: object, headers: Mapping[str, str], *, model: str
) -> MainspringError:
    """The mainspring error for an HTTP error from an OpenAI-compatible endpoint.

    429 → :class:`RateLimited` (``retry_after`` from ``retry-after-ms``, ``retry-after``
    or the exhausted ``x-ratelimit-reset-*``), but ``insufficient_quota`` →
    :class:`QuotaExhausted`; a 503 that says "overloaded" → :class:`Overloaded`; 408,
    409, 5xx → :class:`TransientError`; 401/403 →
    :class:`PermissionDenied`; a context-length refusal → :class:`ContextOverflow`;
    any other 4xx → :class:`ConfigError`.
    """
    err_type, code, message = error_fields(body)
    label = code or err_type
    detail = f"{model}: HTTP {status}" + (f" {label}" if label else "") + f": {message or body!r}"
    if status == 402 or code in _QUOTA_CODES or err_type in _QUOTA_CODES:
        return QuotaExhausted(detail)
    if status == 429:
        return RateLimited(
            detail,
            retry_after=retry_after_from_headers(headers),
            headers=rate_limit_headers(headers),
        )
    if status == 503 and (_OVERLOADED.search(message or "") or _OVERLOADED.search(label or "")):
        # "The engine is currently overloaded, please try again later": back-pressure.
        # Only an explicit retry-after counts: the rate-limit resets say nothing about
        # when an overloaded server recovers.
        return Overloaded(detail, retry_after=retry_after_from_headers(headers, resets=False))
    if status in (408, 409) or status >= 500:
        return TransientError(detail, retry_after=retry_after_from_headers(headers, resets=False))
    if status in (401, 403):
        return PermissionDenied(detail)
    if (
        status == 413
        or code in _CONTEXT_CODES
        or err_type in _CONTEXT_CODES
        or (message is not None and _CONTEXT_WORDS.search(message))
    ):
        return ContextOverflow(detail)
    return ConfigError(detail)
