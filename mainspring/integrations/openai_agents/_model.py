"""The SDK's model calls as mainspring model steps.

:class:`JournaledModel` is an ``agents.Model`` around the model the SDK would have
used. Inside a durable run each ``get_response`` goes through
:meth:`mainspring.App.call_model` (the path mainspring's own agents take): a
``rate:`` booking on the App's shared limiter, then one step of role ``model`` that
sends the request and journals the reply. The journaled value is a plain
:class:`mainspring.models.ModelResponse` (text, tool calls, usage, cost and the
response's rate-limit headers: what ``mainspring trace``, the metrics and the
dashboard read) whose ``native`` field holds the SDK's own ``ModelResponse``, dumped
by pydantic; a replay hands that back to the SDK without sending anything.

Why not route through mainspring's ``OpenAIModel``: it speaks Chat Completions with
mainspring's neutral messages, and the SDK's agents speak the Responses API
(reasoning items, hosted tools, structured outputs, ``previous_response_id``). The
SDK's own model does the talking; mainspring books, journals and waits around it.

Rate-limit headers: the SDK returns none, so the OpenAI client mainspring builds for
the run (per event loop, from the client ``durable(openai_client=...)`` was given or
the environment's) carries an httpx response hook that copies the ``x-ratelimit-*``
headers of the request in flight into the reply, for the limiter to learn from.
That client has ``max_retries=0``: a 429 reaches mainspring, which waits (the
limiter, or the ``retry-after``), never fails the run for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai
from agents import Model as SDKModel
from agents import ModelProvider, ModelSettings, ModelTracing, MultiProvider, Usage
from agents.items import ModelResponse as SDKResponse
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseTextDeltaEvent,
)
from pydantic import TypeAdapter

from mainspring import TransientError
from mainspring.agent import call_model
from mainspring.models import (
    Model,
    ModelResponse,
    ToolCall,
    ToolCallDelta,
    UserMessage,
    estimate_tokens,
)
from mainspring.models import ModelSettings as MSSettings
from mainspring.models import Usage as MSUsage
from mainspring.models.openai import map_status_error

from ._active import Active
from ._tools import journal_tools

__all__ = ["JournaledModel", "JournaledProvider", "client_for_loop", "native_of"]

_ITEMS: TypeAdapter[list[ResponseOutputItem]] = TypeAdapter(list[ResponseOutputItem])
_USAGE: TypeAdapter[Usage] = TypeAdapter(Usage)

# The rate-limit headers of the request in flight in this task (see _on_response).
_HEADERS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "mainspring_oa_headers", default=None
)
_KEEP = ("x-ratelimit-", "retry-after")


async def _on_response(response: Any) -> None:
    """httpx response hook: keep the rate-limit headers for the step that sent it."""
    box = _HEADERS.get()
    if box is not None:
        box.update(
            {k.lower(): v for k, v in response.headers.items() if k.lower().startswith(_KEEP)}
        )


# One client per (template client, event loop): an httpx pool belongs to its loop.
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, openai.AsyncOpenAI]] = (
    weakref.WeakKeyDictionary()
)


def client_for_loop(template: openai.AsyncOpenAI | None) -> openai.AsyncOpenAI:
    """The OpenAI client of this event loop: ``template``'s settings (base URL, key,
    organisation, timeout) with no retries of its own and the header hook."""
    loop = asyncio.get_running_loop()
    per_loop = _CLIENTS.setdefault(loop, {})
    found = per_loop.get(id(template))
    if found is None:
        # The OpenAI SDK's own HTTP client class (and defaults), with the hook.
        http = openai.DefaultAsyncHttpxClient(event_hooks={"response": [_on_response]})
        base = template if template is not None else openai.AsyncOpenAI()
        found = per_loop[id(template)] = base.with_options(max_retries=0, http_client=http)
    return found


def native_of(sdk: SDKResponse) -> dict[str, Any]:
    """The SDK's reply as JSON (pydantic), never pickled."""
    return {
        "output": [item.model_dump(mode="json", exclude_none=True) for item in sdk.output],
        "usage": _USAGE.dump_python(sdk.usage, mode="json"),
        "response_id": sdk.response_id,
        "request_id": sdk.request_id,
    }


def sdk_of(native: Mapping[str, Any]) -> SDKResponse:
    """The SDK's reply back from its JSON."""
    return SDKResponse(
        output=_ITEMS.validate_python(native.get("output") or []),
        usage=_USAGE.validate_python(native.get("usage") or {}),
        response_id=native.get("response_id"),
        request_id=native.get("request_id"),
    )


def _plain(sdk: SDKResponse, headers: dict[str, str], model: str, latency: float) -> ModelResponse:
    """The neutral reply mainspring's traces and limiter read, carrying the SDK's."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for item in sdk.output:
        kind = getattr(item, "type", "")
        if kind == "message":
            for part in getattr(item, "content", []) or []:
                text = getattr(part, "text", None) or getattr(part, "refusal", None)
                if isinstance(text, str):
                    texts.append(text)
        elif kind == "function_call":
            calls.append(
                ToolCall(
                    id=str(getattr(item, "call_id", "")),
                    name=str(getattr(item, "name", "")),
                    arguments=str(getattr(item, "arguments", "")),
                )
            )
    u = sdk.usage
    cached = getattr(u.input_tokens_details, "cached_tokens", 0) or 0
    return ModelResponse(
        text="".join(texts) or None,
        tool_calls=tuple(calls),
        finish_reason="tool_calls" if calls else "stop",
        usage=MSUsage(
            input_tokens=u.input_tokens, output_tokens=u.output_tokens, cache_read_tokens=cached
        ),
        model=model,
        rate_limit=headers,
        latency_s=latency,
        native=native_of(sdk),
    )


@contextlib.contextmanager
def _mapped(name: str) -> Iterator[None]:
    """The OpenAI SDK's errors as mainspring's: a 429 is ``RateLimited`` (the run
    waits), a 5xx or a dropped connection ``TransientError`` (retried)."""
    try:
        yield
    except openai.APIStatusError as exc:
        raise map_status_error(exc.status_code, exc.body, exc.response.headers, model=name) from exc
    except openai.APIConnectionError as exc:
        raise TransientError(f"{name}: connection failed: {exc!r}") from exc
    except openai.APIError as exc:  # an error event in the middle of a stream
        raise TransientError(f"{name}: the stream broke off: {exc}") from exc
    except Exception as exc:
        if not _dropped(exc):
            raise
        raise TransientError(f"{name}: the stream broke off: {exc!r}") from exc


def _dropped(exc: Exception) -> bool:
    """A connection dropped in the middle of a streamed body: the HTTP library's
    ``TransportError`` (httpx, or httpx2 under newer openai releases), not the SDK's."""
    return any(
        c.__name__ == "TransportError" and c.__module__.split(".")[0] in ("httpx", "httpx2")
        for c in type(exc).__mro__
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Request:
    """The SDK's arguments of one model call."""

    system_instructions: str | None
    input: str | list[Any]
    model_settings: ModelSettings
    tools: list[Any]
    output_schema: Any
    handoffs: list[Any]
    tracing: ModelTracing
    previous_response_id: str | None
    conversation_id: str | None
    prompt: Any

    def estimate(self) -> int:
        """Prompt tokens, estimated (UTF-8 bytes / 4) for the booking."""
        parts: list[Any] = [self.system_instructions or "", self.input]
        for t in self.tools:
            parts.append(getattr(t, "params_json_schema", None) or getattr(t, "name", ""))
        return estimate_tokens(json.dumps(parts, default=str))


class _Bridge(Model):
    """A mainspring :class:`~mainspring.models.Model` that sends one SDK request."""

    def __init__(self, inner: SDKModel, name: str, request: _Request, streams: bool) -> None:
        self.inner = inner
        self.provider = "openai"
        self.model_id = name
        self.name = f"openai:{name}"
        self.streams = streams
        self.req = request

    def _kwargs(self) -> dict[str, Any]:
        r = self.req
        return {
            "previous_response_id": r.previous_response_id,
            "conversation_id": r.conversation_id,
            "prompt": r.prompt,
        }

    def _args(self) -> tuple[Any, ...]:
        r = self.req
        return (
            r.system_instructions,
            r.input,
            r.model_settings,
            r.tools,
            r.output_schema,
            r.handoffs,
            r.tracing,
        )

    async def request(
        self, messages: Sequence[Any], *, tools: Sequence[Any] = (), settings: Any = None
    ) -> ModelResponse:
        headers: dict[str, str] = {}
        token = _HEADERS.set(headers)
        started = time.perf_counter()
        try:
            with _mapped(self.name):
                sdk = await self.inner.get_response(*self._args(), **self._kwargs())
        finally:
            _HEADERS.reset(token)
        return _plain(sdk, headers, self.model_id, time.perf_counter() - started)

    async def stream(
        self,
        messages: Sequence[Any],
        *,
        tools: Sequence[Any] = (),
        settings: Any = None,
        on_text: Callable[[str], None],
        on_tool_call: Callable[[ToolCallDelta], None] | None = None,
    ) -> ModelResponse:
        headers: dict[str, str] = {}
        token = _HEADERS.set(headers)
        started = time.perf_counter()
        done: Response | None = None
        calls: dict[int, tuple[str, str]] = {}  # output index -> (call id, tool name)
        try:
            with _mapped(self.name):
                async for event in self.inner.stream_response(*self._args(), **self._kwargs()):
                    if isinstance(event, ResponseTextDeltaEvent):
                        on_text(event.delta)
                    elif isinstance(event, ResponseOutputItemAddedEvent) and isinstance(
                        event.item, ResponseFunctionToolCall
                    ):
                        item = event.item
                        calls[event.output_index] = (item.call_id, item.name)
                        if on_tool_call is not None:
                            on_tool_call(
                                ToolCallDelta(
                                    index=event.output_index,
                                    id=item.call_id,
                                    name=item.name,
                                    arguments=item.arguments,
                                )
                            )
                    elif (
                        isinstance(event, ResponseFunctionCallArgumentsDeltaEvent)
                        and on_tool_call is not None
                    ):
                        call_id, name = calls.get(event.output_index, ("", ""))
                        on_tool_call(
                            ToolCallDelta(
                                index=event.output_index,
                                id=call_id,
                                name=name,
                                arguments=event.delta,
                            )
                        )
                    elif isinstance(event, ResponseCompletedEvent):
                        done = event.response
        finally:
            _HEADERS.reset(token)
        if done is None:
            raise TransientError(f"{self.name}: the stream ended without response.completed")
        sdk = SDKResponse(output=list(done.output), usage=_usage_of(done), response_id=done.id)
        return _plain(sdk, headers, self.model_id, time.perf_counter() - started)


def _usage_of(response: Response) -> Usage:
    u = response.usage
    if u is None:
        return Usage(requests=1)
    return Usage(
        requests=1,
        input_tokens=u.input_tokens,
        output_tokens=u.output_tokens,
        total_tokens=u.total_tokens,
        input_tokens_details=u.input_tokens_details,
        output_tokens_details=u.output_tokens_details,
    )


class JournaledModel(SDKModel):
    """An ``agents.Model`` whose calls are mainspring model steps inside a durable
    run (and plain calls of ``inner`` outside one)."""

    def __init__(self, inner: SDKModel, name: str, active: Callable[[], Active | None]) -> None:
        self.inner = inner
        self.model = name  # the SDK reads a model's ``model`` name for its defaults
        self._active = active

    def get_default_model_settings(self) -> ModelSettings | None:
        return self.inner.get_default_model_settings()

    async def close(self) -> None:
        await self.inner.close()

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: Any = None,
    ) -> SDKResponse:
        request = _Request(
            system_instructions=system_instructions,
            input=input,
            model_settings=model_settings,
            tools=tools,
            output_schema=output_schema,
            handoffs=handoffs,
            tracing=tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )
        active = self._active()
        if active is None:
            return await self.inner.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )
        journal_tools(tools)
        await active.before_model()
        bridge = _Bridge(self.inner, self.model, request, active.stream)
        last = input if isinstance(input, str) else json.dumps(input[-1:], default=str)
        app = active.app
        reply = await call_model(
            active.ctx,
            bridge,
            [UserMessage(content=last)],
            settings=MSSettings(max_tokens=model_settings.max_tokens),
            rate_limits=active.rate_limits,
            account=active.account,
            max_rate_wait_s=active.limits.max_rate_wait_s if active.limits else None,
            prompt_tokens=request.estimate(),
            prices=active.prices,
            clock=app.clock,
            rng=app.rng,
            inline_wait_s=app.inline_wait_s,
        )
        active.after_model(reply)
        if reply.native is None:  # pragma: no cover - journaled by an older version
            raise TransientError(f"the journaled reply of {self.model!r} has no SDK response")
        return sdk_of(reply.native)

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: Any = None,
    ) -> AsyncIterator[Any]:
        """Journaled like :meth:`get_response` (its text reaches the run's live
        token stream as it forms); the SDK gets the reply as one
        ``response.completed`` event."""
        if self._active() is None:
            async for event in self.inner.stream_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            ):
                yield event
            return
        sdk = await self.get_response(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )
        u = sdk.usage
        response = Response.model_validate(
            {
                "id": sdk.response_id or "resp_replayed",
                "object": "response",
                "created_at": 0,
                "model": self.model,
                "output": [i.model_dump(mode="json", exclude_none=True) for i in sdk.output],
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "status": "completed",
                "usage": {
                    "input_tokens": u.input_tokens,
                    "output_tokens": u.output_tokens,
                    "total_tokens": u.total_tokens,
                    "input_tokens_details": u.input_tokens_details.model_dump(),
                    "output_tokens_details": u.output_tokens_details.model_dump(),
                },
            }
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )


class JournaledProvider(ModelProvider):
    """Resolves the SDK's model names as ``inner`` would, journaled.

    ``inner=None`` is the SDK's default (``MultiProvider``) on mainspring's client for
    this event loop (see :func:`client_for_loop`)."""

    def __init__(
        self,
        inner: ModelProvider | None,
        template: openai.AsyncOpenAI | None,
        active: Callable[[], Active | None],
        default_model: str,
    ) -> None:
        self.inner = inner
        self.template = template
        self._active = active
        self.default_model = default_model

    def get_model(self, model_name: str | None) -> SDKModel:
        provider = self.inner
        if provider is None:
            provider = MultiProvider(openai_client=client_for_loop(self.template))
        inner = provider.get_model(model_name)
        name = getattr(inner, "model", None)  # the name the SDK resolved (its default)
        if not isinstance(name, str):
            name = model_name or self.default_model
        return JournaledModel(inner, name, self._active)


def wrap_model(model: SDKModel, active: Callable[[], Active | None]) -> SDKModel:
    """``model`` journaled (once)."""
    if isinstance(model, JournaledModel):
        return model
    name = getattr(model, "model", None)
    return JournaledModel(model, name if isinstance(name, str) else type(model).__name__, active)
