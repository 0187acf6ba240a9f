"""An App for the process tests of hostile user code: one run's step calls sys.exit
while other runs are in flight in the same worker.

Reads MAINSPRING_DATABASE_URL (the store) and MAINSPRING_TEST_GATE (a directory:
each patient step leaves a file there, and waits for a file named ``open``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import mainspring as ms

app = ms.App(lease_s=2.0, poll_interval_s=0.02)
GATE = Path(os.environ.get("MAINSPRING_TEST_GATE", "."))


def hold(n: int) -> int:
    """In flight until the test opens the gate."""
    (GATE / f"holding-{ms.current_step().run_id}").touch()
    deadline = time.monotonic() + 60
    while not (GATE / "open").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return n


def quit_like_a_cli(expected: int) -> None:
    """What argparse does on a bad flag, once the other runs hold their steps."""
    deadline = time.monotonic() + 60
    while len(list(GATE.glob("holding-*"))) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(2)


@app.workflow
async def patient(ctx: ms.RunContext, n: int) -> int:
    return await ctx.step(hold, n) + 1


@app.workflow
async def quitter(ctx: ms.RunContext, expected: int) -> str:
    await ctx.step(quit_like_a_cli, expected, retry=ms.RetryPolicy(max_attempts=2, initial_s=0))
    return "unreachable"
