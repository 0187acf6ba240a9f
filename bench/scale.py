"""Worker-process scaling, PostgreSQL step overhead and signal-to-resume latency.

Prints, in one run: (1) steps/s of 1, 2 and 4 ``python -m mainspring worker`` processes on
PostgreSQL and on SQLite (``synchronous=FULL``); (2) µs per step of ``await app.run(...)`` on
PostgreSQL beside pgbench's one-INSERT transactions (the limit) and DBOS 3.x on the same
server; (3) signal → resume latency, LISTEN/NOTIFY on PostgreSQL, polling on SQLite. A report:
nothing is asserted. ``python bench/scale.py [--quick] [--no-peers] [--json] [--pg URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import _scale_app
import psycopg
from peers.run_peers import PEERS_DIR, ensure_venv
from rich.console import Console
from rich.table import Table

import mainspring as ms
from mainspring.storage import RunWrite, StepRecord, WriteResult
from mainspring.storage.postgres import PostgresStore

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("postgresql", "sqlite")
WORKERS = (1, 2, 4)
TICK = os.sysconf("SC_CLK_TCK")
INSERT = (  # one journal row into the real ms_steps table; a random run id keeps keys unique
    "INSERT INTO ms_steps (run_id, session, seq, kind, name, status, attempt, epoch, output,"
    " started_at, finished_at) VALUES (md5(random()::text), 0, 0, 'step', 'noop', 'completed',"
    " 1, 1, '0', extract(epoch from clock_timestamp()), extract(epoch from clock_timestamp()))"
)
Procs = list["subprocess.Popen[bytes]"]
OPTIONS = (  # name, default, --quick value, help
    ("runs", 256, 40, "runs submitted, table 1"),
    ("run_steps", 40, 10, "steps per run, table 1"),
    ("steps", 1000, 200, "steps of the one run, table 2"),
    ("repeat", 3, 1, "timings of mainspring (median), table 2"),
    ("pgbench_tx", 2000, 300, "pgbench transactions, table 2"),
    ("signals", 200, 20, "runs signalled one at a time, table 3"),
    ("waiting", 1000, 50, "more waiting runs (never signalled), table 3"),
    ("gap", 0.05, 0.05, "mean pause between signals in seconds, table 3"),
)


class Resources:
    """Every worker process, database and file the bench makes; ``close`` removes them."""

    def __init__(self, pg: str) -> None:
        self.pg = pg.rstrip("/")
        self.tmp = Path(tempfile.mkdtemp(prefix="ms-scale-"))
        self.procs: Procs = []
        self.dbs: list[str] = []
        self.n, self.gate = 0, self.tmp

    def _admin(self, sql: str) -> None:
        with psycopg.connect(f"{self.pg}/postgres", autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)

    def database(self, backend: str) -> str:
        """A fresh database: a new PostgreSQL database or a new SQLite file (FULL)."""
        self.n += 1
        if backend == "sqlite":
            return f"sqlite:///{self.tmp / f'db{self.n}.db'}"
        name = f"ms_scale_{os.getpid()}_{self.n}"
        self._admin(f'CREATE DATABASE "{name}"')
        self.dbs.append(name)
        return f"{self.pg}/{name}"

    def start(self, url: str, k: int) -> Procs:
        """Start ``k`` worker processes on ``url``; return once all have imported the app."""
        self.gate = self.tmp / f"gate{len(self.procs)}"
        self.gate.mkdir()
        env = {**os.environ, "MAINSPRING_DATABASE_URL": url, "SCALE_GATE": str(self.gate)}
        cmd = [sys.executable, "-m", "mainspring", "worker", "bench._scale_app:app"]
        cmd += ["--concurrency", "64", "--log-level", "WARNING", "--shutdown-grace-s", "2"]
        procs: Procs = []
        for _ in range(k):
            with open(self.gate / f"log{len(procs)}", "wb") as log:
                procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log))
        self.procs += procs
        self.until(lambda: len(list(self.gate.glob("ready.*"))) >= k, procs, 0.01, 120)
        return procs

    def until(self, done: Callable[[], bool], procs: Procs, every: float, timeout: float) -> None:
        """Poll ``done`` until it is true; fail if a worker exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not done():
            if any(p.poll() is not None for p in procs):
                logs = " | ".join(f.read_text()[-300:] for f in self.gate.glob("log*"))
                raise RuntimeError(f"a worker exited: {logs}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not done after {timeout} s")
            time.sleep(every)

    def go(self) -> None:
        (self.gate / "go").touch()

    def stop(self, procs: Procs) -> None:
        """SIGTERM (the worker drains), then SIGKILL after 10 s."""
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            with suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
            p.kill()  # a no-op once it has exited
            p.wait()

    def close(self) -> None:
        self.stop(self.procs)
        for name in self.dbs:
            for attempt in range(3):
                try:
                    self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    break
                except psycopg.Error as exc:
                    if attempt == 2:
                        print(f"could not drop database {name}: {exc}", file=sys.stderr)
                    time.sleep(1)
        shutil.rmtree(self.tmp, ignore_errors=True)


def cpu(procs: Procs, db: str | None) -> dict[str, float]:
    """CPU seconds from /proc (Linux): the machine's busy and total, each worker's ("w:pid")
    and each PostgreSQL backend's serving ``db`` ("b:pid": its process title names it)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    out = {"busy": (sum(ticks) - ticks[3] - ticks[4]) / TICK, "total": sum(ticks) / TICK}
    workers = {str(p.pid) for p in procs}
    for d in Path("/proc").glob("[0-9]*"):
        with suppress(OSError):
            kind = "w" if d.name in workers else ""
            if db and not kind and f" {db} " in (d / "cmdline").read_text(errors="replace"):
                kind = "b"
            if kind:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                out[f"{kind}:{d.name}"] = (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    return out


def open_app(url: str) -> ms.App:
    return _scale_app.register(ms.App(url))


def throughput(res: Resources, backend: str, k: int, runs: int, steps: int) -> dict[str, Any]:
    """``runs`` runs of ``steps`` steps submitted, then ``k`` workers: time to all succeeded."""
    url, procs = res.database(backend), []
    app = open_app(url)
    try:
        for _ in range(runs):
            app.submit("steps", steps)
        procs = res.start(url, k)
        db = url.rsplit("/", 1)[1] if backend == "postgresql" else None
        c0, t0 = cpu(procs, db), time.perf_counter()
        res.go()
        res.until(lambda: app.store.count_runs().get("succeeded", 0) >= runs, procs, 0.02, 600)
        sec, c1 = time.perf_counter() - t0, cpu(procs, db)
    finally:
        res.stop(procs)
        app.close()
    cores = {g: sum(v - c0.get(n, 0) for n, v in c1.items() if n[:2] == g + ":") for g in "wb"}
    busy = (c1["busy"] - c0["busy"]) / (c1["total"] - c0["total"]) * (os.cpu_count() or 1)
    rates = {"steps_per_s": runs * steps / sec, "runs_per_s": runs / sec, "cores_busy": busy}
    return {
        "seconds": sec,
        **rates,
        "worker_cores": cores["w"] / sec,
        "backend_cores": cores["b"] / sec,
    }


class CountingPG(PostgresStore):
    """A PostgresStore counting its journal commits."""

    commits = 0

    def commit(self, batch: Sequence[RunWrite], now: float) -> list[WriteResult]:
        self.commits += 1
        return super().commit(batch, now)


async def overhead(res: Resources, steps: int, repeat: int) -> dict[str, float]:
    """µs per step of ``await app.run(...)`` on PostgreSQL (median of ``repeat``)."""
    store = CountingPG(res.database("postgresql"))
    app = _scale_app.register(ms.App(store))
    samples: list[float] = []
    try:
        await app.run("steps", 20)  # warm-up
        for _ in range(repeat):
            store.commits, t0 = 0, time.perf_counter()
            await app.run("steps", steps)
            samples.append(time.perf_counter() - t0)
    finally:
        app.close()
    us = statistics.median(samples) / steps * 1e6
    return {"us_per_step": us, "commits_per_step": store.commits / steps}


def round_trips(res: Resources) -> dict[str, float]:
    """Round trips of one claim and of one one-step commit on PostgreSQL: the server's
    ReadyForQuery messages in libpq's trace (one per wait for an answer; untrace
    flushes the trace file)."""
    store = PostgresStore(res.database("postgresql"), min_size=1, max_size=1)
    trace = res.tmp / "trace.log"

    def counted(call: Callable[[], Any]) -> tuple[int, Any]:
        with trace.open("w") as f:
            with store._pool.connection() as conn:  # the pool's only connection
                conn.pgconn.trace(f.fileno())
            try:
                result = call()
            finally:
                with store._pool.connection() as conn:
                    conn.pgconn.untrace()
        return trace.read_text().count("ReadyForQuery"), result

    try:
        now = time.time()
        store.create_run(run_id="rt", workflow="rt", input="null", key=None, now=now)
        claim = {"worker": "rt", "now": now, "lease_s": 300.0, "limit": 1}
        claim_rt, [run] = counted(
            lambda: store.claim(**claim, workflows=None, max_recoveries=3)  # type: ignore[arg-type]
        )

        def step(seq: int) -> list[WriteResult]:
            row = StepRecord(run_id="rt", session=0, seq=seq, kind="step", name="noop",
                             status="completed", attempt=1, epoch=run.epoch, output="1",
                             started_at=now, finished_at=now)  # fmt: skip
            return store.commit([RunWrite(run_id="rt", epoch=run.epoch, steps=[row])], now)

        step(0)  # the upsert's first use (psycopg prepares it after a few)
        commit_rt, [ok] = counted(lambda: step(1))
        assert ok.ok, ok
    finally:
        store.close()
    return {"claim_rt": claim_rt, "commit_rt": commit_rt}


def limits(res: Resources, tx: int) -> dict[str, float]:
    """µs per one-INSERT transaction into a migrated ms_steps: pgbench (C), psycopg."""
    url = res.database("postgresql")
    PostgresStore(url).close()  # creates the schema
    script = res.tmp / "insert.sql"
    script.write_text(INSERT + ";\n")
    cmd = ["pgbench", "-f", str(script), "-c", "1", "-j", "1", "-t", str(tx), "-n", url]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    found = re.search(r"tps = ([\d.]+)", out)
    if found is None:
        raise RuntimeError(f"no tps in pgbench's output: {out[-300:]}")
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(20):
            conn.execute(INSERT)
        t0 = time.perf_counter()
        for _ in range(tx):
            conn.execute(INSERT)
        psy = (time.perf_counter() - t0) / tx * 1e6
    return {"pgbench_us": 1e6 / float(found.group(1)), "psycopg_us": psy}


def dbos(res: Resources, steps: int) -> dict[str, Any]:
    """The DBOS peer on a fresh PostgreSQL database (bench/.venv-peers)."""
    python = ensure_venv()
    cmd = [str(python), str(PEERS_DIR / "dbos_pg_steps.py"), "--steps", str(steps)]
    cmd += ["--url", res.database("postgresql")]
    proc = subprocess.run(cmd, cwd=res.tmp, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def pct(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=100, method="inclusive")
    return {"p50": q[49] * 1e3, "p95": q[94] * 1e3, "p99": q[98] * 1e3, "max": max(xs) * 1e3}


def latency(res: Resources, backend: str, signals: int, idle: int, gap: float) -> dict[str, Any]:
    """One worker; ``signals`` + ``idle`` runs wait for "go"; ``signals`` of them are
    signalled one at a time, after a random pause (uniform in [0, 2 × gap]: arrivals fall
    anywhere in the worker's poll cycle). Times from ``app.signal`` to the step after the
    wait (its ``time.time()``) and to the run's ``finished_at``, both on the worker's clock."""
    url, procs = res.database(backend), []
    app = open_app(url)
    pause = random.Random(7)
    send, resumed, done = [], [], []  # type: list[float], list[float], list[float]
    try:
        ids = [app.submit("waiter").run_id for _ in range(signals)]
        for _ in range(idle):
            app.submit("waiter")
        procs = res.start(url, 1)
        res.go()
        total = signals + idle
        res.until(lambda: app.store.count_runs().get("waiting", 0) >= total, procs, 0.05, 600)
        for rid in ids:
            time.sleep(pause.uniform(0, 2 * gap))
            t0 = time.time()
            app.signal(rid, "go")
            send.append(time.time() - t0)

            def finished(run_id: str = rid) -> bool:
                return app.get_run(run_id).finished

            res.until(finished, procs, 0.005, 30)
            run = app.get_run(rid)
            resumed.append(json.loads(run.output or "0") - t0)
            done.append((run.finished_at or 0) - t0)
    finally:
        res.stop(procs)
        app.close()
    return {"send_ms": pct(send), "resumed_ms": pct(resumed), "finished_ms": pct(done)}


def guard(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Tried twice (other users restart the shared server); then a row with the error."""
    for _ in range(2):
        try:
            return fn(*args)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    return {"error": error[:300]}


def measure(args: argparse.Namespace, res: Resources, log: Console) -> dict[str, Any]:
    r: dict[str, Any] = {"throughput": [], "latency": []}
    for backend in BACKENDS:
        for k in WORKERS:
            log.print(f"[dim]· throughput, {backend}, {k} worker(s)…")
            x = guard(throughput, res, backend, k, args.runs, args.run_steps)
            r["throughput"].append({"store": backend, "workers": k, **x})
    log.print("[dim]· step overhead on PostgreSQL, pgbench and psycopg limits…")
    r["overhead"] = {
        "mainspring": guard(lambda: asyncio.run(overhead(res, args.steps, args.repeat))),
        **guard(limits, res, args.pgbench_tx),
        **guard(round_trips, res),
    }
    if not args.no_peers:
        log.print("[dim]· peer DBOS on PostgreSQL…")
        r["overhead"]["dbos"] = guard(dbos, res, args.steps)
    for backend in BACKENDS:
        for idle in sorted({0, args.waiting}):
            log.print(f"[dim]· signal latency, {backend}, {args.signals + idle} waiting…")
            x = guard(latency, res, backend, args.signals, idle, args.gap)
            r["latency"].append({"store": backend, "waiting": args.signals + idle, **x})
    return r


# Per table: title, columns split on "|" (the first left-aligned), caption.
HEADS = [
    head.splitlines()
    for head in """
1. Worker processes: {runs} runs × {run_steps} trivial steps submitted first, then K workers
store|workers|seconds|steps/s|runs/s|× 1 worker|cores: machine|workers|PG backends
seconds: from "go" (all workers imported) to all runs succeeded; each worker --concurrency 64. \
cores (CPU s per s): machine: all of its {cores} (anyone's); workers: the K processes; \
PG backends: the server processes of this database (the workers' and this poller's)

2. Step overhead on PostgreSQL, {steps:,} trivial steps in one run
system|µs/step (or /transaction)|× pgbench limit|commits/step|DBOS ÷ mainspring
pgbench -c 1 -j 1 -t {pgbench_tx} -n into the ms_steps table; mainspring: median of {repeat}; \
same server, synchronous_commit=on; round trips (libpq trace): a one-step commit \
{commit_rt}, a claim {claim_rt}{errors}

3. Signal → resume, one worker, {signals} signals one at a time (random pauses, mean {gap} s)
store|wake-up|runs waiting|send p50 ms|resumed p50|p95|succeeded p50|p95|p99|max|p95 ms
ms from the call of app.signal; send: its own commit; resumed: the step after the wait runs; \
succeeded: the run's finished_at (the worker's clock at its last commit)
""".strip().split("\n\n")
]


def table(con: Console, n: int, rows: list[list[str]], **fields: Any) -> None:
    title, columns, note = (text.format(**fields) for text in HEADS[n - 1])
    t = Table(title=title, caption=note, title_justify="left", caption_justify="left")
    t.min_width = len(title)
    for i, col in enumerate(columns.split("|")):
        t.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*row) if row else t.add_section()
    con.print(t)


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a and b else ""


def render(r: dict[str, Any], con: Console) -> None:
    m, a, rows = r["machine"], r["args"], list[list[str]]()
    con.print(
        f"[bold]mainspring {ms.__version__}[/] · {m['cores']} cores (load {m['load']:.2f} at"
        f" start) · Python {m['python']}"
        f" · {m['postgres']} · SQLite {m['sqlite']} (synchronous=FULL) · {m['platform']}"
    )
    for x in r["throughput"]:
        one = next(y for y in r["throughput"] if y["store"] == x["store"] and y["workers"] == 1)
        rows += [[]] if x["workers"] == 1 and rows else []
        rows.append([x["store"], str(x["workers"])])
        if "error" in x:
            rows[-1].append(f"[red]{x['error'][:50]}")
            continue
        rows[-1] += [f"{x['seconds']:.2f}", f"{x['steps_per_s']:,.0f}", f"{x['runs_per_s']:,.1f}"]
        rows[-1] += [ratio(x["steps_per_s"], one.get("steps_per_s")) or "-"]
        rows[-1] += [f"{x[k]:.2f}" if x[k] else "-" for k in ("cores_busy", "worker_cores")]
        rows[-1] += [f"{x['backend_cores']:.2f}" if x["store"] == "postgresql" else "-"]
    table(con, 1, rows, cores=m["cores"], **a)
    o = r["overhead"]
    lim, mine, peer = o.get("pgbench_us"), o["mainspring"].get("us_per_step"), o.get("dbos")
    cps = o["mainspring"].get("commits_per_step", 0)
    entries = [
        ("pgbench: one INSERT per transaction (C, libpq)", lim, ""),
        ("psycopg: the same INSERT, autocommit", o.get("psycopg_us"), ""),
        ("mainspring: await app.run(...)", mine, f"{cps:.3f}"),
    ]
    if peer is not None:
        entries.append((f"DBOS {peer.get('version', '')}", peer.get("per_step_us"), ""))
    rows = [
        [name, f"{us:,.1f}" if us else "[red]failed", ratio(us, lim), c]
        + ([ratio(us, mine)] if name.startswith("DBOS") else [])
        for name, us, c in entries
    ]
    errors = [f"{k}: {v['error']}" for k, v in (("pgbench", o), ("mainspring", o["mainspring"]),
              ("DBOS", peer or {})) if "error" in v]  # fmt: skip
    trips = {k: o.get(k, "?") for k in ("commit_rt", "claim_rt")}
    table(con, 2, rows, errors="".join(f"\n[red]{e}" for e in errors), **trips, **a)
    rows = []
    for x in r["latency"]:
        pg = x["store"] == "postgresql"
        rows.append([x["store"], "LISTEN/NOTIFY" if pg else "polling 0.1 s", f"{x['waiting']:,}"])
        if "error" in x:
            rows[-1].append(f"[red]{x['error'][:50]}")
            continue
        s, d, target = x["resumed_ms"], x["finished_ms"], 50 if pg else 200
        ok = "[green]met[/]" if d["p95"] <= target else "[red]missed[/]"
        rows[-1] += [f"{v:.1f}" for v in (x["send_ms"]["p50"], s["p50"], s["p95"])]
        rows[-1] += [f"{d[k]:.1f}" for k in ("p50", "p95", "p99", "max")] + [f"≤ {target}: {ok}"]
    table(con, 3, rows, **a)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432", help="server URL")
    for name, default, _, text in OPTIONS:
        p.add_argument(
            f"--{name.replace('_', '-')}", type=type(default), default=default, help=text
        )
    p.add_argument("--quick", action="store_true", help="small sizes, no peers (~30 s)")
    p.add_argument("--no-peers", action="store_true", help="skip DBOS")
    p.add_argument("--json", action="store_true", help="JSON on stdout, tables on stderr")
    args = p.parse_args()
    for name, _, quick, _ in OPTIONS if args.quick else ():
        setattr(args, name, quick)
    args.no_peers |= args.quick
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that clean-up runs
    log, load = Console(stderr=True), os.getloadavg()[0]  # others' load skews every figure
    res = Resources(args.pg)
    try:
        result = measure(args, res, log)
    finally:
        res.close()
    result["args"] = {name: getattr(args, name) for name, *_ in OPTIONS}
    with psycopg.connect(f"{res.pg}/postgres") as conn:
        version = (conn.execute("SHOW server_version").fetchone() or ["?"])[0]
    result["machine"] = {"cores": os.cpu_count(), "python": platform.python_version(), "load": load}
    result["machine"] |= {"postgres": f"PostgreSQL {version}", "sqlite": sqlite3.sqlite_version}
    result["machine"]["platform"] = platform.platform(terse=True)
    con = Console(stderr=args.json)
    if not con.is_terminal:
        con.width = 160
    render(result, con)
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
