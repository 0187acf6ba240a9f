"""Dashboard and trace under load: 10,000 runs in the store, one run of 1,000 steps.

Prints, in one run, the time to serve the dashboard's pages over real HTTP on
127.0.0.1 beside the physical floors measured in the same process: the store query
the page needs (no HTTP, no template) and a trivial endpoint on the same server (HTTP
alone). Ratios say what rendering and the API add.

    python bench/dashboard_load.py [--runs 10000] [--steps 1000] [--requests 40] [--pg DSN]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn

import mainspring as ms
from mainspring.server import create_app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _timed(fn: Callable[[], Any], n: int) -> list[float]:
    fn()  # warm up
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.95) - 1] * 1000


def seed(app: ms.App, runs: int, steps: int) -> str:
    """``runs`` runs in a realistic mix of statuses, and one run of ``steps`` steps."""

    @app.workflow
    async def long(ctx: ms.RunContext, n: int) -> int:
        for i in range(n):
            await ctx.step(lambda i=i: {"i": i, "payload": "x" * 200}, name=f"step-{i}")
        return n

    @app.workflow
    async def job(ctx: ms.RunContext, i: int) -> int:
        return i

    store = app.store
    now = time.time()
    statuses = ["succeeded"] * 7 + ["failed", "waiting", "queued"]
    with store._write() as cur:  # one transaction: seeding is not what is measured
        for i in range(runs):
            status = statuses[i % len(statuses)]
            cur.execute(
                "INSERT INTO ms_runs (id, workflow, status, input, created_at, updated_at,"
                " finished_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    f"run{i:06d}",
                    "job",
                    status,
                    f'{{"args":[{i}],"kwargs":{{}}}}',
                    now - runs + i,
                    now - runs + i,
                    now if status in ("succeeded", "failed") else None,
                ),
            )
    handle = app.submit(long, steps)
    asyncio.run(app.worker().run(until_idle=True))
    return handle.run_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=1_000)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--pg", help="a PostgreSQL DSN (a fresh database is best)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        url = args.pg or f"sqlite:///{Path(tmp) / 'dash.db'}"
        app = ms.App(url)
        t0 = time.perf_counter()
        long_run = seed(app, args.runs, args.steps)
        print(
            f"seeded {args.runs:,} runs + one of {args.steps:,} steps on {app.store.dialect}"
            f" in {time.perf_counter() - t0:.1f} s"
        )
        _, key = app.admin.create_key("bench", ["admin"])

        api = create_app(app, webhooks=False)

        @api.get("/floor", include_in_schema=False)
        def floor() -> dict[str, bool]:
            return {"ok": True}

        port = _free_port()
        server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="error"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)

        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, cookies={"mainspring_key": key}, timeout=30) as http:
            headers = {"Authorization": f"Bearer {key}"}

            def get(path: str) -> Callable[[], Any]:
                def call() -> None:
                    r = http.get(path, headers=headers)
                    assert r.status_code == 200, (path, r.status_code, r.text[:200])

                return call

            n = args.requests
            rows: list[tuple[str, list[float], list[float] | None]] = [
                ("HTTP floor: GET /floor", _timed(get("/floor"), n), None),
                (
                    "dashboard runs list, GET /ui/ (50 of 10k)",
                    _timed(get("/ui/"), n),
                    _timed(lambda: (app.list_runs(limit=50), app.store.count_runs()), n),
                ),
                (
                    "dashboard filtered, GET /ui/?status=waiting",
                    _timed(get("/ui/?status=waiting"), n),
                    _timed(lambda: app.list_runs(status="waiting", limit=50), n),
                ),
                (
                    "API list, GET /runs?limit=50",
                    _timed(get("/runs?limit=50"), n),
                    _timed(lambda: app.list_runs(limit=50), n),
                ),
                (
                    f"run page, {args.steps:,}-step run, GET /ui/runs/ID",
                    _timed(get(f"/ui/runs/{long_run}"), max(5, n // 4)),
                    _timed(lambda: app.store.load_steps(long_run), max(5, n // 4)),
                ),
                (
                    f"trace, {args.steps:,}-step run, app.observe.trace()",
                    _timed(lambda: app.observe.trace(long_run), max(5, n // 4)),
                    _timed(lambda: app.store.load_steps(long_run), max(5, n // 4)),
                ),
            ]
        server.should_exit = True
        thread.join(10)
        app.close()

    floor_p50 = _stats(rows[0][1])[0]
    print(f"\n{'what':<48} {'p50 ms':>8} {'p95 ms':>8}   beside it")
    for name, samples, query in rows:
        p50, p95 = _stats(samples)
        beside = ""
        if query is not None:
            q50 = _stats(query)[0]
            beside = f"the store query alone {q50:.2f} ms ({p50 / q50:.1f}×)"
            if name.startswith(("dashboard", "API", "run page")):
                beside += f"; HTTP floor {floor_p50:.2f} ms ({p50 / floor_p50:.1f}×)"
        print(f"{name:<48} {p50:8.2f} {p95:8.2f}   {beside}")
    if os.environ.get("CI"):
        print("\n(CI machine: figures are indicative only)")


if __name__ == "__main__":
    main()
