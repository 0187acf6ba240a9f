"""An App for the queue process tests: each step marks itself active in a ledger
file while it works, and the ledger keeps the most ever active at once, per queue
key and in all.

Reads MAINSPRING_DATABASE_URL (the store) and MAINSPRING_TEST_LEDGER (a SQLite file)
from the environment.
"""

from __future__ import annotations

import os
import sqlite3
import time

import mainspring as ms

app = ms.App(lease_s=5.0, poll_interval_s=0.02)
LIMITED = app.queue("limited", concurrency=2, per_key=1)
STEP_S = 0.05


def _ledger() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["MAINSPRING_TEST_LEDGER"], timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS active (run TEXT PRIMARY KEY, key TEXT, pid INTEGER)")
    conn.execute("CREATE TABLE IF NOT EXISTS peak (what TEXT PRIMARY KEY, n INTEGER)")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS started (run TEXT PRIMARY KEY, priority INTEGER, seq INTEGER)"
    )
    return conn


def _peak(conn: sqlite3.Connection, what: str, n: int) -> None:
    conn.execute(
        "INSERT INTO peak VALUES (?, ?) ON CONFLICT (what) DO UPDATE SET n = max(n, excluded.n)",
        (what, n),
    )


def work(run: str, key: str | None, priority: int) -> None:
    conn = _ledger()
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT OR REPLACE INTO active VALUES (?, ?, ?)", (run, key, os.getpid()))
        (total,) = conn.execute("SELECT count(*) FROM active").fetchone()
        _peak(conn, "total", total)
        if key is not None:
            (same,) = conn.execute("SELECT count(*) FROM active WHERE key = ?", (key,)).fetchone()
            _peak(conn, "per_key", same)
        (pids,) = conn.execute("SELECT count(DISTINCT pid) FROM active").fetchone()
        _peak(conn, "processes", pids)
        conn.execute(
            "INSERT OR IGNORE INTO started SELECT ?, ?, count(*) FROM started", (run, priority)
        )
        conn.execute("COMMIT")
        time.sleep(STEP_S)
        conn.execute("DELETE FROM active WHERE run = ?", (run,))
    finally:
        conn.close()


@app.workflow
async def job(ctx: ms.RunContext, key: str | None, priority: int) -> str:
    await ctx.step(work, ctx.run_id, key, priority)
    return ctx.run_id
