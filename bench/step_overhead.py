"""Durable step overhead, journal size, replay time and group commit, beside the limits.

Prints the DESIGN.md §10 engine numbers beside the physical limit (a raw sqlite3 commit
loop) and the peers (DBOS, LangGraph, via ``peers/run_peers.py``), as ratios. A report:
nothing is asserted. ``python bench/step_overhead.py [--quick] [--no-peers] [--json]``
(with ``--json`` the tables go to stderr and one JSON document to stdout).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from long_run import COLUMNS as LONG_COLUMNS
from long_run import NOTE as LONG_NOTE
from long_run import long_peers, long_run, render_rows
from peers.run_peers import ensure_venv, run_peer
from rich.console import Console
from rich.table import Table

import mainspring as ms
from mainspring.journal import Committer, Engine, RunControl, execute
from mainspring.storage import RunWrite, SQLiteStore, WriteResult

Sync = Literal["FULL", "NORMAL"]
SYNCS: tuple[Sync, ...] = ("FULL", "NORMAL")
PEER_RUNS = (
    ("dbos", "dbos_steps.py", ()),
    ("dbos (WAL)", "dbos_steps.py", ("--wal",)),
    ("langgraph", "langgraph_steps.py", ()),
)
TARGET_X_RAW: dict[Sync, float] = {"FULL": 1.2, "NORMAL": 1.8}  # issue 18
WARMUP = 20
KB = 1024
calls = 0  # step-function invocations: a replay must leave it at 0


async def delta(i: int, size: int) -> str:
    """A step: the index, padded to ``size`` bytes (a delta of the workflow's state)."""
    global calls
    calls += 1
    return f"{i:08d}".ljust(size, "x")


def delta_sync(i: int, size: int) -> str:
    """The same step as a plain ``def`` (run on a thread, as every sync step is)."""
    global calls
    calls += 1
    return f"{i:08d}".ljust(size, "x")


async def steps_wf_sync(ctx: ms.RunContext, n: int, size: int = 8) -> int:
    """``steps_wf`` with the sync step function."""
    state = [await ctx.step(delta_sync, i, size) for i in range(n)]
    return len(state)


async def steps_wf(ctx: ms.RunContext, n: int, size: int = 8, wait: bool = False) -> int:
    """n steps; the state (every delta) lives in memory, each delta once in the journal.
    With ``wait`` the run ends by waiting for the signal "go"."""
    state = [await ctx.step(delta, i, size) for i in range(n)]
    if wait:
        await ctx.wait_for("go")
    return len(state)


class CountingStore(SQLiteStore):
    """A SQLiteStore noting when each commit happened and how many run writes it carried."""

    def __init__(self, path: Path, synchronous: Sync) -> None:
        super().__init__(path, synchronous=synchronous)
        self.commits: list[tuple[float, int]] = []

    def commit(self, batch: Sequence[RunWrite], now: float) -> list[WriteResult]:
        self.commits.append((time.perf_counter(), len(batch)))
        return super().commit(batch, now)


@contextlib.contextmanager
def fresh_app(sync: Sync) -> Iterator[tuple[ms.App, CountingStore]]:
    """An App with ``steps_wf`` on a new temporary database file."""
    with tempfile.TemporaryDirectory(prefix="ms-bench-") as tmp:
        store = CountingStore(Path(tmp) / "bench.db", sync)
        app = ms.App(store)
        app.workflow(steps_wf)
        app.workflow(steps_wf_sync)
        try:
            yield app, store
        finally:
            app.close()


def raw_limit(sync: Sync, steps: int, repeat: int) -> tuple[float, float]:
    """µs per ``BEGIN; INSERT one journal-like row; COMMIT`` on a fresh WAL file, wall
    and CPU (medians)."""
    samples: list[float] = []
    cpu: list[float] = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="ms-raw-") as tmp:
            conn = sqlite3.connect(Path(tmp) / "raw.db", isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {sync}")
            conn.execute(  # the shape of ms_steps
                "CREATE TABLE steps (run_id TEXT, session INT, seq INT, kind TEXT, name TEXT,"
                " status TEXT, attempt INT, epoch INT, output TEXT, error TEXT, started_at REAL,"
                " finished_at REAL, wake_at REAL, PRIMARY KEY (run_id, session, seq)) WITHOUT ROWID"
            )
            t0, c0 = time.perf_counter(), time.process_time()
            for seq in range(WARMUP + steps):
                if seq == WARMUP:
                    t0, c0 = time.perf_counter(), time.process_time()
                now = time.time()
                row = ("0" * 32, 0, seq, "step", "noop", "completed", 1, 1, str(seq), None, now)
                conn.execute("BEGIN")
                conn.execute(
                    "INSERT INTO steps VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", (*row, now, None)
                )
                conn.execute("COMMIT")
            samples.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            conn.close()
    return statistics.median(samples) / steps * 1e6, statistics.median(cpu) / steps * 1e6


async def step_overhead(
    sync: Sync, steps: int, repeat: int, workflow: str = "steps_wf"
) -> dict[str, float]:
    """µs per step of ``await app.run(...)``, wall and CPU (medians over ``repeat``
    fresh files). CPU is the process's, every thread's: on a machine shared with other
    work it moves far less than the wall time."""
    samples: list[float] = []
    cpu: list[float] = []
    commits: list[int] = []
    for _ in range(repeat):
        with fresh_app(sync) as (app, store):
            await app.run(workflow, WARMUP)
            store.commits.clear()
            t0, c0 = time.perf_counter(), time.process_time()
            await app.run(workflow, steps)
            samples.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            commits.append(len(store.commits))
    return {
        "us_per_step": statistics.median(samples) / steps * 1e6,
        "cpu_us_per_step": statistics.median(cpu) / steps * 1e6,
        "commits_per_step": statistics.median(commits) / steps,
    }


async def replay(steps: int, kb: bool) -> dict[str, Any]:
    """Journal ``steps`` steps and a wait; signal; time ``execute`` on the claimed run.
    Then measure the database: file + WAL after a truncating checkpoint."""
    global calls
    with fresh_app("FULL") as (app, store), ThreadPoolExecutor(1) as threads:
        rid = app.submit("steps_wf", steps, KB if kb else 8, wait=True).run_id
        await app.worker(concurrency=1).run(until_idle=True)  # runs the steps, then waits
        app.signal(rid, "go")
        t0 = time.perf_counter()
        rows = len(store.load_steps(rid, 0))
        load = time.perf_counter() - t0
        now = app.clock.now()
        [record] = store.claim(
            worker="b", now=now, lease_s=60, limit=1, workflows=None, max_recoveries=1, run_id=rid
        )
        committer = Committer(store, app.clock)  # inline, like app.run
        engine = Engine(store, app.clock, app.rng, committer, threads, app.default_retry, 1.0)
        engine.redact = app.redactor.redact_json if app.redactor is not None else None
        calls, store.commits[:] = 0, []
        t0 = time.perf_counter()
        outcome = await execute(engine, record, app.get_workflow("steps_wf"), RunControl())
        total = time.perf_counter() - t0
        app.close()
        with contextlib.closing(sqlite3.connect(store.path)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        files = [Path(store.path + suffix) for suffix in ("", "-wal", "-journal")]
        size = sum(f.stat().st_size for f in files if f.exists())
    first = store.commits[0][0] if store.commits else t0
    return {
        "state": "1 KB/step" if kb else "trivial",
        "journal_rows": rows,
        "load_ms": load * 1e3,
        "replay_ms": (first - t0) * 1e3,
        "resume_total_ms": total * 1e3,
        "step_calls": calls,
        "outcome": outcome,
        "db_bytes": size,
    }


async def throughput(n_runs: int, run_steps: int, concurrency: int, repeat: int) -> dict[str, Any]:
    """Steps/s of ``n_runs`` runs of ``run_steps`` steps, all submitted first, in one worker
    (the sample with the median rate of ``repeat`` fresh files)."""
    samples: list[dict[str, Any]] = []
    for _ in range(repeat):
        with fresh_app("FULL") as (app, store):
            for _ in range(min(n_runs, 10)):
                app.submit("steps_wf", 5)
            await app.worker(concurrency=concurrency).run(until_idle=True)  # warm-up
            for _ in range(n_runs):
                app.submit("steps_wf", run_steps)
            store.commits.clear()
            t0 = time.perf_counter()
            await app.worker(concurrency=concurrency).run(until_idle=True)
            seconds = time.perf_counter() - t0
            sizes = [n for _, n in store.commits]
            samples.append(
                {
                    "runs": n_runs,
                    "steps": n_runs * run_steps,
                    "seconds": seconds,
                    "steps_per_s": n_runs * run_steps / seconds,
                    "commits": len(sizes),
                    "writes_per_commit": sum(sizes) / max(len(sizes), 1),
                    "max_writes_per_commit": max(sizes, default=0),
                    "all_succeeded": set(store.count_runs()) == {"succeeded"},
                }
            )
    return sorted(samples, key=lambda x: float(x["steps_per_s"]))[len(samples) // 2]


def peers(steps: int, log: Console) -> dict[str, Any]:
    """Peer rows for the overhead table (both syncs) and the size table."""
    try:
        python = ensure_venv()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {"overhead": {}, "size": {}}
    for sync in SYNCS:
        for key, script, extra in PEER_RUNS:
            log.print(f"[dim]· peer {key}, {sync}…")
            out["overhead"][f"{key}:{sync}"] = run_peer(python, script, steps, sync, 0, 600, extra)
    for key, script, _ in PEER_RUNS[::2]:
        log.print(f"[dim]· peer {key}, state +1 KB/step…")
        out["size"][key] = run_peer(python, script, steps, "NORMAL", state_kb_per_step=1)
    return out


# Per table: title, columns split on "|" (the first left-aligned), caption.
HEADS = [
    head.splitlines()
    for head in """
1. Durable step overhead, {steps:,} trivial steps, await app.run(...), async and sync step functions
system|sync|journal|µs/step|× raw limit|CPU µs/step|CPU × raw|mainspring speed-up|target
targets: mainspring ≤ 1.2× the raw limit at FULL, ≤ 1.8× at NORMAL; ≥ 3× faster than each peer
CPU: the process's CPU time per step (all threads), steadier than µs/step on a shared machine

2. Journal bytes, {steps:,} steps, state growing 1 KB/step (each step returns a 1 KB delta)
system|bytes|MB|× the deltas alone|target ≤ 3 MB
database + WAL after PRAGMA wal_checkpoint(TRUNCATE); -1: the peer failed

3. Replay of a {steps:,}-step session: execute() on the claimed, signalled run
state|rows|load_steps ms|replay ms|resume total ms|step calls|outcome|target ≤ 100 ms
replay: from the top to the first new write; resume adds the wait's and finish's commits

4. One worker (concurrency={runs}), FULL, {run_steps} steps per run
case|steps|seconds|steps/s|× single|commits|run writes/commit|target ≥ 5×
commits: transactions of the worker's BatchCommitter; all runs succeeded: {ok}

5. Long run: one run suspending after every step (a durable sleep), sticky on and off, {sync}
{columns}
target: sticky on, the cost at the last step ≤ 1.2× the first; × on: against sticky on, same step
{note}
""".strip().split("\n\n")
]


def met(ok: bool) -> str:
    return "[green]met[/]" if ok else "[red]missed[/]"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×"


def cells(*values: object) -> list[str]:
    return [
        f"{v:,.1f}" if isinstance(v, float) else f"{v:,}" if type(v) is int else str(v)
        for v in values
    ]


def show(con: Console, n: int, rows: list[list[str]], **fields: Any) -> None:
    """Table ``n`` of HEADS; an empty row starts a new section."""
    title, columns, *notes = (text.format(**fields) for text in HEADS[n - 1])
    note = "\n".join(notes)
    t = Table(title=title, caption=note, title_justify="left", caption_justify="left")
    t.min_width = len(title)  # rich would wrap a title wider than the columns
    for i, col in enumerate(columns.split("|")):
        t.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*row) if row else t.add_section()
    con.print(t)


def render(r: dict[str, Any], con: Console) -> None:
    """Print the header and the four tables."""
    m, a, peer = r["machine"], r["args"], r.get("peers", {})
    con.print(
        f"[bold]mainspring {ms.__version__}[/] · {m['cores']} cores · Python {m['python']}"
        f" · SQLite {m['sqlite']} · {m['platform']} · temp files in {m['tmp']}"
    )
    if "error" in peer:
        con.print(f"[red]peers unavailable: {peer['error']}")
    rows: list[list[str]] = []
    for sync in SYNCS:
        raw, raw_cpu = r["raw_us"][sync], r["raw_cpu_us"][sync]
        mine = r["mainspring"][sync]["us_per_step"]
        rows.append(
            cells("raw sqlite3: BEGIN; INSERT; COMMIT", sync, "WAL", raw, "1.00×", raw_cpu, "1.00×")
        )
        for key, fn in (("mainspring", "async def"), ("mainspring_sync", "def")):
            us, per = r[key][sync]["us_per_step"], r[key][sync]["commits_per_step"]
            cpu = r[key][sync]["cpu_us_per_step"]
            name = f"mainspring, {fn} step ({per:.3f} commits/step)"
            ok = met(us <= TARGET_X_RAW[sync] * raw)
            rows.append(
                cells(name, sync, "WAL", us, ratio(us, raw), cpu, ratio(cpu, raw_cpu), "", ok)
            )
        for key, _, _ in PEER_RUNS:
            p = peer.get("overhead", {}).get(f"{key}:{sync}")
            if p is not None and "error" in p:
                rows.append(cells(key, sync, "", "error", "", "", "", "", p["error"][-60:]))
            elif p is not None:
                us, name = p["per_step_us"], f"{key} {p['version']}"
                x_raw, ok = ratio(us, raw), met(us >= 3 * mine)
                rows.append(
                    cells(name, sync, p["journal_mode"], us, x_raw, "", "", ratio(us, mine), ok)
                )
        rows.append([])
    show(con, 1, rows[:-1], **a)

    sizes = [("mainspring", r["replay"][-1]["db_bytes"])]
    for key, p in peer.get("size", {}).items():
        sizes.append((f"{key} {p.get('version', '')}", p.get("db_bytes", -1)))
    floor = a["steps"] * KB
    rows = [
        cells(k, f"{n:,}", f"{n / 1e6:.2f}", ratio(n, floor), met(0 <= n <= 3e6)) for k, n in sizes
    ]
    show(con, 2, rows, **a)

    rows = []
    for x in r["replay"]:
        ok = met(x["replay_ms"] <= 100 and x["step_calls"] == 0)
        times = (x["load_ms"], x["replay_ms"], x["resume_total_ms"])
        rows.append(cells(x["state"], x["journal_rows"], *times, x["step_calls"], x["outcome"], ok))
    show(con, 3, rows, **a)

    tp, rows = r["throughput"], []
    single = tp["single"]["steps_per_s"]
    for key, label in (("single", "1 run alone"), ("concurrent", f"{a['runs']} runs at once")):
        x, gain = tp[key], tp[key]["steps_per_s"] / single
        ok = met(gain >= 5) if key == "concurrent" else ""
        per = f"{x['writes_per_commit']:.1f} (max {x['max_writes_per_commit']})"
        speed = f"{x['steps_per_s']:,.0f}"
        rows.append(cells(label, x["steps"], f"{x['seconds']:.3f}", speed, f"{gain:.2f}×"))
        rows[-1] += [f"{x['commits']:,}", per, ok]
    inline = 1e6 / r["mainspring"]["FULL"]["us_per_step"]  # no committer thread
    rows.append(
        cells("(1 run by app.run, table 1)", "", "", f"{inline:,.0f}", ratio(inline, single))
    )
    show(con, 4, rows, ok=all(x["all_succeeded"] for x in tp.values()), **a)

    if "long_run" in r:  # bench/long_run.py: see there how it is measured
        lr = r["long_run"]
        note = LONG_NOTE if "peers" in lr else LONG_NOTE.splitlines()[0] + " Peers: not measured."
        show(con, 5, render_rows(lr), columns=LONG_COLUMNS, sync=lr["sync"], note=note, **a)


async def measure(args: argparse.Namespace, log: Console) -> dict[str, Any]:
    r: dict[str, Any] = {"raw_us": {}, "raw_cpu_us": {}, "mainspring": {}, "mainspring_sync": {}}
    if not args.no_peers:  # first, while this process is idle
        r["peers"] = peers(args.steps, log)
    for sync in SYNCS:
        log.print(f"[dim]· raw sqlite3 and mainspring, {sync}…")
        r["raw_us"][sync], r["raw_cpu_us"][sync] = raw_limit(sync, args.steps, args.repeat)
        r["mainspring"][sync] = await step_overhead(sync, args.steps, args.repeat)
        r["mainspring_sync"][sync] = await step_overhead(
            sync, args.steps, args.repeat, "steps_wf_sync"
        )
    log.print("[dim]· replay and journal size, one worker…")
    r["replay"] = [await replay(args.steps, kb) for kb in (False, True)]
    r["throughput"] = {
        "single": await throughput(1, args.run_steps, args.runs, args.repeat),
        "concurrent": await throughput(args.runs, args.run_steps, args.runs, args.repeat),
    }
    if args.long_marks:
        log.print("[dim]· long run, sticky executions on and off…")
        marks = tuple(int(m) for m in args.long_marks.split(","))
        r["long_run"] = await long_run(marks, args.long_window)
        if not args.no_peers:
            r["long_run"]["peers"] = long_peers(
                marks, args.long_window, log=lambda msg: log.print(f"[dim]{msg}")
            )
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1000, help="steps per run, tables 1-3")
    p.add_argument("--runs", type=int, default=100, help="concurrent runs, table 4")
    p.add_argument("--run-steps", type=int, default=100, help="steps per run, table 4")
    p.add_argument("--repeat", type=int, default=3, help="fresh files per timing (median)")
    p.add_argument("--quick", action="store_true", help="small sizes, no peers")
    p.add_argument("--no-peers", action="store_true", help="skip DBOS and LangGraph")
    p.add_argument("--json", action="store_true", help="JSON on stdout, tables on stderr")
    p.add_argument("--long-marks", default="50,1000,5000", help="table 5 ('': skip it)")
    p.add_argument("--long-window", type=int, default=200, help="steps per mark, table 5")
    args = p.parse_args()
    if args.quick:
        args.steps, args.runs, args.run_steps, args.repeat, args.no_peers = 100, 10, 20, 1, True
        args.long_marks, args.long_window = "50,300", 30
    log = Console(stderr=True)
    result = asyncio.run(measure(args, log))
    result["args"] = {k: getattr(args, k) for k in ("steps", "runs", "run_steps", "repeat")}
    result["machine"] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(terse=True),
        "tmp": tempfile.gettempdir(),
    }
    con = Console(stderr=args.json)
    if not con.is_terminal:
        con.width = 150  # rich would wrap to 80 columns
    render(result, con)
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
