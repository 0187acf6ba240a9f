"""The "long run" table of ``bench/step_overhead.py``: per-step cost deep into one run
that suspends after every step, with sticky executions on and off.

The workflow takes a step, then sleeps past the inline wait (a durable sleep: the run
suspends and a worker claims it again when it is due), forever. The App's clock moves
on by a second at every reading, so each sleep is due at once and nothing waits on
time: what is measured is the engine's cost of a step plus a suspension and a wake-up.

Sticky on: one worker all the way. Sticky off: every wake-up replays the run from
the top, so getting to step 5,000 that way costs O(n²); the run is taken there with
stickiness on, and a worker with it off takes over for the measured window (the
journal is the same either way). Per-step cost at step k, over the ``window``
steps after k: the median wall-clock interval between step calls, and the process's
CPU time per step (all its threads; less disturbed by a busy machine).

``python bench/long_run.py [--marks 50,1000,5000] [--window 200] [--sync NORMAL]``
(NORMAL by default: the fsync of each commit, the same at every step, would only
blur the shape). The peers (DBOS,
LangGraph: a checkpoint and a resume per step) are not measured here yet.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import mainspring as ms
from mainspring.storage import SQLiteStore

stamps: list[float] = []  # perf_counter at each step call
target = [0]  # steps wanted: the driver stops the worker then
cpu: list[float] = []  # process_time at each step call (all threads of the process)


class Ticking(ms.FakeClock):
    """A clock that moves on by a second at every reading: every sleep is due at once."""

    def now(self) -> float:
        self.advance(1.0)
        return super().now()


async def tick(i: int) -> int:
    stamps.append(time.perf_counter())
    cpu.append(time.process_time())
    if len(stamps) >= target[0] and reached is not None:
        reached.set()
    return i


reached: asyncio.Event | None = None


async def long_wf(ctx: ms.RunContext, n: int) -> int:
    """n steps, each followed by a durable sleep (the run suspends after every step)."""
    for i in range(n):
        await ctx.step(tick, i)
        await ctx.sleep(5)
    return n


async def _work_until(app: ms.App, sticky: bool, count: int) -> ms.Worker:
    """Run a worker until ``count`` steps were called (the run has more)."""
    global reached
    reached = asyncio.Event()
    target[0] = count
    worker = app.worker(sticky=sticky, concurrency=4)
    task = asyncio.create_task(worker.run())
    if len(stamps) < count:
        await reached.wait()
    worker.request_stop()
    await task
    return worker


def _per_step_us(start: int, window: int) -> dict[str, float]:
    """Wall (median gap) and CPU (mean) µs per step over ``window`` steps from ``start``."""
    gaps = [
        b - a for a, b in zip(stamps[start : start + window], stamps[start + 1 :], strict=False)
    ]
    end = min(start + window, len(cpu) - 1)
    return {
        "wall": statistics.median(gaps[:window]) * 1e6,
        "cpu": (cpu[end] - cpu[start]) / max(1, end - start) * 1e6,
    }


async def long_run(marks: tuple[int, ...], window: int, sync: str = "NORMAL") -> dict[str, Any]:
    """µs per step (step + durable sleep + wake-up) at each mark, sticky on and off."""
    out: dict[str, Any] = {"marks": list(marks), "window": window, "sync": sync}
    out.update(sticky={}, replay={})
    with tempfile.TemporaryDirectory(prefix="ms-long-") as tmp:
        # Sticky on: one worker, one run, all the way.
        stamps.clear()
        cpu.clear()
        app = ms.App(
            SQLiteStore(Path(tmp) / "sticky.db", synchronous=sync),
            clock=Ticking(),
            inline_wait_s=0.0,
            poll_interval_s=0.5,  # a suspension wakes the claim loop itself
            lease_s=1e9,
        )
        app.workflow(long_wf)
        app.submit("long_wf", max(marks) + window + 2)
        worker = await _work_until(app, True, max(marks) + window + 2)
        out["sticky"] = {str(m): _per_step_us(m, window) for m in marks}
        out["sticky_resumed"] = worker.stats.resumed
        app.close()

        # Sticky off: taken to each mark sticky, then a replaying worker for the window.
        stamps.clear()
        cpu.clear()
        app = ms.App(
            SQLiteStore(Path(tmp) / "replay.db", synchronous=sync),
            clock=Ticking(),
            inline_wait_s=0.0,
            poll_interval_s=0.5,  # a suspension wakes the claim loop itself
            lease_s=1e9,
        )
        app.workflow(long_wf)
        app.submit("long_wf", max(marks) + window + 2)
        for m in marks:
            await _work_until(app, True, m)
            begin = len(stamps)
            await _work_until(app, False, begin + window + 2)
            out["replay"][str(m)] = _per_step_us(begin + 1, window)  # after the takeover
        app.close()
    return out


def render_rows(r: dict[str, Any]) -> list[list[str]]:
    """Rows: step; sticky on wall µs, its ratio to the first mark, CPU µs and its ratio;
    sticky off wall µs, CPU µs; off/on (wall)."""
    rows: list[list[str]] = []
    first = r["sticky"][str(r["marks"][0])]
    for m in r["marks"]:
        on, off = r["sticky"][str(m)], r["replay"][str(m)]
        rows.append(
            [
                f"{m:,}",
                f"{on['wall']:,.0f}",
                f"{on['wall'] / first['wall']:.2f}×",
                f"{on['cpu']:,.0f}",
                f"{on['cpu'] / first['cpu']:.2f}×",
                f"{off['wall']:,.0f}",
                f"{off['cpu']:,.0f}",
                f"{off['wall'] / on['wall']:.1f}×",
            ]
        )
    return rows


COLUMNS = (
    "step|sticky on: wall µs/step|vs first|CPU µs/step|vs first"
    "|sticky off: wall µs/step|CPU µs/step|off/on"
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--marks", default="50,1000,5000", help="steps at which to measure")
    p.add_argument("--window", type=int, default=200, help="steps measured at each mark")
    p.add_argument("--sync", default="NORMAL", choices=("FULL", "NORMAL"), help="SQLite sync")
    args = p.parse_args()
    marks = tuple(int(m) for m in args.marks.split(","))
    r = asyncio.run(long_run(marks, args.window, args.sync))
    print(f"SQLite synchronous={r['sync']}, window {r['window']} steps")
    print(COLUMNS.replace("|", " | "))
    for row in render_rows(r):
        print(" | ".join(row))
    print(f"(resumed {r['sticky_resumed']:,} times; peers not measured)")


if __name__ == "__main__":
    main()
