"""The model calls a node makes, seen through a LangChain callback handler: no change
to the user's chat model (``ChatOpenAI``, ``ChatAnthropic``, ...).

For each call inside a node's step, :class:`ModelCalls`:

- books a slot of mainspring's shared rate limiter before the request leaves (when
  the App has ``rate_limits``), and settles it with the usage the reply reports;
- records the reply's model, tokens and cost, which the node's step journals
  (the trace shows them, ``Limits(max_cost_usd=...)`` counts them);
- with ``repair`` on, refuses a reply whose tool-call arguments are not valid JSON
  (LangChain's ``invalid_tool_calls``): the call raises, the node's step fails its
  attempt and is tried again, and the model is asked again, where the graph would
  otherwise end on it.
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGeneration, LLMResult

from ... import App, Clock, ModelOutputError, Store, current_step
from ...limits import Booking, Cost, Price, StoreRateLimiter, cost_usd
from ...models import Usage

__all__ = ["CallRecord", "MalformedToolCalls", "ModelCalls", "NodeUsage", "current_usage"]


class MalformedToolCalls(ModelOutputError):
    """A reply asked for tools with arguments that are not valid JSON. Retryable: the
    node runs again and the model is asked again."""

    retryable = True


@dataclass(slots=True)
class CallRecord:
    """One model call of a node: what the trace and the budgets count."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    text: str = ""
    tool_calls: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "cost_usd": self.cost_usd,
        }


@dataclass(slots=True)
class NodeUsage:
    """The model calls of one attempt of a node's step, and the run's store and
    clock (the rate limiter's)."""

    calls: list[CallRecord] = field(default_factory=list)
    store: Store | None = None
    clock: Clock | None = None

    def summary(self) -> dict[str, Any]:
        """The model reply's shape a trace reads (usage, cost, text, tool calls), for
        all the calls of the node together."""
        last = self.calls[-1]
        return {
            "usage": {
                "input_tokens": sum(c.input_tokens for c in self.calls),
                "output_tokens": sum(c.output_tokens for c in self.calls),
                "cache_read_tokens": sum(c.cached_tokens for c in self.calls),
            },
            "cost_usd": sum(c.cost_usd for c in self.calls),
            "text": last.text,
            "tool_calls": last.tool_calls,
            "models": [c.to_json() for c in self.calls],
        }


_usage: contextvars.ContextVar[NodeUsage | None] = contextvars.ContextVar(
    "mainspring_langgraph_usage", default=None
)


def current_usage() -> contextvars.ContextVar[NodeUsage | None]:
    """The context variable a node's step sets to collect its model calls."""
    return _usage


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return " ".join(
        str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
    ).strip()


class ModelCalls(BaseCallbackHandler):
    """The callback handler :func:`~.durable` puts in every graph run's config.

    A synchronous handler: LangChain calls it in the node's thread for a sync node and
    in an executor thread for an async one (``run_inline`` off), so that a refused reply
    raises into the model call either way (an async handler's error in a sync node is
    only logged) and a wait for a rate-limit slot never holds the event loop."""

    raise_error = True  # a refused reply must reach the node (and fail its attempt)
    run_inline = False

    # Only model calls matter here: LangChain skips the handler for every other event
    # (a graph emits several per superstep, each a thread hop in an async run).
    ignore_chain = True
    ignore_agent = True
    ignore_retriever = True
    ignore_custom_event = True

    def __init__(
        self, app: App, *, repair: bool = True, prices: dict[str, Price] | None = None
    ) -> None:
        self.app = app
        self.repair = repair
        self.prices = prices
        self._bookings: dict[UUID, tuple[StoreRateLimiter, Booking]] = {}

    # -- the rate limiter --------------------------------------------------------------

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        limits = self.app.rate_limits
        usage = _usage.get()
        if limits is None or usage is None or usage.store is None or usage.clock is None:
            return
        store, clock = usage.store, usage.clock
        meta = metadata or {}
        provider, model = meta.get("ls_provider"), meta.get("ls_model_name")
        if not provider or not model:
            return
        limiter = limits.bind(store, clock).limiter(str(provider), str(model))
        # A rough count (UTF-8 bytes / 4): the limiter corrects it from reported usage.
        prompt = sum(len(_text(m).encode()) for batch in messages for m in batch) // 4 + 1
        max_tokens = meta.get("ls_max_tokens")
        run = current_step().run_id  # inside the node's step: _usage is set
        while True:
            booking = limiter.reserve(
                prompt_tokens=prompt,
                max_tokens=int(max_tokens) if isinstance(max_tokens, int) else None,
                run=run,
            )
            wait = booking.wake_at - clock.now()
            if wait > 0:  # this thread waits, not the run: a long wait holds the worker
                time.sleep(wait)
            if not booking.retry:
                break
        self._bookings[run_id] = (limiter, booking)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        held = self._bookings.pop(run_id, None)
        if held is not None:
            limiter, booking = held
            limiter.settle_quietly(booking, None)

    # -- the reply ---------------------------------------------------------------------

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        usage = _usage.get()
        held = self._bookings.pop(run_id, None)
        records = [self._record(gen, response) for batch in response.generations for gen in batch]
        if held is not None:
            limiter, booking = held
            used = Cost(
                input_tokens=sum(r.input_tokens for r in records),
                cached_tokens=sum(r.cached_tokens for r in records),
                output_tokens=sum(r.output_tokens for r in records),
            )
            limiter.settle_quietly(booking, used)
        if usage is not None:
            usage.calls.extend(records)
        if not self.repair:
            return
        for batch in response.generations:
            for gen in batch:
                bad = getattr(getattr(gen, "message", None), "invalid_tool_calls", None)
                if bad:
                    names = ", ".join(repr(c.get("name")) for c in bad)
                    raise MalformedToolCalls(
                        f"the model asked for {names} with arguments that are not valid "
                        f"JSON ({str(bad[0].get('error') or '')[:200]}): asking again"
                    )

    def _record(self, gen: Any, response: LLMResult) -> CallRecord:
        output = response.llm_output or {}
        model = str(output.get("model_name") or "")
        record = CallRecord(model=model)
        if isinstance(gen, ChatGeneration):
            message = gen.message
            meta = message.response_metadata or {}
            record.model = str(meta.get("model_name") or model)
            record.text = _text(message)
            record.tool_calls = [
                {"name": str(c.get("name")), "arguments": str(c.get("args"))}
                for c in getattr(message, "tool_calls", None) or []
            ]
            found = getattr(message, "usage_metadata", None)
            if found:
                record.input_tokens = int(found.get("input_tokens", 0))
                record.output_tokens = int(found.get("output_tokens", 0))
                details = found.get("input_token_details") or {}
                record.cached_tokens = int(details.get("cache_read", 0) or 0)
        if not record.input_tokens and not record.output_tokens:
            tokens = output.get("token_usage") or {}
            record.input_tokens = int(tokens.get("prompt_tokens", 0) or 0)
            record.output_tokens = int(tokens.get("completion_tokens", 0) or 0)
        record.cost_usd = cost_usd(
            record.model,
            Usage(
                input_tokens=record.input_tokens,
                output_tokens=record.output_tokens,
                cache_read_tokens=record.cached_tokens,
            ),
            self.prices,
        )
        return record
