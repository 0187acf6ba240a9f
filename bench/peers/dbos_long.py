"""Per-step cost deep into one DBOS workflow that waits durably after every step.

The peer of ``bench/long_run.py``. One workflow runs a ``@DBOS.step()`` and then waits,
forever, in one of DBOS's two documented durable waits (``--wait``):

- ``recv``: ``DBOS.recv("go")`` for a message the driver sends with ``DBOS.send`` once
  the workflow is waiting (a hook on the system database's ``recv_setup`` says when: the
  recv has registered its waiter, found no message and recorded its timeout). On SQLite
  a waiting recv is woken by DBOS's notification poller, here at its documented minimum
  interval (``notification_listener_polling_interval_sec``, ``--poll`` 0.001 s); the
  wall time per step includes that wake-up latency. DBOS marks a received message
  consumed and keeps it, and its index on notifications, (destination_uuid, topic), does
  not cover ``consumed``: each check for a new message reads the workflow's old ones, so
  recv's cost grows with the messages a workflow has received.
- ``sleep``: ``DBOS.sleep(1e-6)``, a durable sleep (its end time is recorded, then the
  thread sleeps); mainspring's sleeps are due at once, DBOS cannot be told so.

Either way the wait blocks the workflow's thread: DBOS keeps the workflow in memory
while it waits and continues it there, it never suspends the run to the database and
resumes it from the journal (it replays only on recovery, after a crash). That is the
cost compared with mainspring's sticky executions, not a replay per step.

Run by the peer venv's python: ``dbos_long.py --db FILE --marks 50,1000,5000 --window
200 --sync NORMAL [--wait recv|sleep] [--wal]``. Per-step cost at each mark over the
``window`` steps after it, as ``bench/long_run.py`` measures mainspring
(``run_peers.per_step_us``). Prints one line of JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import threading
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, DBOSConfig
from run_peers import per_step_us

SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
SLEEP_S = 1e-6  # DBOS.sleep records nothing for 0
stamps: list[float] = []  # perf_counter at each step call
cpu: list[float] = []  # process_time at each step call (all threads of the process)
waiting = threading.Event()  # set when the workflow's recv waits for its message


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--marks", default="50,1000,5000", help="steps at which to measure")
    p.add_argument("--window", type=int, default=200, help="steps measured at each mark")
    p.add_argument("--sync", choices=["FULL", "NORMAL", "OFF"], default="NORMAL")
    p.add_argument("--wait", choices=["recv", "sleep"], default="recv", help="the durable wait")
    p.add_argument("--poll", type=float, default=0.001, help="notification poll interval, s")
    p.add_argument("--wal", action="store_true", help="force WAL (DBOS leaves the default)")
    return p.parse_args()


@DBOS.step()
def tick(i: int) -> int:
    """The step: note when it ran."""
    stamps.append(time.perf_counter())
    cpu.append(time.process_time())
    return i


@DBOS.workflow()
def long_wf(n: int, wait: str) -> int:
    """n steps, each followed by a durable wait."""
    for i in range(n):
        tick(i)
        if wait == "sleep":
            DBOS.sleep(SLEEP_S)
            continue
        got = DBOS.recv("go", timeout_seconds=60)
        if got != i:
            raise RuntimeError(f"step {i}: recv returned {got!r} (timed out?)")
    return n


def drive(dbos: DBOS, n: int, wait: str) -> None:
    """Run the workflow to its end; with recv, send each message once it waits."""
    if wait == "sleep":
        long_wf(n, wait)
        return
    sys_db = dbos._sys_db
    setup = sys_db.recv_setup

    def recv_setup(*args: Any, **kwargs: Any) -> Any:
        result = setup(*args, **kwargs)
        waiting.set()
        return result

    sys_db.recv_setup = recv_setup  # type: ignore[method-assign]
    handle = DBOS.start_workflow(long_wf, n, wait)
    for i in range(n):
        if not waiting.wait(60):
            raise RuntimeError(f"the workflow never waited after step {i}")
        waiting.clear()
        DBOS.send(handle.get_workflow_id(), i, "go")
    if handle.get_result() != n:
        raise RuntimeError("the workflow returned a wrong count")


def main() -> None:
    args = parse_args()
    marks = [int(m) for m in args.marks.split(",")]
    total = max(marks) + args.window + 2
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{args.db}{suffix}").unlink(missing_ok=True)

    # DBOS exposes no pragma option; a class-level listener reaches the engine it creates.
    @sa.event.listens_for(sa.engine.Engine, "connect")
    def _pragmas(dbapi_conn: sqlite3.Connection, _record: object) -> None:
        if args.wal:
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute(f"PRAGMA synchronous={args.sync}")

    logging.getLogger("dbos").setLevel(logging.WARNING)
    config: DBOSConfig = {
        "name": "mainspring-bench-long",
        "system_database_url": f"sqlite:///{args.db}",
        "log_level": "WARNING",
        "notification_listener_polling_interval_sec": args.poll,
    }
    dbos = DBOS(config=config)
    DBOS.launch()
    try:
        t0 = time.perf_counter()
        drive(dbos, total, args.wait)
        seconds = time.perf_counter() - t0
        with dbos._sys_db.engine.connect() as conn:
            sync = conn.exec_driver_sql("PRAGMA synchronous").scalar_one()
            journal = conn.exec_driver_sql("PRAGMA journal_mode").scalar_one()
    finally:
        DBOS.destroy()
    result = {
        "peer": "dbos",
        "version": version("dbos"),
        "wait": {"recv": "DBOS.send + DBOS.recv", "sleep": f"DBOS.sleep({SLEEP_S:g})"}[args.wait],
        "poll_s": args.poll,
        "steps": len(stamps),
        "seconds": round(seconds, 3),
        "marks": marks,
        "window": args.window,
        "per_step": {str(m): per_step_us(stamps, cpu, m, args.window) for m in marks},
        "sqlite_synchronous": SYNC_NAMES.get(sync, str(sync)),
        "journal_mode": str(journal).upper(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
