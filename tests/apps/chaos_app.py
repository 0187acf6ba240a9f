"""An App for the process tests: workers of this module are SIGKILLed and SIGSTOPped.

Reads MAINSPRING_DATABASE_URL (the store) and MAINSPRING_TEST_LEDGER (the effect
ledger file) from the environment.
"""

from __future__ import annotations

import os
import time

import mainspring as ms
from mainspring.testing import EffectLedger

app = ms.App(lease_s=float(os.environ.get("MAINSPRING_TEST_LEASE_S", "1.0")))
ledger = EffectLedger(os.environ["MAINSPRING_TEST_LEDGER"])
STEP_S = float(os.environ.get("MAINSPRING_TEST_STEP_S", "0.002"))


def pay(n: int) -> int:
    """An effect on a system that deduplicates by key (at_least_once is enough)."""
    time.sleep(STEP_S)
    ledger.apply(ms.current_step().idempotency_key, "pay", n)
    return n


def launch(n: int) -> int:
    """An effect on a system that does not deduplicate: must run at most once."""
    ledger.apply_unsafe(ms.current_step().idempotency_key, "launch", n)
    time.sleep(STEP_S)
    return n


@app.workflow
async def effects(ctx: ms.RunContext, steps: int) -> dict[str, int]:
    paid = interrupted = 0
    for i in range(steps):
        if i % 10 == 9:
            try:
                await ctx.step(launch, i, mode="at_most_once")
            except ms.StepInterrupted:
                interrupted += 1
        else:
            paid += await ctx.step(pay, i)
    return {"paid": paid, "interrupted": interrupted}


@app.workflow
async def slow(ctx: ms.RunContext, steps: int) -> int:
    return sum([await ctx.step(pay, i) for i in range(steps)])
