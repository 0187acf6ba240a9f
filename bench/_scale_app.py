"""Workflows of ``bench/scale.py``, run by ``python -m mainspring worker bench._scale_app:app``.

The App reads MAINSPRING_DATABASE_URL. The bench process registers the same functions on
its own App (``register``) to submit, signal and time them. A worker started with SCALE_GATE
(a directory) says it is ready there once imported, then waits for the file ``go``: the
timing starts when every worker has paid its start-up (interpreter, imports).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import mainspring as ms


async def noop(i: int) -> int:
    """A trivial step."""
    return i


def stamp() -> float:
    """The wall-clock time at which the step ran (in the worker)."""
    return time.time()


async def steps(ctx: ms.RunContext, n: int) -> int:
    """n trivial steps."""
    for i in range(n):
        await ctx.step(noop, i)
    return n


async def waiter(ctx: ms.RunContext) -> float:
    """One step, a wait for the signal "go", then a step that notes when it resumed."""
    await ctx.step(noop, 0)
    await ctx.wait_for("go")
    resumed: float = await ctx.step(stamp)
    return resumed


def register(app: ms.App) -> ms.App:
    """Register this module's workflows on ``app``."""
    for wf in (steps, waiter):
        app.workflow(wf)
    return app


def _gate() -> None:
    gate = os.environ.get("SCALE_GATE")
    if gate:
        Path(gate, f"ready.{os.getpid()}").touch()
        while not Path(gate, "go").exists():
            time.sleep(0.002)


app = register(ms.App())
_gate()
