"""An App for the child-run process test: parents fan out to children while their
workers are SIGKILLed.

Reads MAINSPRING_DATABASE_URL (the store) and MAINSPRING_TEST_LEDGER (the effect
ledger file) from the environment.
"""

from __future__ import annotations

import asyncio
import os
import time

import mainspring as ms
from mainspring.testing import EffectLedger

app = ms.App(lease_s=float(os.environ.get("MAINSPRING_TEST_LEASE_S", "1.0")))
ledger = EffectLedger(os.environ["MAINSPRING_TEST_LEDGER"])
STEP_S = float(os.environ.get("MAINSPRING_TEST_STEP_S", "0.01"))


def pay(n: int) -> int:
    """An effect on a system that deduplicates by key."""
    time.sleep(STEP_S)
    ledger.apply(ms.current_step().idempotency_key, "pay", n)
    return n


@app.workflow
async def kid(ctx: ms.RunContext, i: int) -> int:
    return sum([await ctx.step(pay, i * 10 + j) for j in range(4)])


@app.workflow
async def family(ctx: ms.RunContext, steps: int) -> int:
    first = await ctx.step(pay, 1000)
    fanned = await asyncio.gather(*(ctx.child(kid, i) for i in range(3)))
    last = await ctx.child(kid, 3, key="last")
    for j in range(steps):
        first += await ctx.step(pay, 2000 + j)
    return first + sum(fanned) + last
