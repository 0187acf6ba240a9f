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

The peers do the same, each in the peer venv (``peers/run_peers.py``) on its own fresh
file at the same ``synchronous`` setting and WAL, measured the same way
(``run_peers.per_step_us``) at the same marks: DBOS (``peers/dbos_long.py``: a
``@DBOS.step()``, then ``DBOS.recv()`` for a message the driver sends once it waits, or
``DBOS.sleep``) and LangGraph (``peers/langgraph_long.py``: a node, then ``interrupt()``;
each step a fresh ``invoke(Command(resume=...))`` from the SqliteSaver checkpoint). The
peers get to the marks as mainspring does, by running the steps. DBOS never suspends a
waiting workflow: its thread blocks and the workflow stays in memory (like sticky on,
not like sticky off); see ``peers/dbos_long.py``.

``python bench/long_run.py [--marks 50,1000,5000] [--window 200] [--sync NORMAL]
[--peers]`` (NORMAL by default: the fsync of each commit, the same at every step, would
only blur the shape; peers only with ``--peers``, ``bench/step_overhead.py`` runs them
unless ``--no-peers`` or ``--quick``). Ratios: each system against its own first mark,
and against mainspring with sticky executions on at the same mark.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peers.run_peers import ensure_venv, per_step_us, run_long_peer

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
        out["sticky"] = {str(m): per_step_us(stamps, cpu, m, window) for m in marks}
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
            # From the step after the takeover.
            out["replay"][str(m)] = per_step_us(stamps, cpu, begin + 1, window)
        app.close()
    return out


# The peers, doing the same: a checkpoint and a durable wait per step (key, label, script,
# args). DBOS in WAL mode like mainspring and LangGraph (it leaves SQLite's default).
PEER_RUNS = (
    ("dbos_recv", "DBOS {version}, recv ← send", "dbos_long.py", ("--wal", "--wait", "recv")),
    ("dbos_sleep", "DBOS {version}, sleep", "dbos_long.py", ("--wal", "--wait", "sleep")),
    ("langgraph", "LangGraph {version}, interrupt → resume", "langgraph_long.py", ()),
)


def long_peers(
    marks: tuple[int, ...], window: int, sync: str = "NORMAL", log: Callable[[str], Any] = print
) -> dict[str, Any]:
    """The peers' per-step cost at the same marks, each in the peer venv on a fresh file:
    ``{key: their JSON or {"error"}}``, or ``{"error"}`` if the venv cannot be built."""
    try:
        python = ensure_venv()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {}
    for key, _, script, extra in PEER_RUNS:
        log(f"· long run, peer {key}…")
        out[key] = run_long_peer(python, script, marks, window, sync, extra_args=extra)
    return out


COLUMNS = "system|step|wall µs/step|vs first|CPU µs/step|vs first|wall × on|CPU × on"


def render_rows(r: dict[str, Any]) -> list[list[str]]:
    """Rows of COLUMNS: mainspring sticky on, sticky off, then each peer measured; per
    mark the wall (median) and CPU µs per step, each against the system's first mark and
    against mainspring with sticky executions on at the same mark. An empty row between
    systems; a peer that failed is one row with its error."""
    on = r["sticky"]
    systems: list[tuple[str, dict[str, Any] | str]] = [
        ("mainspring, sticky on", on),
        ("mainspring, sticky off (replay)", r["replay"]),
    ]
    peers = r.get("peers", {})
    if "error" in peers:
        systems.append(("peers", str(peers["error"])))
    for key, label, _, _ in PEER_RUNS:
        if key in peers:
            p = peers[key]
            name = label.format(version=p.get("version", "?"))
            systems.append((name, str(p["error"]) if "error" in p else p["per_step"]))
    rows: list[list[str]] = []
    for name, per in systems:
        if rows:
            rows.append([])
        if isinstance(per, str):
            rows.append([name, "error", per.replace("\n", " ")[-100:], "", "", "", "", ""])
            continue
        first = per[str(r["marks"][0])]
        for m in r["marks"]:
            x, base = per[str(m)], on[str(m)]
            rows.append(
                [
                    name if m == r["marks"][0] else "",
                    f"{m:,}",
                    f"{x['wall']:,.0f}",
                    f"{x['wall'] / first['wall']:.2f}×",
                    f"{x['cpu']:,.0f}",
                    f"{x['cpu'] / first['cpu']:.2f}×",
                    f"{x['wall'] / base['wall']:.1f}×",
                    f"{x['cpu'] / base['cpu']:.1f}×",
                ]
            )
    return rows


NOTE = """\
sticky off: taken to each mark sticky, then a replaying worker for the window.
DBOS and LangGraph in the peer venv, same SQLite synchronous setting, WAL, one process each.
DBOS: a @DBOS.step() then DBOS.recv() for a DBOS.send() the driver makes once it waits
(woken by DBOS's SQLite notification poller, polling every 1 ms), or DBOS.sleep(1e-6);
either wait blocks the workflow's thread: DBOS keeps the workflow in memory and never
suspends it or replays it (only recovery replays), like sticky on, never like sticky off.
LangGraph: SqliteSaver, durability="sync"; a node, then interrupt(); each step a fresh
invoke(Command(resume=...)) that loads the last checkpoint (2 checkpoints per step)."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--marks", default="50,1000,5000", help="steps at which to measure")
    p.add_argument("--window", type=int, default=200, help="steps measured at each mark")
    p.add_argument("--sync", default="NORMAL", choices=("FULL", "NORMAL"), help="SQLite sync")
    p.add_argument(
        "--peers", action=argparse.BooleanOptionalAction, default=False, help="DBOS, LangGraph"
    )
    args = p.parse_args()
    marks = tuple(int(m) for m in args.marks.split(","))
    r = asyncio.run(long_run(marks, args.window, args.sync))
    if args.peers:
        r["peers"] = long_peers(marks, args.window, args.sync, lambda m: print(m, file=sys.stderr))
    rows = [COLUMNS.split("|"), *render_rows(r)]
    widths = [max(len(row[i]) for row in rows if row) for i in range(len(rows[0]))]
    print(f"SQLite synchronous={r['sync']}, WAL, window {r['window']} steps")
    for row in rows:
        pairs = enumerate(zip(row, widths, strict=True)) if row else enumerate([])
        print(" | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs))
    print(f"sticky on: resumed {r['sticky_resumed']:,} times")
    print(NOTE if args.peers else NOTE.splitlines()[0] + " Peers: not measured (--peers).")


if __name__ == "__main__":
    main()
