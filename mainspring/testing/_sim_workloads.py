"""What a simulated run executes, how the outside world acts on it, and how its end
state is checked against the effect ledger."""

from __future__ import annotations

import asyncio
import random
from abc import ABC, abstractmethod
from typing import Any

from .. import App, RunContext, current_step
from .._errors import MainspringError, StepInterrupted, WaitTimeout
from ._ledger import EffectLedger

__all__ = ["OrdersWorkload", "Workload"]


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
    def register(self, app: App, ledger: EffectLedger) -> None:
        """Declare the workflows (and tools) on ``app``; their effects go to ``ledger``."""

    @abstractmethod
    def submit(self, client: App, rng: random.Random) -> list[str]:
        """Submit the runs; their ids."""

    def act(self, client: App, rng: random.Random, runs: list[str]) -> str:
        """One outside action on the runs at a random moment; what it did (for the
        trace). By default: nothing."""
        return "nothing"

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

    def register(self, app: App, ledger: EffectLedger) -> None:
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

    def act(self, client: App, rng: random.Random, runs: list[str]) -> str:
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
