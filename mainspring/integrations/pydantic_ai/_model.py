"""Model requests of a Pydantic AI agent as journaled steps, through the shared limiter.

:class:`JournaledModel` is a Pydantic AI ``WrapperModel`` that the run's capability
puts around whatever model serves each request. Each request goes through
:func:`mainspring.agent.call_model` (a ``rate:`` booking, then one ``model:`` step,
a 429 or an overload waited out, never failed) on a one-call mainspring
:class:`~mainspring.models.Model` (:class:`_Sender`) that sends the Pydantic AI
request as it is. The step's journaled reply is a :class:`PydanticAIReply`: the
fields mainspring's traces, metrics and dashboard read (text, tool calls, usage,
cost) and, in ``response``, Pydantic AI's own ``ModelResponse`` as
``ModelMessagesTypeAdapter`` dumps it (JSON, never pickle). A replay revives that
response and sends nothing.

Rate-limit headers: a refusal's come with the error (``ModelHTTPError.headers``). A
successful reply's are read by a response hook on the HTTP client of the provider's
SDK client (``model.client``, the OpenAI and Anthropic models' public property), into
a context variable the request sets: the limiter learns the announced limits as it
does from mainspring's own adapters. A model with no such client (a test model, a
gateway of another kind) still books and waits; only that learning is missing.
"""

from __future__ import annotations

import contextvars
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import exceptions as pai_errors
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponseStreamEvent,
    PartDeltaEvent,
    PartStartEvent,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolCallPartDelta,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.messages import ModelResponse as PaiResponse
from pydantic_ai.models import (
    CompletedStreamedResponse,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models import Model as PaiModel
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings as PaiSettings
from pydantic_ai.tools import RunContext as PaiContext

from mainspring import (
    ConfigError,
    ContextOverflow,
    Overloaded,
    PermissionDenied,
    QuotaExhausted,
    RateLimited,
    TransientError,
)
from mainspring.models import (
    AssistantMessage,
    FinishReason,
    Message,
    Model,
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

__all__ = ["JournaledModel", "ModelCaller", "PydanticAIReply", "Sender", "to_response"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PydanticAIReply(ModelResponse):
    """A model step's journaled reply: mainspring's fields, and Pydantic AI's response.

    Attributes:
        response: the ``ModelResponse`` as ``ModelMessagesTypeAdapter`` dumps it to JSON.
    """

    response: dict[str, Any] = field(default_factory=dict)


def to_response(reply: PydanticAIReply) -> PaiResponse:
    """The Pydantic AI ``ModelResponse`` a journaled reply holds."""
    (message,) = ModelMessagesTypeAdapter.validate_python([reply.response])
    assert isinstance(message, PaiResponse)
    return message


# -- rate-limit headers of successful replies ------------------------------------------

_SINK: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "mainspring_pydantic_ai_headers", default=None
)
_HOOKED: set[int] = set()  # ids of HTTP clients that carry the hook (clients live long)
_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "retry-after")


def rate_limit_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The rate-limit headers among ``headers``, names lower-cased."""
    if not headers:
        return {}
    return {k.lower(): str(v) for k, v in headers.items() if k.lower().startswith(_PREFIXES)}


async def _keep_headers(response: Any) -> None:
    sink = _SINK.get()
    if sink is not None:
        sink.update(rate_limit_headers(response.headers))


def _hook(model: PaiModel) -> None:
    """Put the header hook on the HTTP client under ``model``'s SDK client, once."""
    sdk = getattr(model, "client", None)
    http = getattr(sdk, "_client", None)  # the SDK's HTTP client (httpx2/httpx)
    hooks = getattr(http, "event_hooks", None)
    if http is None or not isinstance(hooks, dict) or id(http) in _HOOKED:
        return
    _HOOKED.add(id(http))
    hooks.setdefault("response", [])
    if _keep_headers not in hooks["response"]:
        hooks["response"].append(_keep_headers)
        http.event_hooks = hooks


# -- errors ----------------------------------------------------------------------------


def _mainspring_error(exc: pai_errors.ModelAPIError) -> Exception:
    """What mainspring's runtime knows to do with a Pydantic AI model error."""
    retry_after = exc.retry_after
    headers = rate_limit_headers(getattr(exc, "headers", None))
    text = f"{exc.model_name}: {exc}"
    if isinstance(exc, pai_errors.ModelQuotaExceededError):
        return QuotaExhausted(text)
    if isinstance(exc, pai_errors.ModelRateLimitError):
        return RateLimited(text, retry_after=retry_after, headers=headers)
    if isinstance(exc, pai_errors.ModelOverloadedError):
        return Overloaded(text, retry_after=retry_after)
    if isinstance(exc, pai_errors.ModelContextWindowExceededError):
        return ContextOverflow(text)
    if isinstance(exc, pai_errors.ModelAuthenticationError):
        return PermissionDenied(text)
    if isinstance(exc, pai_errors.ModelRequestRejectedError):
        return ConfigError(text)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 409):
        return ConfigError(text)
    return TransientError(text, retry_after=retry_after)


# -- one request, as a mainspring Model --------------------------------------------------


_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "content_filter": "content_filter",
    "tool_call": "tool_calls",
}


def _reply(response: PaiResponse, headers: Mapping[str, str], latency_s: float) -> PydanticAIReply:
    texts = [p.content for p in response.parts if isinstance(p, TextPart)]
    calls = tuple(
        ToolCall(id=p.tool_call_id, name=p.tool_name, arguments=p.args_as_json_str())
        for p in response.parts
        if isinstance(p, ToolCallPart)
    )
    usage = response.usage
    return PydanticAIReply(
        text="".join(texts) if texts else None,
        tool_calls=calls,
        finish_reason=_FINISH.get(response.finish_reason or "", "other")
        if response.finish_reason
        else ("tool_calls" if calls else "stop"),
        usage=Usage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
        ),
        model=response.model_name or "",
        rate_limit=dict(headers),
        latency_s=latency_s,
        response=ModelMessagesTypeAdapter.dump_python([response], mode="json")[0],
    )


class Sender(Model):
    """One Pydantic AI request behind mainspring's :class:`Model` interface: what
    ``call_model`` books, sends as a step, and retries. It ignores the mainspring
    messages it is given (a rendering for token counts and traces) and sends the
    Pydantic AI request it holds.

    Attributes:
        events: the stream events of the attempt that succeeded (a streamed request).
        sent: whether the request went out in this execution (not a replay).
    """

    def __init__(
        self,
        wrapped: PaiModel,
        messages: list[ModelMessage],
        settings: PaiSettings | None,
        params: ModelRequestParameters,
        run_context: PaiContext[Any] | None,
        *,
        stream: bool,
    ) -> None:
        self.wrapped = wrapped
        self.provider = wrapped.system
        self.model_id = wrapped.model_name
        self.name = f"{self.provider}:{self.model_id}"
        self.streams = stream
        self._messages = messages
        # The runtime retries, once, coordinated with the limiter: the SDK must not.
        self._settings: PaiSettings = {**(settings or {}), "max_retries": 0}
        self._params = params
        self._run_context = run_context
        self.events: list[ModelResponseStreamEvent] = []
        self.sent = False

    async def request(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        settings: ModelSettings | None = None,
    ) -> PydanticAIReply:
        return await self._send(self._request_once)

    async def stream(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        settings: ModelSettings | None = None,
        on_text: Callable[[str], None],
        on_tool_call: Callable[[ToolCallDelta], None] | None = None,
    ) -> PydanticAIReply:
        calls: dict[int, tuple[str, str]] = {}  # part index -> (call id, tool name)

        def tool_call(index: int, piece: str) -> None:
            if on_tool_call is not None:
                call_id, name = calls.get(index, ("", ""))
                on_tool_call(ToolCallDelta(index=index, id=call_id, name=name, arguments=piece))

        async def streamed() -> PaiResponse:
            self.events = []
            async with self.wrapped.request_stream(
                self._messages, self._settings, self._params, self._run_context
            ) as live:
                async for event in live:
                    self.events.append(event)
                    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                        on_text(event.part.content)
                    elif isinstance(event, PartStartEvent) and isinstance(event.part, ToolCallPart):
                        part = event.part
                        calls[event.index] = (part.tool_call_id, part.tool_name)
                        tool_call(event.index, part.args_as_json_str() if part.args else "")
                    elif isinstance(event, PartDeltaEvent) and isinstance(
                        event.delta, TextPartDelta
                    ):
                        on_text(event.delta.content_delta)
                    elif isinstance(event, PartDeltaEvent) and isinstance(
                        event.delta, ToolCallPartDelta
                    ):
                        delta = event.delta
                        call_id, name = calls.get(event.index, ("", ""))
                        calls[event.index] = (
                            delta.tool_call_id or call_id,
                            name + (delta.tool_name_delta or ""),
                        )
                        args = delta.args_delta
                        piece = args if isinstance(args, str) else json.dumps(args or {})
                        tool_call(event.index, piece)
                return live.get()

        return await self._send(streamed)

    async def _request_once(self) -> PaiResponse:
        return await self.wrapped.request(self._messages, self._settings, self._params)

    async def _send(self, call: Callable[[], Awaitable[PaiResponse]]) -> PydanticAIReply:
        self.sent = True
        _hook(self.wrapped)
        sink: dict[str, str] = {}
        token = _SINK.set(sink)
        start = time.monotonic()
        try:
            response = await call()
        except pai_errors.ModelAPIError as exc:
            raise _mainspring_error(exc) from exc
        finally:
            _SINK.reset(token)
        return _reply(response, sink, time.monotonic() - start)


# -- what traces and token counts see ------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return " ".join(c if isinstance(c, str) else f"[{type(c).__name__}]" for c in content)
    return str(content)


def rendering(messages: Sequence[ModelMessage]) -> list[Message]:
    """Pydantic AI's messages as mainspring's (text only): what the rate limiter
    counts tokens of and what content capture shows. Never sent anywhere."""
    out: list[Message] = []
    for message in messages:
        if isinstance(message, ModelRequest):
            if message.instructions:
                out.append(SystemMessage(content=message.instructions))
            for part in message.parts:
                if isinstance(part, SystemPromptPart):
                    out.append(SystemMessage(content=part.content))
                elif isinstance(part, UserPromptPart):
                    out.append(UserMessage(content=_text(part.content)))
                elif isinstance(part, ToolReturnPart):
                    out.append(
                        ToolResultMessage(
                            tool_call_id=part.tool_call_id,
                            name=part.tool_name,
                            content=part.model_response_str(),
                        )
                    )
                elif isinstance(part, RetryPromptPart):
                    out.append(
                        ToolResultMessage(
                            tool_call_id=part.tool_call_id,
                            name=part.tool_name or "",
                            content=part.model_response(),
                            is_error=True,
                        )
                    )
        else:
            texts = [p.content for p in message.parts if isinstance(p, TextPart)]
            calls = tuple(
                ToolCall(id=p.tool_call_id, name=p.tool_name, arguments=p.args_as_json_str())
                for p in message.parts
                if isinstance(p, ToolCallPart)
            )
            out.append(AssistantMessage(text="".join(texts) or None, tool_calls=calls))
    return out


def tool_specs(params: ModelRequestParameters) -> list[ToolSpec]:
    return [
        ToolSpec(name=t.name, description=t.description or "", parameters=t.parameters_json_schema)
        for t in [*params.function_tools, *params.output_tools]
    ]


# -- the wrapper the capability puts around each request's model ---------------------------

# (wrapped model, messages, settings, parameters, run context, stream?) ->
# (the response, the live stream's events, whether it was sent in this execution)
ModelCaller = Callable[
    [
        PaiModel,
        list[ModelMessage],
        PaiSettings | None,
        ModelRequestParameters,
        PaiContext[Any] | None,
        bool,
    ],
    Awaitable[tuple[PaiResponse, list[ModelResponseStreamEvent], bool]],
]


class JournaledModel(WrapperModel):
    """A Pydantic AI model whose requests are journaled steps of a mainspring run.

    A streamed request (an event stream handler, ``run_stream``) streams its text to
    the run's live token stream as it forms; the stream the agent sees carries the
    events of the attempt the journal keeps, once the step has completed (a replay:
    none, those events were delivered by the execution that made the request).
    """

    def __init__(self, wrapped: PaiModel, call: ModelCaller, *, stream: bool) -> None:
        super().__init__(wrapped)
        self._call = call
        self._stream = stream

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: PaiSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> PaiResponse:
        response, _, _ = await self._call(
            self.wrapped, messages, model_settings, model_request_parameters, None, self._stream
        )
        return response

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: PaiSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: PaiContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        response, events, live = await self._call(
            self.wrapped, messages, model_settings, model_request_parameters, run_context, True
        )
        yield CompletedStreamedResponse(
            response,
            model_request_parameters=model_request_parameters,
            replay_events=events if live else False,
        )
