"""The code of a deployment before a change (tests/test_deploys.py): ``order`` fetches,
pauses, packs, pauses and ships. ``deploy_new`` is the next deployment, which checks
the stock before packing under ``ctx.patched("check-stock")``.

Environment: MAINSPRING_DATABASE_URL (the store); MAINSPRING_TEST_VERSION (the App's
code version; none when unset); MAINSPRING_TEST_PAUSE_S (each pause).
"""

from __future__ import annotations

import os

import mainspring as ms

PAUSE_S = float(os.environ.get("MAINSPRING_TEST_PAUSE_S", "1.0"))

app = ms.App(
    lease_s=5.0,
    poll_interval_s=0.05,
    inline_wait_s=0.1,
    version=os.environ.get("MAINSPRING_TEST_VERSION") or None,
)


def fetch(i: int) -> str:
    return f"fetched {i}"


def pack(i: int) -> str:
    return f"packed {i}"


def ship(i: int) -> str:
    return f"shipped {i}"


@app.workflow(name="order")
async def order(ctx: ms.RunContext, i: int) -> list[str]:
    out = [await ctx.step(fetch, i)]
    await ctx.sleep(PAUSE_S)  # the run leaves its worker: any worker may take it on
    out.append(await ctx.step(pack, i))
    await ctx.sleep(PAUSE_S)
    out.append(await ctx.step(ship, i))
    return out
