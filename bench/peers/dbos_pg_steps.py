"""Time one DBOS workflow of N trivial steps with its system database on PostgreSQL.

Run by the peer venv's python with ``--url postgresql://...`` naming a fresh database (the
caller creates and drops it); prints one line of JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from importlib.metadata import version

from dbos import DBOS, DBOSConfig


@DBOS.step()
def step(i: int) -> int:
    """A trivial step."""
    return i


@DBOS.workflow()
def run_steps(n: int) -> int:
    """Run n trivial steps."""
    for i in range(n):
        step(i)
    return n


def main() -> None:
    """Launch DBOS on the database, warm up, time one workflow, print JSON."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--url", required=True, help="postgresql://user@host:port/dbname")
    args = p.parse_args()
    logging.getLogger("dbos").setLevel(logging.WARNING)
    config: DBOSConfig = {
        "name": "mainspring-bench",
        "system_database_url": args.url,
        "log_level": "WARNING",
    }
    dbos = DBOS(config=config)
    DBOS.launch()
    try:
        run_steps(20)  # warm-up
        t0 = time.perf_counter()
        run_steps(args.steps)
        seconds = time.perf_counter() - t0
        with dbos._sys_db.engine.connect() as conn:
            sync = conn.exec_driver_sql("SHOW synchronous_commit").scalar_one()
    finally:
        DBOS.destroy()
    result = {
        "peer": "dbos",
        "version": version("dbos"),
        "steps": args.steps,
        "seconds": round(seconds, 6),
        "per_step_us": round(seconds / args.steps * 1e6, 2),
        "synchronous_commit": sync,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
