"""Provider-neutral messages, tool specifications and model responses.

Plain frozen dataclasses, encoded for the journal through ``mainspring._serde``.
Adapters translate them to and from each provider's wire format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "AssistantMessage",
    "FinishReason",
    "Message",
    "ModelResponse",
    "ModelSettings",
    "SystemMessage",
    "ToolCall",
    "ToolCallDelta",
    "ToolResultMessage",
    "ToolSpec",
    "Usage",
    "UserMessage",
]

FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "refusal", "other"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A tool call the model asked for. ``arguments`` is the raw JSON text the model
    produced (it may be malformed: parsing and validation are the agent's job)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallDelta:
    """A piece of a tool call as a streaming model forms it (``Model.stream``'s
    ``on_tool_call``).

    Attributes:
        index: the call's place among the reply's tool calls (0, 1, ...): what tells
            the pieces of two calls apart.
        id / name: the call's id and tool name, ``""`` until the provider sent them
            (it sends them first: every adapter here passes them on every piece).
        arguments: the next piece of the raw JSON arguments text (``""`` when the
            call only begins).
    """

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Tokens of one request, as the provider reported them, normalised:
    ``input_tokens`` is the whole prompt, cached tokens included (OpenAI's meaning;
    Anthropic reports cache reads and writes apart, and the adapter adds them in)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemMessage:
    content: str
    kind: Literal["system"] = "system"


@dataclass(frozen=True, slots=True, kw_only=True)
class UserMessage:
    content: str
    kind: Literal["user"] = "user"


@dataclass(frozen=True, slots=True, kw_only=True)
class AssistantMessage:
    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    kind: Literal["assistant"] = "assistant"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResultMessage:
    tool_call_id: str
    name: str
    content: str
    is_error: bool = False
    kind: Literal["tool_result"] = "tool_result"


Message = SystemMessage | UserMessage | AssistantMessage | ToolResultMessage


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """What the model is told about a tool: its name, what it does, and the JSON
    schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSettings:
    """Sampling settings of one request (``None``: the provider's default)."""

    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelResponse:
    """One model reply.

    Attributes:
        text: the assistant's text, if any.
        tool_calls: tool calls in the order the model made them.
        finish_reason: why generation stopped, normalised across providers.
        usage: tokens reported by the provider.
        model: the model name the provider says answered.
        rate_limit: the response's rate-limit headers (``x-ratelimit-*``,
            ``anthropic-ratelimit-*``, ``retry-after``), lower-cased names.
        latency_s: wall time of the request.
        cost_usd: what the reply cost in USD by the caller's price table, set when
            the call is journaled (``call_model``); ``None``: not priced then (the
            model is not in the table), and readers price it from theirs.
        native: the reply in the shape of the framework that asked for it, as JSON,
            when a plain reply cannot carry it (an integration's adapter journals
            the OpenAI Agents SDK's ``ModelResponse`` here, to hand it back on
            replay); ``None`` for mainspring's own adapters.
    """

    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: FinishReason = "stop"
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    rate_limit: dict[str, str] = field(default_factory=dict)
    latency_s: float = 0.0
    cost_usd: float | None = None
    native: dict[str, Any] | None = None
