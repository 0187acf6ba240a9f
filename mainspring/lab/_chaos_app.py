"""The App that ``mainspring lab chaos`` runs in worker processes (and then kills).

Configured by the environment the chaos harness gives its workers:
``MAINSPRING_DATABASE_URL`` (the store), ``MAINSPRING_LAB_LEDGER`` (the effect
ledger file), ``MAINSPRING_LAB_LEASE_S`` and ``MAINSPRING_LAB_STEP_S``.
"""

from __future__ import annotations

import functools
import os
import time

from .. import App, StepInterrupted
from ..journal import RunContext, current_step
from ..testing import EffectLedger

__all__ = ["WORKFLOW", "app", "build_app"]

WORKFLOW = "lab_chaos_effects"
_ledger_at = functools.cache(EffectLedger)  # one handle per file in this process


def _ledger() -> EffectLedger:
    return _ledger_at(os.environ["MAINSPRING_LAB_LEDGER"])


def _step_s() -> float:
    return float(os.environ.get("MAINSPRING_LAB_STEP_S", "0.005"))


def pay(n: int) -> int:
    """A write to a system that deduplicates by idempotency key (at_least_once)."""
    time.sleep(_step_s())
    _ledger().apply(current_step().idempotency_key, "pay", n)
    return n


def launch(n: int) -> int:
    """An effect on a system with no deduplication: it must run at most once."""
    _ledger().apply_unsafe(current_step().idempotency_key, "launch", n)
    time.sleep(_step_s())
    return n


def build_app(url: str | None = None) -> App:
    """The chaos App over ``url`` (``MAINSPRING_DATABASE_URL`` when None)."""
    chaos = App(
        url,
        lease_s=float(os.environ.get("MAINSPRING_LAB_LEASE_S", "1.0")),
        # Kills come faster than progress at times: do not dead-letter a run for it.
        max_recoveries=1000,
        poll_interval_s=0.05,
    )

    @chaos.workflow(name=WORKFLOW)
    async def effects(ctx: RunContext, steps: int) -> dict[str, int]:
        paid = interrupted = 0
        for i in range(steps):
            if i % 10 == 9:
                try:
                    await ctx.step(launch, i, mode="at_most_once")
                except StepInterrupted:
                    interrupted += 1
            else:
                paid += await ctx.step(pay, i)
        return {"paid": paid, "interrupted": interrupted}

    return chaos


app = build_app()
