"""The HTTP API under load: submit latency and throughput, and signal → resume latency
with thousands of runs waiting.

A real ``uvicorn`` process serves ``create_app(app, webhooks=False)`` on 127.0.0.1; the
load comes from this process (``httpx.AsyncClient``). Printed beside each figure, measured
in the same run: the raw store (``store.create_run`` in a loop, no HTTP) and the HTTP
floor (a trivial POST endpoint on the same server, same client). A report: nothing is
asserted. ``python bench/api_load.py [--quick] [--pg DSN] [--no-pg]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

import mainspring as ms

HERE = Path(__file__).resolve()
# name, default, --quick value, help
OPTIONS = (
    ("clients", "1,8,32", "1,8", "concurrent HTTP clients, comma-separated"),
    ("seconds", 3.0, 1.5, "seconds of load per client count"),
    ("waiting", "1000,10000", "200,1000", "runs waiting when signals are sent"),
    ("signals", 150, 30, "signals sent one at a time, per waiting count"),
    ("gap", 0.03, 0.03, "mean pause in seconds between signals (uniform in [0, 2 gap])"),
)


# -- the workflows (imported again by the server and worker processes) --------------------


def stamp() -> float:
    """When the step after the wait ran (the worker's wall clock)."""
    return time.time()


async def noop(ctx: ms.RunContext, i: int = 0) -> int:
    """What POST /runs submits (no worker runs it while submissions are timed)."""
    return i


async def waiter(ctx: ms.RunContext) -> float:
    """Waits for the signal "go", then notes the time it resumed."""
    await ctx.wait_for("go")
    resumed: float = await ctx.step(stamp, name="resumed")
    return resumed


def make_app(url: str) -> ms.App:
    app = ms.App(url)
    app.workflow(noop)
    app.workflow(waiter)
    return app


def serve(url: str, port: int) -> None:
    """The server process: the API plus ``POST /floor``, a trivial endpoint."""
    import uvicorn
    from fastapi import Body

    from mainspring.server import create_app

    app = make_app(url)
    api = create_app(app, webhooks=False)

    @api.post("/floor", include_in_schema=False)
    def floor(body: dict[str, Any] = Body()) -> dict[str, str]:  # noqa: B008
        # A plain def, like the store's endpoints: same thread pool, no store, no key.
        return {"id": "0", "status": "queued"}

    uvicorn.run(api, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def work(url: str, concurrency: int) -> None:
    """The worker process; SIGTERM drains it."""
    app = make_app(url)
    worker = app.worker(concurrency=concurrency, shutdown_grace_s=2.0)

    async def main() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.request_stop)
        await worker.run()

    asyncio.run(main())


# -- processes and databases -----------------------------------------------------------------


class Resources:
    """Databases and processes of one run of the bench, all removed at the end."""

    def __init__(self, pg: str | None) -> None:
        self.pg = pg
        self.tmp = Path(tempfile.mkdtemp(prefix="ms-api-load-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pg_dbs: list[str] = []

    def database(self, backend: str) -> str:
        if backend == "sqlite":
            return f"sqlite:///{self.tmp / f'{uuid.uuid4().hex[:8]}.db'}"
        import psycopg

        assert self.pg is not None
        name = f"ms_api_load_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.pg, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.pg_dbs.append(name)
        return urlunsplit(urlsplit(self.pg)._replace(path=f"/{name}"))

    def spawn(self, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"proc{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, str(HERE), *args], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        proc.kill()  # a no-op once it has exited
        proc.wait()

    def close(self) -> None:
        for proc in self.procs:
            self.stop(proc)
        if self.pg_dbs:
            import psycopg

            with psycopg.connect(self.pg or "", autocommit=True) as conn:
                for name in self.pg_dbs:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        for f in self.tmp.iterdir():
            f.unlink()
        self.tmp.rmdir()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def until(done: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done after {timeout} s")
        time.sleep(0.05)


@contextlib.contextmanager
def server(res: Resources, url: str) -> Iterator[str]:
    port = free_port()
    proc = res.spawn("--role", "serve", "--url", url, "--port", str(port))
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        until(up, proc, 60)
        yield base
    finally:
        res.stop(proc)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(xs: list[float], *qs: int) -> dict[str, float]:
    if len(xs) < 2:
        return {f"p{q}": (xs[0] if xs else float("nan")) * 1e3 for q in qs}
    cut = statistics.quantiles(xs, n=100, method="inclusive")
    return {f"p{q}": cut[q - 1] * 1e3 for q in qs}


# -- measurements ---------------------------------------------------------------------------


def raw_inserts(url: str, seconds: float) -> float:
    """Runs per second of ``store.create_run`` in a loop: the store's own limit."""
    app = make_app(url)
    try:
        encoded = app.get_workflow("noop").encode_input((0,), {})
        store = app.store
        for _ in range(20):  # warm-up
            store.create_run(
                run_id=uuid.uuid4().hex, workflow="noop", input=encoded, key=None, now=time.time()
            )
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            store.create_run(
                run_id=uuid.uuid4().hex, workflow="noop", input=encoded, key=None, now=time.time()
            )
            n += 1
        return n / (time.perf_counter() - t0)
    finally:
        app.close()


async def http_load(
    base: str,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    clients: int,
    seconds: float,
) -> dict[str, Any]:
    """``clients`` tasks POSTing ``body`` back to back for ``seconds``."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    latencies: list[float] = []
    status: dict[int, int] = {}
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits, timeout=60) as c:
        await asyncio.gather(*(c.post(path, json=body) for _ in range(clients)))  # warm-up
        loop = asyncio.get_running_loop()
        stop = loop.time() + seconds

        async def client() -> None:
            while loop.time() < stop:
                t0 = time.perf_counter()
                response = await c.post(path, json=body)
                latencies.append(time.perf_counter() - t0)
                status[response.status_code] = status.get(response.status_code, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    ok = sum(n for code, n in status.items() if 200 <= code < 300)
    return {"rps": ok / elapsed, "errors": sum(status.values()) - ok, **pct(latencies, 50, 99)}


def submit_load(res: Resources, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    raw = raw_inserts(res.database(backend), min(args.seconds, 2.0))
    url = res.database(backend)
    app = make_app(url)
    _, token = app.admin.create_key("bench", ["submit"])
    app.close()
    rows = []
    with server(res, url) as base:
        for clients in args.clients:
            floor = asyncio.run(
                http_load(
                    base, "/floor", {"workflow": "noop", "args": [1]}, {}, clients, args.seconds
                )
            )
            headers = {"Authorization": f"Bearer {token}"}
            body = {"workflow": "noop", "args": [1]}
            submit = asyncio.run(http_load(base, "/runs", body, headers, clients, args.seconds))
            rows.append({"clients": clients, "floor": floor, "submit": submit})
    return {"raw_rps": raw, "rows": rows}


def resume_latency(res: Resources, backend: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One worker process parks the runs; signals go over HTTP one at a time to random
    waiting runs; times are from the POST to the step after the wait."""
    url = res.database(backend)
    app = make_app(url)
    _, token = app.admin.create_key("bench", ["submit"])
    worker = res.spawn("--role", "work", "--url", url, "--concurrency", "200")
    rng = random.Random(7)
    rows = []
    try:
        with (
            server(res, url) as base,
            httpx.Client(
                base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30
            ) as client,
        ):
            until(lambda: Path(f"/proc/{worker.pid}").exists(), worker, 10)
            time.sleep(1.0)  # the worker has imported and polls
            rss_idle = rss_mb(worker.pid)
            waiting: list[str] = []
            for target in args.waiting:
                t0 = time.perf_counter()
                waiting += [app.submit("waiter").run_id for _ in range(target - len(waiting))]
                until(lambda n=target: app.store.count_runs().get("waiting", 0) >= n, worker, 600)
                parked_s = time.perf_counter() - t0
                rss_parked = rss_mb(worker.pid)
                post, resumed, journaled = [], [], []  # type: list[float], list[float], list[float]
                for _ in range(args.signals):
                    rid = waiting.pop(rng.randrange(len(waiting)))
                    time.sleep(rng.uniform(0, 2 * args.gap))
                    t0 = time.time()
                    r = client.post(f"/runs/{rid}/signals", json={"name": "go"})
                    post.append(time.time() - t0)
                    assert r.status_code == 202, r.text
                    until(lambda rid=rid: app.get_run(rid).finished, worker, 30)
                    run = app.get_run(rid)
                    step = next(s for s in app.store.load_steps(rid) if s.name == "resumed")
                    resumed.append(float(json.loads(run.output or "0")) - t0)
                    journaled.append((step.finished_at or 0) - t0)
                rows.append(
                    {
                        "waiting": target,
                        "parked_s": parked_s,
                        "rss_idle": rss_idle,
                        "rss_parked": rss_parked,
                        "rss_after": rss_mb(worker.pid),
                        "post": pct(post, 50, 95, 99),
                        "resumed": pct(resumed, 50, 95, 99),
                        "journaled": pct(journaled, 50, 95, 99),
                    }
                )
    finally:
        res.stop(worker)
        app.close()
    return rows


# -- the report -------------------------------------------------------------------------------


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    print("\n1. Submit: POST /runs (202) from N concurrent clients, one uvicorn process")
    print(f"   {args.seconds:g} s per row; floor = trivial POST on the same server and client;")
    print("   raw = store.create_run in a loop, no HTTP (one thread)\n")
    head = f"{'store':<8}{'clients':>8}{'runs/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}"
    head += f"{'floor/s':>9}{'floor p50':>10}{'raw/s':>8}{'×floor':>8}{'×raw':>7}"
    print(head)
    for backend, r in results["submit"].items():
        if "error" in r:
            print(f"{backend:<8} error: {r['error']}")
            continue
        for row in r["rows"]:
            s, f = row["submit"], row["floor"]
            print(
                f"{backend:<8}{row['clients']:>8}{s['rps']:>9.0f}{s['p50']:>9.1f}{s['p99']:>9.1f}"
                f"{s['errors']:>8}{f['rps']:>9.0f}{f['p50']:>10.1f}{r['raw_rps']:>8.0f}"
                f"{s['rps'] / f['rps']:>8.2f}{s['rps'] / r['raw_rps']:>7.2f}"
            )
    print("\n2. Signal → resume: POST /runs/{id}/signals to a random waiting run, one at a time;")
    print("   ms from the POST to the step after ctx.wait_for ran (resumed) and was journaled")
    print("   as completed (its finished_at); one worker process (concurrency 200), default")
    print(f"   App polling ({ms.App().poll_interval_s:g} s on SQLite; LISTEN/NOTIFY on")
    print("   PostgreSQL); worker RSS idle → with all runs parked → after the signals\n")
    head = f"{'store':<8}{'waiting':>8}{'park s':>8}{'POST p50':>9}{'resumed p50':>12}{'p95':>7}"
    head += f"{'journaled p50':>14}{'p95':>7}{'p99':>7}{'target p95':>11}{'RSS MB':>20}"
    print(head)
    for backend, rows in results["resume"].items():
        if isinstance(rows, dict):
            print(f"{backend:<8} error: {rows['error']}")
            continue
        target = 200 if backend == "sqlite" else 50
        for x in rows:
            j, rs = x["journaled"], x["resumed"]
            rss = f"{x['rss_idle']:.0f} → {x['rss_parked']:.0f} → {x['rss_after']:.0f}"
            print(
                f"{backend:<8}{x['waiting']:>8}{x['parked_s']:>8.1f}{x['post']['p50']:>9.1f}"
                f"{rs['p50']:>12.1f}{rs['p95']:>7.1f}{j['p50']:>14.1f}{j['p95']:>7.1f}"
                f"{j['p99']:>7.1f}{f'≤ {target}':>11}{rss:>20}"
            )


def guard(fn: Callable[..., Any], *a: Any) -> Any:
    try:
        return fn(*a)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: about a minute")
    p.add_argument(
        "--pg",
        default=os.environ.get("MAINSPRING_TEST_POSTGRES_DSN"),
        help="a PostgreSQL DSN (default: $MAINSPRING_TEST_POSTGRES_DSN)",
    )
    p.add_argument("--no-pg", action="store_true", help="SQLite only")
    for name, default, _, text in OPTIONS:
        p.add_argument(f"--{name}", type=type(default), default=None, help=f"{text} ({default})")
    p.add_argument("--role", choices=["serve", "work"], help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, default=64, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "serve":
        return serve(args.url, args.port)
    if args.role == "work":
        return work(args.url, args.concurrency)
    for name, default, quick, _ in OPTIONS:
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else default)
    args.clients = [int(c) for c in str(args.clients).split(",")]
    args.waiting = [int(c) for c in str(args.waiting).split(",")]
    backends = ["sqlite"] + ([] if args.no_pg or not args.pg else ["postgresql"])

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that clean-up runs
    load = os.getloadavg()
    print(
        f"mainspring {ms.__version__} HTTP API load; {os.cpu_count()} cores, load average"
        f" {load[0]:.2f} at start; Python {platform.python_version()}, SQLite"
        f" {sqlite3.sqlite_version} (synchronous=FULL); {', '.join(backends)}"
    )
    res = Resources(args.pg)
    results: dict[str, Any] = {"submit": {}, "resume": {}}
    t0 = time.perf_counter()
    try:
        for backend in backends:
            results["submit"][backend] = guard(submit_load, res, backend, args)
            results["resume"][backend] = guard(resume_latency, res, backend, args)
    finally:
        res.close()
    report(results, args)
    print(f"\n({time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.2f} at the end)")


if __name__ == "__main__":
    main()
