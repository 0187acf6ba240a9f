"""An App for the HTTP API tests: runs that wait for people, served and worked by
separate processes.

Reads MAINSPRING_DATABASE_URL (the store) and MAINSPRING_TEST_LEDGER (the effect
ledger file) from the environment.
"""

from __future__ import annotations

import os
import time

import mainspring as ms
from mainspring.testing import EffectLedger

app = ms.App(lease_s=2.0, poll_interval_s=0.05)
ledger = EffectLedger(os.environ["MAINSPRING_TEST_LEDGER"])


def effect(name: str) -> str:
    ledger.apply(ms.current_step().idempotency_key, name, os.getpid())
    return f"{name} by {os.getpid()}"


@app.workflow
async def deploy(ctx: ms.RunContext, env: str) -> str:
    built = await ctx.step(effect, "build", name="build")
    decision = await ctx.approval("deploy", preview={"env": env, "built": built})
    if not decision.approved:
        return f"not deployed: {decision.reason}"
    shipped = await ctx.step(effect, "ship", name="ship")
    return f"{shipped}, approved by {decision.by}"


@app.workflow
async def steps_then_wait(ctx: ms.RunContext, before: int, after: int) -> int:
    for i in range(before):
        await ctx.step(lambda i=i: i, name=f"before-{i}")
    go = await ctx.wait_for("go")
    for i in range(after):
        await ctx.step(lambda i=i: i, name=f"after-{i}")
    return int(go)


@app.workflow
async def fails(ctx: ms.RunContext) -> None:
    await ctx.step(_boom, name="boom", retry=ms.RetryPolicy(max_attempts=1))


def _boom() -> None:
    raise ValueError("the disk is full")


@app.workflow
async def release(ctx: ms.RunContext, before: int, pace_s: float) -> str:
    """Waits for "go" (so a test can open its page first), takes steps at a human pace
    (to be watched live), passes a gate, then the rest."""
    await ctx.wait_for("go")
    for i in range(before):
        await ctx.step(_pause, pace_s, name=f"check-{i}")
    decision = await ctx.approval(
        "publish", preview={"tool": "publish", "arguments": {"tag": "v1"}}
    )
    await ctx.step(_pause, 0.0, name="publish")
    return f"published {(decision.arguments or {}).get('tag', 'v1')} (approved by {decision.by})"


def _pause(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
