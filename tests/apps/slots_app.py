"""An App for the queue-slot test: runs of several steps in a queue of two; each step
records its start (run, step, pid, time) and marks its run active while it works, and
the ledger keeps the most runs ever active at once.

Reads MAINSPRING_DATABASE_URL (the store), MAINSPRING_TEST_LEDGER (a SQLite file) and
MAINSPRING_TEST_LEASE_S from the environment.
"""

from __future__ import annotations

import os
import sqlite3
import time

import mainspring as ms

app = ms.App(lease_s=float(os.environ.get("MAINSPRING_TEST_LEASE_S", "1.5")), poll_interval_s=0.02)
PAIR = app.queues.add("pair", concurrency=2)
STEP_S = float(os.environ.get("MAINSPRING_TEST_STEP_S", "0.4"))


def ledger() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["MAINSPRING_TEST_LEDGER"], timeout=60, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")  # readers never wait for a frozen writer
    conn.execute("CREATE TABLE IF NOT EXISTS active (run TEXT PRIMARY KEY, pid INTEGER)")
    conn.execute("CREATE TABLE IF NOT EXISTS peak (what TEXT PRIMARY KEY, n INTEGER)")
    conn.execute("CREATE TABLE IF NOT EXISTS starts (run TEXT, seq INTEGER, pid INTEGER, at REAL)")
    return conn


def work(run: str, seq: int) -> None:
    """Be active for a moment, counting the runs that are too."""
    conn = ledger()
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO starts VALUES (?, ?, ?, ?)", (run, seq, os.getpid(), time.time()))
        conn.execute("INSERT OR REPLACE INTO active VALUES (?, ?)", (run, os.getpid()))
        (n,) = conn.execute("SELECT count(*) FROM active").fetchone()
        conn.execute(
            "INSERT INTO peak VALUES ('pair', ?) ON CONFLICT (what)"
            " DO UPDATE SET n = max(n, excluded.n)",
            (n,),
        )
        conn.execute("COMMIT")
        time.sleep(STEP_S)
        conn.execute("DELETE FROM active WHERE run = ? AND pid = ?", (run, os.getpid()))
    finally:
        conn.close()


@app.workflow
async def job(ctx: ms.RunContext, steps: int) -> int:
    for i in range(steps):
        await ctx.step(work, ctx.run_id, i)
    return steps
