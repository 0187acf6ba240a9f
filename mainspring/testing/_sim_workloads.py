"""What a simulated run executes, how the outside world acts on it, and how its end
state is checked against the effect ledger."""

from __future__ import annotations

import asyncio
import json
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from .. import App, Limits, RunContext, ToolContext, current_step
from .._errors import MainspringError, StepInterrupted, WaitTimeout
from ..models import Message, ModelResponse, ToolResultMessage, ToolSpec
from ..models.faulty import FaultProfile, FaultyModel
from ..models.scripted import ScriptedModel
from ._ledger import EffectLedger
from ._sim_faults import FaultMix

__all__ = ["WORKLOADS", "AgentWorkload", "OrdersWorkload", "Workload"]


class Workload(ABC):
    """A workload of the simulator: its workflows, its runs, the outside actions on
    them and its own end-state check.

    The workflows are registered on every simulated process's App (the same code on
    each, as a deployment has), so :meth:`register` must not keep per-App state that
    the check needs: keep it in the ledger.
    """

    name: str = "workload"
    #: the ledger ``effect`` names of ``at_most_once`` steps (at most one call per key)
    at_most_once_effects: tuple[str, ...] = ()

    @abstractmethod
    def register(self, app: App, ledger: EffectLedger, faults: FaultMix) -> None:
        """Declare the workflows (and tools) on ``app``; their effects go to ``ledger``;
        ``faults`` is the run's mix (a model's provider faults, for instance)."""

    @abstractmethod
    def submit(self, client: App, rng: random.Random) -> list[str]:
        """Submit the runs; their ids."""

    #: the App's ``max_recoveries`` on every process (a long run meets many crashes)
    max_recoveries: int = 5

    def act(self, client: App, rng: random.Random, runs: list[str]) -> str | None:
        """One outside action on the runs at a random moment; what it did (for the
        trace), ``None`` for nothing (the default)."""
        return None

    @abstractmethod
    def check(self, client: App, ledger: EffectLedger) -> list[str]:
        """What is wrong with the end state (empty: nothing)."""


class OrdersWorkload(Workload):
    """Orders: a sync ``def`` step (reserve), an ``at_most_once`` async step (charge),
    a durable sleep, a wait for a signal with a timeout, and an async step (ship).

    Outside actions: the ``go`` signal, a cancel, or a submit that repeats a run's key
    (which must name the same run).
    """

    name = "orders"
    at_most_once_effects = ("charge",)

    def __init__(self, orders: int = 12) -> None:
        self.orders = orders
        self._keys: dict[str, str] = {}  # run id -> its submit key

    def register(self, app: App, ledger: EffectLedger, faults: FaultMix) -> None:
        def reserve(n: int) -> str:  # a sync step: runs on the simulated loop
            ledger.apply(current_step().idempotency_key, "reserve", n)
            return f"reserved {n}"

        async def charge(n: int) -> str:
            ledger.apply(current_step().idempotency_key, "charge", n)
            await asyncio.sleep(0)  # an await point inside the step
            return f"charged {n}"

        async def ship(n: int) -> str:
            ledger.apply(current_step().idempotency_key, "ship", n)
            return f"shipped {n}"

        @app.workflow(name="order")
        async def order(ctx: RunContext, n: int) -> dict[str, Any]:
            reserved = await ctx.step(reserve, n, name="reserve")
            try:
                charged = await ctx.step(charge, n, name="charge", mode="at_most_once")
            except StepInterrupted:
                charged = "unknown"  # it may have happened: never charged twice
            await ctx.sleep(2.0 + n % 3)
            try:
                go = await ctx.wait_for("go", timeout=30.0)
            except WaitTimeout:
                go = None
            shipped = await ctx.step(ship, n, name="ship")
            return {"n": n, "reserved": reserved, "charged": charged, "go": go, "shipped": shipped}

    def submit(self, client: App, rng: random.Random) -> list[str]:
        runs = []
        for n in range(self.orders):
            key = f"order-{n}"
            handle = client.submit("order", n, key=key)
            self._keys[handle.run_id] = key
            runs.append(handle.run_id)
        return runs

    def act(self, client: App, rng: random.Random, runs: list[str]) -> str | None:
        run_id = rng.choice(runs)
        what = rng.random()
        try:
            if what < 0.6:
                client.signal(run_id, "go", {"by": "outside"})
                return f"signal go {run_id}"
            if what < 0.75:
                return f"cancel {run_id}: {client.cancel(run_id, 'outside')}"
            key = self._keys[run_id]
            n = int(key.split("-")[1])
            again = client.submit("order", n, key=key)
            if again.run_id != run_id:
                raise AssertionError(f"key {key!r} named run {run_id}, now {again.run_id}")
            return f"resubmit {key} -> {again.run_id}"
        except MainspringError as exc:
            return f"refused {type(exc).__name__}"

    def check(self, client: App, ledger: EffectLedger) -> list[str]:
        wrong = []
        shipped = ledger.calls_by_key("ship")
        reserved = ledger.calls_by_key("reserve")
        for run_id in self._keys:
            record = client.get_run(run_id)
            if record.status == "succeeded":
                ships = [k for k in shipped if run_id in k]
                if len(ships) != 1:
                    wrong.append(f"[ledger] run {run_id} succeeded with {len(ships)} ship effects")
                if not any(run_id in k for k in reserved):
                    wrong.append(f"[ledger] run {run_id} succeeded with no reserve effect")
            elif record.status not in ("cancelled", "failed"):
                wrong.append(f"[end] run {run_id} ended {record.status}")
            elif record.status == "failed" and "dead" not in (record.error or "").lower():
                wrong.append(f"[end] run {run_id} failed: {(record.error or '')[:200]}")
        return wrong


class AgentWorkload(Workload):
    """An agent working through ``items`` items, one tool call each, with the scripted
    model and provider faults (5xx, 429, timeouts, malformed calls) at ``provider``.

    The model is a policy that reads its history, as the horizon suite's does: the
    last tool result names the next action; with none in sight (the first turn, a
    repaired call) it asks ``progress``. ``work(item)`` applies the item to the effect
    ledger under the call's idempotency key. The check: a succeeded run applied every
    item exactly once, each under one key.
    """

    name = "agent"
    max_recoveries = 1000  # as the horizon suite's: a crash every few hundred steps

    def __init__(self, items: int = 200, runs: int = 1, provider: float | None = None) -> None:
        """``provider``: the chance of a provider fault per model call (``None``: the
        fault mix's ``provider``)."""
        self.items = items
        self.runs = runs
        self.provider = provider
        self._runs: list[str] = []

    def register(self, app: App, ledger: EffectLedger, faults: FaultMix) -> None:
        items = self.items

        @app.tool(effect="write")
        def work(item: int, *, ctx: ToolContext) -> str:
            """Do one item of the batch."""
            ledger.apply(ctx.idempotency_key, "work", {"run": ctx.run_id, "item": item})
            after = (
                {"action": "finish"} if item + 1 >= items else {"action": "work", "item": item + 1}
            )
            return json.dumps({"done": item, "next": after})

        @app.tool
        def progress(*, ctx: ToolContext) -> str:
            """Where the batch stands."""
            done = _items_done(ledger, ctx.run_id)
            first = next((i for i in range(items) if i not in done), None)
            after = {"action": "finish"} if first is None else {"action": "work", "item": first}
            return json.dumps({"done": len(done), "next": after})

        rate = faults.provider if self.provider is None else self.provider
        # The provider's faults (5xx, 429, timeouts) at the mix's rate, as the horizon
        # suite's; the policy's own malformed calls at a quarter of it, never more in
        # a row than the agent repairs (max_repairs=3): the dice alone never fail a run.
        profile = FaultProfile(
            transient_rate=rate / 3,
            rate_limit_rate=rate / 3,
            timeout_rate=rate / 3,
            malformed_rate=rate / 4,
            timeout_s=5.0,
            retry_after_s=2.0,
            max_in_a_row=3,
        )
        model = FaultyModel(
            ScriptedModel(_policy, model_id="sim-policy"),
            profile,
            seed=app.rng.getrandbits(32),  # the process's: each meets its own faults
            clock=app.clock,
        )
        app.agent(
            "batch",
            model=model,
            instructions="Work through the batch, one item per call, then finish.",
            tools=[work, progress],
            limits=Limits(max_steps=items * 3 + 50),
        )

    def submit(self, client: App, rng: random.Random) -> list[str]:
        self._runs = [
            client.submit("batch", f"batch {n}", key=f"batch-{n}").run_id for n in range(self.runs)
        ]
        return list(self._runs)

    def check(self, client: App, ledger: EffectLedger) -> list[str]:
        wrong = []
        for run_id in self._runs:
            record = client.get_run(run_id)
            if record.status != "succeeded":
                if record.status != "failed" or "dead" not in (record.error or "").lower():
                    wrong.append(f"[end] run {run_id} ended {record.status}: {record.error}")
                continue
            done = _items_done(ledger, run_id)
            for item in range(self.items):
                if done.get(item, 0) != 1:
                    wrong.append(f"[ledger] run {run_id} item {item} applied {done.get(item, 0)}x")
        return wrong


def _items_done(ledger: EffectLedger, run_id: str) -> dict[int, int]:
    """Each item applied for ``run_id``, and under how many keys."""
    done: dict[int, int] = {}
    for payload in ledger.payloads("work").values():
        if payload.get("run") == run_id:
            done[payload["item"]] = done.get(payload["item"], 0) + 1
    return done


def _policy(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ModelResponse:
    """The scripted policy: follow the ``next`` the last tool result names."""
    last = next((m for m in reversed(messages) if isinstance(m, ToolResultMessage)), None)
    nxt = None
    if last is not None:
        try:
            nxt = json.loads(last.content).get("next")
        except (ValueError, AttributeError):
            nxt = None
    if not isinstance(nxt, dict):
        return ScriptedModel.call("progress", {})
    if nxt.get("action") == "finish":
        return ScriptedModel.call("finish", {"answer": "done"})
    return ScriptedModel.call("work", {"item": nxt["item"]})


#: The ready workloads by name (``mainspring lab sim --workload``).
WORKLOADS: dict[str, type[Workload]] = {"orders": OrdersWorkload, "agent": AgentWorkload}
