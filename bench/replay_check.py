"""How fast the replay gate checks a fleet: ``app.replay_check()`` over many unfinished
runs, beside the floor of reading their journals and beside replaying them for real.

Runs of ``steps_then_wait`` (``--steps`` steps, then a wait for a signal) are left
waiting in a fresh database, ``--runs`` of them. Three numbers, one run of this script:

* the floor: one ``store.load_steps`` per run (the journal must be read; nothing less
  can check it);
* the gate: ``app.replay_check()`` (the same reads, plus each workflow replayed against
  its journal, with nothing written);
* a worker's replay: each run replayed for real as a worker without sticky executions
  would after a deploy (signal, claim, replay, step, finish), for scale: the gate must be
  cheap beside what the deploy itself will cost.

``python bench/replay_check.py [--runs 500] [--steps 50] [--db sqlite|postgres]``
(PostgreSQL from ``MAINSPRING_TEST_POSTGRES_DSN``). A report; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import mainspring as ms


def bump(i: int) -> int:
    return i + 1


async def steps_then_wait(ctx: ms.RunContext, steps: int) -> int:
    n = 0
    for _ in range(steps):
        n = await ctx.step(bump, n)
    await ctx.wait_for("go")
    return n


def _url(kind: str, tmp: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp / 'fleet.db'}?synchronous=NORMAL"
    dsn = os.environ.get("MAINSPRING_TEST_POSTGRES_DSN")
    if not dsn:
        raise SystemExit("--db postgres needs MAINSPRING_TEST_POSTGRES_DSN")
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    return dsn


async def measure(runs: int, steps: int, kind: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ms-replay-check-") as tmp:
        app = ms.App(_url(kind, Path(tmp)), poll_interval_s=0.01, inline_wait_s=0.0)
        flow = app.workflow(steps_then_wait)
        try:
            ids = [app.submit(flow, steps).run_id for _ in range(runs)]
            await app.worker(concurrency=64).run(until_idle=True)
            t0 = time.perf_counter()
            for run_id in ids:
                run = app.store.get_run(run_id)
                assert run is not None
                app.store.load_steps(run_id, run.session)
            floor = time.perf_counter() - t0
            t0 = time.perf_counter()
            report = await app.replay_check()
            gate = time.perf_counter() - t0
            assert report.ok and len(report.runs) == runs, report.summary()
            for run_id in ids:
                app.signal(run_id, "go")
            t0 = time.perf_counter()
            await app.worker(concurrency=64, sticky=False).run(until_idle=True)
            worker = time.perf_counter() - t0
            assert all(app.get_run(i).status == "succeeded" for i in ids)
        finally:
            app.close()
    return {"floor": floor, "gate": gate, "worker": worker}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    args = parser.parse_args()
    got = asyncio.run(measure(args.runs, args.steps, args.db))
    table = Table(title=f"{args.runs} waiting runs of {args.steps} steps each, {args.db}")
    for column in ("", "seconds", "runs a minute", "× the floor"):
        table.add_column(column, justify="right" if column else "left")
    rows = (
        ("read each journal (the floor)", "floor"),
        ("app.replay_check()", "gate"),
        ("a worker replaying and finishing each", "worker"),
    )
    for label, key in rows:
        seconds = got[key]
        table.add_row(
            label,
            f"{seconds:.2f}",
            f"{args.runs / seconds * 60:,.0f}",
            f"{seconds / got['floor']:.1f}×",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
