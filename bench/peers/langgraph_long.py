"""Per-step cost deep into one LangGraph thread that pauses after every step.

The peer of ``bench/long_run.py``. The graph has two nodes in a loop: ``work`` (the step:
bump a counter) and ``pause``, which calls ``interrupt()``. Every ``invoke`` ends at the
interrupt, with the checkpoint written (SqliteSaver, ``durability="sync"``, WAL); the
driver then resumes the thread with a fresh ``invoke(Command(resume=i))``, which loads
the latest checkpoint and runs ``pause`` to its end, then ``work`` and ``pause`` again:
a checkpoint and a resume per step. The process stays up between resumes (no import or
connection cost), as a worker would.

Run by the peer venv's python: ``langgraph_long.py --db FILE --marks 50,1000,5000
--window 200 --sync NORMAL``. Per-step cost at each mark over the ``window`` steps after
it, as ``bench/long_run.py`` measures mainspring (``run_peers.per_step_us``). Prints one
line of JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt
from run_peers import per_step_us

SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
stamps: list[float] = []  # perf_counter at each step call
cpu: list[float] = []  # process_time at each step call


class State(TypedDict):
    """The step counter and the last value the driver resumed with."""

    n: int
    resumed: int


Graph = CompiledStateGraph[State, None, State, State]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--marks", default="50,1000,5000", help="steps at which to measure")
    p.add_argument("--window", type=int, default=200, help="steps measured at each mark")
    p.add_argument("--sync", choices=["FULL", "NORMAL", "OFF"], default="NORMAL")
    return p.parse_args()


def work(state: State) -> dict[str, Any]:
    """The step: note when it ran, bump the counter."""
    stamps.append(time.perf_counter())
    cpu.append(time.process_time())
    return {"n": state["n"] + 1}


def pause(state: State) -> dict[str, Any]:
    """Suspend the thread until the driver resumes it with ``Command(resume=...)``."""
    return {"resumed": interrupt(state["n"])}


def build(saver: SqliteSaver) -> Graph:
    g = StateGraph(State)
    g.add_node("work", work)
    g.add_node("pause", pause)
    g.add_edge(START, "work")
    g.add_edge("work", "pause")
    g.add_edge("pause", "work")
    return g.compile(checkpointer=saver)


def main() -> None:
    args = parse_args()
    marks = [int(m) for m in args.marks.split(",")]
    total = max(marks) + args.window + 2
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{args.db}{suffix}").unlink(missing_ok=True)
    conn = sqlite3.connect(args.db, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={args.sync}")
    saver = SqliteSaver(conn)
    saver.setup()
    graph = build(saver)
    config: RunnableConfig = {"configurable": {"thread_id": "long"}}

    t0 = time.perf_counter()
    out = graph.invoke({"n": 0, "resumed": -1}, config, durability="sync")
    while len(stamps) < total:
        if "__interrupt__" not in out:
            raise RuntimeError(f"the graph did not pause at step {len(stamps)}: {out!r}")
        out = graph.invoke(Command(resume=len(stamps)), config, durability="sync")
    seconds = time.perf_counter() - t0
    state = graph.get_state(config).values
    if state["n"] != len(stamps) or state["resumed"] != len(stamps) - 1:
        raise RuntimeError(f"the checkpointed state is off: {state!r}, {len(stamps)} steps")
    checkpoints = conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
    conn.close()
    result = {
        "peer": "langgraph",
        "version": version("langgraph"),
        "checkpoint_sqlite_version": version("langgraph-checkpoint-sqlite"),
        "wait": "interrupt() + invoke(Command(resume=...))",
        "steps": len(stamps),
        "seconds": round(seconds, 3),
        "checkpoints": checkpoints,
        "marks": marks,
        "window": args.window,
        "per_step": {str(m): per_step_us(stamps, cpu, m, args.window) for m in marks},
        "sqlite_synchronous": SYNC_NAMES.get(sync, str(sync)),
        "journal_mode": str(journal).upper(),
        "durability": "sync",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
