"""One execution of a graph run: each node a journaled step, its budgets and its
loop guard.

A node's wrapper runs where LangGraph runs the node (its task, its config): it makes
the node's execution one ``ctx.step`` named ``node:<name>``, whose journaled output
is the node's update. A replay (after a crash, after a wait) runs the graph again
from the start: every completed node answers from the journal without running, so
the graph takes the same path and stops where the journal ends, at the exact node
the crash interrupted, which runs again under the same idempotency key.

The wrapper takes its journal position before its first suspension, so the nodes of
one superstep, which LangGraph starts in a fixed order, take theirs in that order on
every execution. One node is one position: what a node does inside (its model calls,
its ``@task`` calls) belongs to its step.

``interrupt()`` in a node ends the node's step with the interrupt (its journaled
output), and the wrapper raises it to LangGraph as the node would have; the driver
(:mod:`._flow`) turns it into a request to a human. On a replay the wrapper calls
``interrupt()`` again, as many times as the node did, so that LangGraph's record of
the task's answers is the one the first execution made. A budget reached or a loop
seen before a node is an ``interrupt()`` of the wrapper's own, asked the same way.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NoReturn

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphInterrupt, ParentCommand
from langgraph.types import interrupt

from ... import (
    BudgetExceeded,
    Clock,
    ConfigError,
    Limits,
    LoopDetected,
    RunContext,
    Workflow,
    current_step,
)
from ... import RetryPolicy as MsRetry
from ...storage import JournalRole
from .._budgets import reached
from ._models import NodeUsage, current_usage
from ._serde import decode, encode
from ._tasks import TaskCalls

__all__ = ["ASK", "EXECUTION", "Execution", "NodeSpec"]

#: The key of an interrupt value the wrapper raised itself (a budget, a loop).
ASK = "mainspring.ask"

EXECUTION: contextvars.ContextVar[Execution | None] = contextvars.ContextVar(
    "mainspring_langgraph_execution", default=None
)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """How one node of a graph runs on mainspring."""

    name: str
    bound: Any  # the node's own runnable (LangGraph's)
    role: JournalRole = "step"  # "model" when the node calls a model
    retry: MsRetry | None = None
    timeout: float | None = None
    child: Workflow[Any, Any] | None = None  # a subgraph: run as a child run


@dataclass(slots=True)
class _Task:
    """What one LangGraph task (one node execution, and its runs after resumes) has
    asked so far in this execution."""

    asks: list[dict[str, Any]] = field(default_factory=list)  # budget and loop asks
    applied: int = 0  # answers to ``asks`` applied already
    interrupts: int = 0  # interrupts of the node's own, answered or not


@dataclass(slots=True, kw_only=True)
class Execution:
    """The state of one execution of a graph run, rebuilt by replay."""

    ctx: RunContext
    clock: Clock
    limits: Limits
    started: float
    last_end: float = 0.0
    loop_repeats: int = 3
    steps: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    tasks: dict[str, _Task] = field(default_factory=dict)
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=12))
    loops: int = 0
    task_calls: TaskCalls | None = None  # its nodes' @task calls (``._tasks``)

    # -- a node ------------------------------------------------------------------------

    async def run_node(self, spec: NodeSpec, state: Any, config: RunnableConfig) -> Any:
        ns = str(config.get("configurable", {}).get("checkpoint_ns", ""))
        task = self.tasks.setdefault(ns, _Task())
        self._asked_before(task)
        if task.interrupts == 0 and not task.asks:  # the task's first run
            self.recent.append(f"{spec.name}:{_fingerprint(state)}")
        if task.interrupts == 0:  # nothing of the node's has run yet
            self._check(spec, task)
        if spec.child is not None:
            return await self._run_child(spec, state)
        live: list[GraphInterrupt] = []

        async def body() -> dict[str, Any]:
            self._attempt_starts()
            usage = NodeUsage(store=self.ctx.store, clock=self.clock)
            token = current_usage().set(usage)
            try:
                update = await spec.bound.ainvoke(state, config)
            except GraphInterrupt as exc:
                live.append(exc)
                raised = exc.args[0] if exc.args else ()
                value = raised[0].value if raised else None
                return {"interrupt": encode(value), "at": self.clock.now()}
            except ParentCommand:
                raise ConfigError(
                    f"node {spec.name!r} returned Command(graph=Command.PARENT): a "
                    "subgraph runs as a child run on mainspring and cannot route its "
                    "parent; return the update instead"
                ) from None
            finally:
                current_usage().reset(token)
            out: dict[str, Any] = {"update": encode(update), "at": self.clock.now()}
            if usage.calls:
                out.update(usage.summary())
            return out

        record: dict[str, Any] = await self.ctx.step(
            body,
            name=f"node:{spec.name}",
            role=spec.role,
            retry=spec.retry,
            timeout=spec.timeout,
        )
        self._count(spec.name, record)
        if self.ctx.is_replaying:
            # A replayed step answers at once: let the loop breathe between nodes (its
            # other runs, the heartbeat's tick) while a long graph replays. After the
            # step, so the siblings of a superstep still take their places in order.
            await asyncio.sleep(0)
        if "interrupt" in record:
            self._interrupted(task, record, live)
        return decode(record["update"])

    def _interrupted(
        self, task: _Task, record: dict[str, Any], live: list[GraphInterrupt]
    ) -> NoReturn:
        """The node was interrupted: raise LangGraph's interrupt, the one it raised now,
        or (a replay) the same again."""
        earlier, task.interrupts = task.interrupts, task.interrupts + 1
        if live:
            raise live[0]
        # A replay: ask LangGraph again as the node did, its answers first.
        for _ in range(earlier):
            interrupt(None)
        interrupt(decode(record["interrupt"]))
        raise AssertionError("interrupt() returned where the node was interrupted")

    def _attempt_starts(self) -> None:
        """A node step's attempt starts: its ``@task`` calls count from 0 again, and
        so meet the results the attempts before kept (``._tasks``)."""
        if self.task_calls is not None:
            self.task_calls.attempt(current_step().idempotency_key)

    async def _run_child(self, spec: NodeSpec, state: Any) -> Any:
        assert spec.child is not None
        out = await self.ctx.child(spec.child, state)
        self.steps += 1
        return out

    # -- what was journaled ------------------------------------------------------------

    def _count(self, name: str, record: dict[str, Any]) -> None:
        self.steps += 1
        self.last_end = max(self.last_end, float(record.get("at", 0.0)))
        usage = record.get("usage") or {}
        self.tokens += int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
        self.cost_usd += float(record.get("cost_usd", 0.0))

    # -- budgets and loops: asked with interrupt() -----------------------------------

    def _asked_before(self, task: _Task) -> None:
        """Take this task's earlier asks again (their answers, in order), and apply
        the answers not applied yet."""
        for i, ask in enumerate(task.asks):
            answer = interrupt(ask)  # answered: a resume brought the task back here
            if i < task.applied:
                continue
            task.applied = i + 1
            self._apply(ask, answer)

    def _apply(self, ask: dict[str, Any], answer: Any) -> None:
        decision = answer if isinstance(answer, dict) else {"approved": bool(answer)}
        if ask[ASK] == "loop":
            if not decision.get("approved"):
                raise LoopDetected(
                    f"node {ask['node']!r} repeats with the same update "
                    f"({ask['pattern']}); stopped by a human",
                    run_id=self.ctx.run_id,
                )
            self.recent.clear()
            return
        which = str(ask["limit"])
        if not decision.get("approved"):
            raise BudgetExceeded(
                f"{which} reached ({ask['used']:g} of {ask['cap']:g}); stopped by a human",
                run_id=self.ctx.run_id,
            )
        raised = decision.get("limit") or float(ask["cap"]) * 2
        self.limits = self.limits.raised(which, raised)

    def _check(self, spec: NodeSpec, task: _Task) -> None:
        exceeded = self._exceeded()
        if exceeded is not None:
            which, cap, used = exceeded
            if self.limits.on_exceeded == "stop":
                raise BudgetExceeded(
                    f"{which} reached ({used:g} of {cap:g}) before node {spec.name!r}",
                    run_id=self.ctx.run_id,
                )
            ask = {ASK: "budget", "limit": which, "cap": cap, "used": used, "node": spec.name}
            task.asks.append(ask)
            interrupt(ask)
        pattern = self._loop()
        if pattern is not None:
            self.loops += 1
            ask = {ASK: "loop", "node": spec.name, "pattern": pattern, "n": self.loops}
            task.asks.append(ask)
            interrupt(ask)

    def _exceeded(self) -> tuple[str, float, float] | None:
        used: dict[str, float] = {
            "max_steps": self.steps,
            "max_tokens": self.tokens,
            "max_cost_usd": self.cost_usd,
            # The journaled time of the last step's end: a replay judges the same.
            "max_wall_s": self.elapsed(),
        }
        hit = reached(self.limits, used)
        if hit is None:
            return None
        which, cap, value = hit
        return which, float(cap), float(value)

    def elapsed(self) -> float:
        return max(0.0, self.last_end - self.started)

    def _loop(self) -> str | None:
        """The repeating pattern (one node, or two alternating) if the last node runs
        repeat it ``loop_repeats`` times with the same input: the graph goes round
        without changing its state."""
        seen = list(self.recent)
        for period in (1, 2):
            need = period * self.loop_repeats
            if len(seen) < need:
                continue
            tail = seen[-need:]
            if all(tail[i] == tail[i % period] for i in range(need)) and (
                period == 1 or tail[0] != tail[1]
            ):
                return " -> ".join(t.rsplit(":", 1)[0] for t in tail[:period])
        return None


def _fingerprint(state: Any) -> str:
    """A cheap likeness of a node's input: equal for equal states, and different when
    a value changed, a list grew or its last item changed (without encoding a long
    history on every node)."""

    def brief(value: Any, depth: int = 0) -> Any:
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, str):
            return value[:200]
        if depth > 2:
            return type(value).__name__
        if isinstance(value, dict):
            return {str(k): brief(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [len(value), brief(value[-1], depth + 1) if value else None]
        content = getattr(value, "content", None)
        if content is not None:  # a message: its kind, id and text
            return [type(value).__name__, getattr(value, "id", None), str(content)[:200]]
        # Anything else by its kind only: the repr of a rich object can cost more than
        # the node (a LangChain object's walks its fields), and may not be stable.
        return type(value).__name__

    text = json.dumps(brief(state), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
