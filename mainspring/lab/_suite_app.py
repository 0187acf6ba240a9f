"""The App that ``mainspring lab suite`` runs in worker processes (and then kills).

Configured by the environment the suite gives its workers: ``MAINSPRING_DATABASE_URL``
(the store), ``MAINSPRING_SUITE_WORLD`` (the world's SQLite file),
``MAINSPRING_SUITE_SEED``, ``MAINSPRING_SUITE_RATES`` (the policy's error rates and the
provider's transient rate, as JSON), ``MAINSPRING_SUITE_MAX_STEPS`` and
``MAINSPRING_SUITE_MODEL_ATTEMPTS`` (the model retry policy's attempts; mainspring's
default when unset).
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Sequence
from typing import Any

from .. import App, Limits, RetryPolicy, Tool, ToolContext
from ..models import (
    AssistantMessage,
    Message,
    Model,
    ModelResponse,
    ModelSettings,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from ..testing import FaultProfile, FaultyModel, ScriptedModel
from ._tasks import TASKS, PolicyRates, SuiteWorld, TaskSpec, decide

__all__ = ["app", "build_app", "world"]

_LABEL = re.compile(r"\bbatch (\w+)")
_worlds: dict[str, SuiteWorld] = {}


def world() -> SuiteWorld:
    """This process's handle on the world file of ``MAINSPRING_SUITE_WORLD``."""
    path = os.environ["MAINSPRING_SUITE_WORLD"]
    if path not in _worlds:
        _worlds[path] = SuiteWorld(path)
    return _worlds[path]


def _label(messages: Sequence[Message]) -> str:
    for message in messages:
        if not isinstance(message, UserMessage):
            continue
        found = _LABEL.search(message.content)
        if found:
            return found.group(1)
    raise ValueError("the task text names no batch")


def _policy(spec: TaskSpec, seed: int, rates: PolicyRates) -> Any:
    def play(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ModelResponse:
        label = _label(messages)
        # Like a model reading its history: the latest tool result says what is next
        # (a repair request or a loop nudge after it does not erase it).
        result = next(
            (m.content for m in reversed(messages) if isinstance(m, ToolResultMessage)), None
        )
        previous = next(
            (
                m.tool_calls[0]
                for m in reversed(messages)
                if isinstance(m, AssistantMessage) and m.tool_calls
            ),
            None,
        )
        made, _ = world().model_calls(label)
        rng = random.Random(f"horizon:{seed}:{label}:{made}")
        tool, arguments, error = decide(
            spec,
            result,
            None if previous is None else (previous.name, previous.arguments),
            rng,
            rates,
        )
        if error is not None:
            world().record_injected(label, error)
        return ScriptedModel.call(tool, arguments)

    return play


class _Metered(Model):
    """Counts every reply the run pays for in the world (re-paid calls included)."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        self.name, self.provider, self.model_id = inner.name, inner.provider, inner.model_id

    async def request(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        settings: ModelSettings | None = None,
    ) -> ModelResponse:
        reply = await self.inner.request(messages, tools=tools, settings=settings)
        tokens = reply.usage.input_tokens + reply.usage.output_tokens
        world().record_model_call(_label(messages), tokens)
        return reply


def _call(ctx: ToolContext, tool: str, **arguments: int | str) -> dict[str, Any]:
    w = world()
    return w.call(w.label_for(ctx.run_id), tool, arguments, ctx.idempotency_key)


def _rates() -> tuple[PolicyRates, float]:
    given = json.loads(os.environ.get("MAINSPRING_SUITE_RATES", "{}"))
    transient = float(given.pop("transient", 0.1))
    return PolicyRates(**given), transient


def build_app(url: str | None = None) -> App:
    """The suite's App over ``url`` (``MAINSPRING_DATABASE_URL`` when None): the
    tasks' agents, on mainspring's defaults but for a step budget sized to the task."""
    suite = App(url, max_recoveries=1000, poll_interval_s=0.05, lease_s=2.0)

    @suite.tool
    def progress(*, ctx: ToolContext) -> dict[str, Any]:
        """What is left to do: the next action and its item."""
        return _call(ctx, "progress")

    @suite.tool
    def validate(record: int, *, ctx: ToolContext) -> dict[str, Any]:
        """Validate one record."""
        return _call(ctx, "validate", record=record)

    @suite.tool(effect="write")
    def write(record: int, *, ctx: ToolContext) -> dict[str, Any]:
        """Write one validated record to the new store."""
        return _call(ctx, "write", record=record)

    @suite.tool(effect="write", requires_approval=True)
    def checkpoint(upto: int, *, ctx: ToolContext) -> dict[str, Any]:
        """Ask a reviewer to approve the writes so far."""
        return _call(ctx, "checkpoint", upto=upto)

    @suite.tool
    def open_ticket(ticket: int, *, ctx: ToolContext) -> dict[str, Any]:
        """Open a ticket and read it."""
        return _call(ctx, "open_ticket", ticket=ticket)

    @suite.tool(effect="irreversible")
    def refund(ticket: int, *, ctx: ToolContext) -> dict[str, Any]:
        """Refund a ticket (irreversible)."""
        return _call(ctx, "refund", ticket=ticket)

    @suite.tool(effect="write")
    def close_ticket(ticket: int, *, ctx: ToolContext) -> dict[str, Any]:
        """Close a ticket."""
        return _call(ctx, "close_ticket", ticket=ticket)

    @suite.tool
    def compare(first: int, last: int, *, ctx: ToolContext) -> dict[str, Any]:
        """Compare entries first..last (inclusive) of ledgers A and B."""
        return _call(ctx, "compare", first=first, last=last)

    @suite.tool(effect="write")
    def post(entry: int, amount: int, *, ctx: ToolContext) -> dict[str, Any]:
        """Post an adjusting entry of amount cents to entry of ledger B."""
        return _call(ctx, "post", entry=entry, amount=amount)

    @suite.tool
    def search(fact: int, *, ctx: ToolContext) -> dict[str, Any]:
        """Search for a fact; returns its source."""
        return _call(ctx, "search", fact=fact)

    @suite.tool
    def read(source: int, *, ctx: ToolContext) -> dict[str, Any]:
        """Read a source; returns its fact."""
        return _call(ctx, "read", source=source)

    @suite.tool(effect="write")
    def handoff(notes: str, *, ctx: ToolContext) -> dict[str, Any]:
        """End the session: store its notes for the next one."""
        return _call(ctx, "handoff", notes=notes)

    @suite.tool
    def resume(session: int, *, ctx: ToolContext) -> dict[str, Any]:
        """Start a session from the notes so far."""
        return _call(ctx, "resume", session=session)

    @suite.tool(effect="write")
    def report(facts: str, *, ctx: ToolContext) -> dict[str, Any]:
        """Report every fact gathered (the final answer)."""
        return _call(ctx, "report", facts=facts)

    tools: dict[str, list[Tool[Any, Any]]] = {
        "migrate": [progress, validate, write, checkpoint],
        "support": [progress, open_ticket, refund, close_ticket],
        "reconcile": [progress, compare, post],
        "research": [progress, search, read, handoff, resume, report],
    }
    seed = int(os.environ.get("MAINSPRING_SUITE_SEED", "0"))
    rates, transient = _rates()
    max_steps = int(os.environ.get("MAINSPRING_SUITE_MAX_STEPS", "100"))
    attempts = os.environ.get("MAINSPRING_SUITE_MODEL_ATTEMPTS")
    retry = RetryPolicy(max_attempts=int(attempts)) if attempts else None
    for name, spec in TASKS.items():
        model = _Metered(
            FaultyModel(
                ScriptedModel(_policy(spec, seed, rates), model_id=f"horizon-{name}"),
                FaultProfile(transient_rate=transient),
                seed=seed + os.getpid(),
            )
        )
        suite.agent(
            name,
            model=model,
            instructions=spec.instructions,
            tools=tools[name],
            limits=Limits(max_steps=max_steps),
            model_retry=retry,
        )
    return suite


app = build_app()
