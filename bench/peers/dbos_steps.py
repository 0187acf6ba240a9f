"""Time one DBOS workflow of N trivial steps on a fresh SQLite system database.

Run by the peer venv's python; prints one line of JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import time
from contextlib import closing
from importlib.metadata import version
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, DBOSConfig

SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def parse_args() -> argparse.Namespace:
    """Parse the shared peer CLI."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--sync", choices=["FULL", "NORMAL", "OFF"], default="FULL")
    p.add_argument("--state-kb-per-step", type=int, default=0)
    p.add_argument("--wal", action="store_true", help="force WAL (DBOS leaves the default)")
    return p.parse_args()


@DBOS.step()
def step(i: int, kb: int) -> int | str:
    """A trivial step: the index, or a kb-sized string."""
    return f"{i:08d}".ljust(1024 * kb, "x") if kb else i


@DBOS.workflow()
def run_steps(n: int, kb: int) -> int:
    """Run n steps; with kb > 0 keep their outputs in a growing list."""
    acc: list[Any] = []
    for i in range(n):
        out = step(i, kb)
        if kb:
            acc.append(out)
    return len(acc)


def db_bytes(db: Path) -> int:
    """Size of the database file plus -wal / -journal, after a truncating checkpoint."""
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    files = [db, Path(f"{db}-wal"), Path(f"{db}-journal")]
    return sum(f.stat().st_size for f in files if f.exists())


def main() -> None:
    """Launch DBOS, warm up, time one workflow, print JSON."""
    args = parse_args()
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{args.db}{suffix}").unlink(missing_ok=True)

    # DBOS exposes no pragma option; a class-level listener reaches the engine it creates
    # and runs alongside DBOS's own per-engine connect listener.
    @sa.event.listens_for(sa.engine.Engine, "connect")
    def _pragmas(dbapi_conn: sqlite3.Connection, _record: object) -> None:
        if args.wal:
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute(f"PRAGMA synchronous={args.sync}")

    logging.getLogger("dbos").setLevel(logging.WARNING)
    config: DBOSConfig = {
        "name": "mainspring-bench",
        "system_database_url": f"sqlite:///{args.db}",
        "log_level": "WARNING",
    }
    dbos = DBOS(config=config)
    DBOS.launch()
    try:
        run_steps(5, 0)  # warm-up
        t0 = time.perf_counter()
        run_steps(args.steps, args.state_kb_per_step)
        seconds = time.perf_counter() - t0
        with dbos._sys_db.engine.connect() as conn:
            sync = conn.exec_driver_sql("PRAGMA synchronous").scalar_one()
            journal = conn.exec_driver_sql("PRAGMA journal_mode").scalar_one()
    finally:
        DBOS.destroy()
    result = {
        "peer": "dbos",
        "version": version("dbos"),
        "steps": args.steps,
        "seconds": round(seconds, 6),
        "per_step_us": round(seconds / args.steps * 1e6, 2),
        "sqlite_synchronous": SYNC_NAMES.get(sync, str(sync)),
        "journal_mode": str(journal).upper(),
        "db_bytes": db_bytes(args.db),
        "state_kb_per_step": args.state_kb_per_step,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
