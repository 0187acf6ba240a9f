"""The next deployment of ``deploy_old``'s code: ``order`` checks the stock before
packing, for runs that reach that point under this code (``ctx.patched``). Same
environment as ``deploy_old``."""

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


def check_stock(i: int) -> str:
    return f"in stock {i}"


def pack(i: int) -> str:
    return f"packed {i}"


def ship(i: int) -> str:
    return f"shipped {i}"


@app.workflow(name="order")
async def order(ctx: ms.RunContext, i: int) -> list[str]:
    out = [await ctx.step(fetch, i)]
    await ctx.sleep(PAUSE_S)
    if ctx.patched("check-stock"):
        out.append(await ctx.step(check_stock, i))
    out.append(await ctx.step(pack, i))
    await ctx.sleep(PAUSE_S)
    out.append(await ctx.step(ship, i))
    return out
