"""Time one LangGraph run of N super-steps checkpointed by SqliteSaver on a fresh file.

Run by the peer venv's python; prints one line of JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import operator
import sqlite3
import time
from contextlib import closing
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Durability


class State(TypedDict):
    """Loop counter, target and (with --state-kb-per-step) the growing payload list."""

    n: int
    target: int
    kb: int
    items: Annotated[list[str], operator.add]


Graph = CompiledStateGraph[State, None, State, State]
SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def parse_args() -> argparse.Namespace:
    """Parse the shared peer CLI."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--sync", choices=["FULL", "NORMAL", "OFF"], default="FULL")
    p.add_argument("--state-kb-per-step", type=int, default=0)
    # "sync" persists each checkpoint before the next step, the durable-execution contract;
    # LangGraph's default "async" overlaps the write with the next step.
    p.add_argument("--durability", choices=["sync", "async", "exit"], default="sync")
    return p.parse_args()


def step(state: State) -> dict[str, Any]:
    """One super-step: bump the counter, maybe append a kb-sized string."""
    i = state["n"]
    items = [f"{i:08d}".ljust(1024 * state["kb"], "x")] if state["kb"] else []
    return {"n": i + 1, "items": items}


def again(state: State) -> str:
    """Loop back to `step` until the counter reaches the target."""
    return "step" if state["n"] < state["target"] else END


def build(saver: SqliteSaver) -> Graph:
    """Compile the single self-looping node graph."""
    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", again, ["step", END])
    return g.compile(checkpointer=saver)


def run(graph: Graph, thread: str, n: int, kb: int, durability: Durability) -> None:
    """Invoke the graph for n super-steps on its own thread_id."""
    config: RunnableConfig = {"configurable": {"thread_id": thread}, "recursion_limit": n + 10}
    graph.invoke({"n": 0, "target": n, "kb": kb, "items": []}, config, durability=durability)


def db_bytes(db: Path) -> int:
    """Size of the database file plus -wal, after a truncating checkpoint."""
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    files = [db, Path(f"{db}-wal"), Path(f"{db}-journal")]
    return sum(f.stat().st_size for f in files if f.exists())


def main() -> None:
    """Set up the saver, warm up, time one run, print JSON."""
    args = parse_args()
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{args.db}{suffix}").unlink(missing_ok=True)
    conn = sqlite3.connect(args.db, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={args.sync}")
    saver = SqliteSaver(conn)
    saver.setup()
    graph = build(saver)

    run(graph, "warmup", 5, 0, args.durability)
    t0 = time.perf_counter()
    run(graph, "bench", args.steps, args.state_kb_per_step, args.durability)
    seconds = time.perf_counter() - t0

    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
    conn.close()
    result = {
        "peer": "langgraph",
        "version": version("langgraph"),
        "checkpoint_sqlite_version": version("langgraph-checkpoint-sqlite"),
        "steps": args.steps,
        "seconds": round(seconds, 6),
        "per_step_us": round(seconds / args.steps * 1e6, 2),
        "sqlite_synchronous": SYNC_NAMES.get(sync, str(sync)),
        "journal_mode": str(journal).upper(),
        "durability": args.durability,
        "db_bytes": db_bytes(args.db),
        "state_kb_per_step": args.state_kb_per_step,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
