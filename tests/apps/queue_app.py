"""An App for the queue process tests: each step marks itself active in a ledger
file while it works, and the ledger keeps the most steps ever active at once in the
queue ("limited") and per queue key.

Reads MAINSPRING_DATABASE_URL (the store) and MAINSPRING_TEST_LEDGER (a SQLite file)
from the environment.
"""

from __future__ import annotations

import os
import sqlite3
import time

import mainspring as ms

app = ms.App(lease_s=5.0, poll_interval_s=0.02)
LIMITED = app.queues.add("limited", concurrency=2, per_key=1)
SERIAL = app.queues.add("serial", concurrency=1)
STEP_S = 0.05


def _ledger() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["MAINSPRING_TEST_LEDGER"], timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS active (run TEXT PRIMARY KEY, lane TEXT, key TEXT)")
    conn.execute("CREATE TABLE IF NOT EXISTS peak (what TEXT PRIMARY KEY, n INTEGER)")
    conn.execute("CREATE TABLE IF NOT EXISTS started (run TEXT PRIMARY KEY, pid INTEGER)")
    return conn


def _peak(conn: sqlite3.Connection, what: str, n: int) -> None:
    conn.execute(
        "INSERT INTO peak VALUES (?, ?) ON CONFLICT (what) DO UPDATE SET n = max(n, excluded.n)",
        (what, n),
    )


def work(run: str, lane: str, key: str | None) -> None:
    """Be active for a moment, counting who else is."""
    conn = _ledger()
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT OR REPLACE INTO active VALUES (?, ?, ?)", (run, lane, key))
        (n,) = conn.execute("SELECT count(*) FROM active WHERE lane = ?", (lane,)).fetchone()
        _peak(conn, lane, n)
        if key is not None:
            (same,) = conn.execute(
                "SELECT count(*) FROM active WHERE lane = ? AND key = ?", (lane, key)
            ).fetchone()
            _peak(conn, f"{lane}:per_key", same)
        conn.execute("INSERT OR IGNORE INTO started VALUES (?, ?)", (run, os.getpid()))
        conn.execute("COMMIT")
        time.sleep(STEP_S)
        conn.execute("DELETE FROM active WHERE run = ?", (run,))
    finally:
        conn.close()


@app.workflow
async def job(ctx: ms.RunContext, lane: str, key: str | None) -> str:
    await ctx.step(work, ctx.run_id, lane, key)
    return ctx.run_id
