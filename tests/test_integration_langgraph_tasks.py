"""LangGraph ``@task`` calls inside a node on mainspring: each one's result is kept as it
completes, so a node run again (a retry of its step, or the run's resume after its
process died in the middle of the node) does not run the tasks it had completed, with
the StateGraph API and the functional API (``@entrypoint``) alike."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from _helpers import Crash, drain
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy
from typing_extensions import TypedDict

import mainspring as ms
from mainspring.integrations.langgraph import durable


class State(TypedDict):
    order: int
    done: list[str]


def _kept(app: ms.App, run_id: str, n: int) -> None:
    """Wait until ``n`` task results of the run are in the database (they are written
    as each task completes, off the node's path)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with app.store._read() as cur:
            cur.execute(
                "SELECT COUNT(DISTINCT checkpoint_id) FROM ms_checkpoint_writes"
                " WHERE thread_id = ? AND checkpoint_ns = '__mainspring_tasks__'",
                (run_id,),
            )
            if int(cur.fetchone()[0]) >= n:
                return
        time.sleep(0.02)
    raise AssertionError(f"{n} task result(s) of run {run_id} were never kept")


async def test_a_retried_node_does_not_run_its_completed_tasks_again(db_url: str) -> None:
    app = ms.App(db_url, poll_interval_s=0.02)
    calls: dict[str, int] = {"charge": 0, "notify": 0}

    @task
    def charge(order: int) -> str:
        calls["charge"] += 1
        return f"charged {order}"

    @task
    def notify(order: int) -> str:
        calls["notify"] += 1
        if calls["notify"] == 1:
            _kept(app, ms.current_step().run_id, 1)  # charge's result is in the database
            raise ConnectionError("the mail server hung up")
        return f"notified {order}"

    def pay(state: State) -> dict[str, Any]:
        first = charge(state["order"]).result()
        second = notify(state["order"]).result()
        return {"done": [first, second]}

    builder = StateGraph(State)
    builder.add_node("pay", pay, retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01))
    builder.add_edge(START, "pay")
    builder.add_edge("pay", END)
    flow = durable(app, builder.compile(), name="pay")

    run = app.submit(flow, {"order": 7, "done": []})
    await drain(app)
    assert (await run.result())["done"] == ["charged 7", "notified 7"]
    # The node ran twice (its step's two attempts); charge, completed in the first,
    # answered from the database in the second.
    assert calls == {"charge": 1, "notify": 2}
    [step] = [s for s in app.observe.steps(run.run_id) if s.name == "node:pay"]
    assert (step.attempt, step.status) == (2, "completed")


async def test_an_entrypoint_resumed_after_its_process_died_skips_completed_tasks(
    tmp_path: Path,
) -> None:
    """The functional API: the entrypoint is one node; the process dies between two of
    its tasks; the run's resume (another worker, after the lease) does not run the
    completed tasks again, and runs the rest once. A task called again with other
    arguments at the same place is not taken for the old one."""
    app = ms.App(f"sqlite:///{tmp_path / 'ms.db'}", poll_interval_s=0.02, lease_s=0.5)
    ran: list[str] = []
    died: list[str] = []

    @task
    def step_one(x: int) -> int:
        ran.append(f"one({x})")
        return x + 1

    @task
    def step_two(x: int) -> int:
        ran.append(f"two({x})")
        if not died:
            _kept(app, ms.current_step().run_id, 1)
            died.append(ms.current_step().idempotency_key)
            raise Crash
        return x * 10

    @task
    def step_three(x: int) -> int:
        ran.append(f"three({x})")
        return x - 1

    @entrypoint()
    def pipeline(x: int) -> int:
        a = step_one(x).result()
        b = step_two(a).result()
        return step_three(b).result()

    flow = durable(app, pipeline, name="pipeline")
    run = app.submit(flow, 4)
    await drain(app)
    assert app.get_run(run.run_id).status == "running"  # it died holding its lease
    await asyncio.sleep(0.7)
    await drain(app)
    assert await run.result() == 49
    assert ran == ["one(4)", "two(5)", "two(5)", "three(50)"]


async def test_a_task_called_with_other_arguments_at_the_same_place_runs(db_url: str) -> None:
    """The kept result belongs to the call's place and arguments: a node that asks
    something else on its next attempt gets a fresh answer, not the old one."""
    app = ms.App(db_url, poll_interval_s=0.02)
    seen: list[int] = []
    attempts: list[int] = []

    @task
    def double(x: int) -> int:
        seen.append(x)
        return 2 * x

    def node(state: State) -> dict[str, Any]:
        attempts.append(1)
        got = double(state["order"] + len(attempts)).result()
        if len(attempts) == 1:
            _kept(app, ms.current_step().run_id, 1)
            raise ConnectionError("once")
        return {"done": [str(got)]}

    builder = StateGraph(State)
    builder.add_node("n", node, retry_policy=RetryPolicy(max_attempts=2, initial_interval=0.01))
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    flow = durable(app, builder.compile(), name="args")
    run = app.submit(flow, {"order": 1, "done": []})
    await drain(app)
    assert (await run.result())["done"] == ["6"]
    assert seen == [2, 3]


async def test_a_worker_that_lost_the_run_keeps_no_task_result(db_url: str) -> None:
    """The worker's write of a task's result stalls past its lease and another worker
    takes the run over meanwhile: the stale write lands at the old epoch and is refused
    (the run's new holder owns what is kept), and the run's new execution runs the task
    itself and keeps its own result."""
    from mainspring.integrations.langgraph._serde import decode_typed
    from mainspring.storage import open_store
    from mainspring.testing import Fault, FaultyStore

    inner = open_store(db_url)
    clock = ms.FakeClock()

    def takeover() -> None:  # inside the stalled write, before it reaches the database
        clock.advance(10.0 + 1)
        [taken] = inner.claim(
            worker="other", now=clock.now(), lease_s=10.0, limit=1, workflows=None,
            max_recoveries=5,
        )  # fmt: skip
        assert taken.owner == "other"

    store = FaultyStore(
        inner, [Fault(kind="delay", method="put_checkpoint_writes", delay_s=0.0, during=takeover)]
    )
    app = ms.App(store, clock=clock, lease_s=10.0, poll_interval_s=0.01)
    ran: list[str] = []

    @task
    def charge(order: int) -> str:
        ran.append("charge")
        return f"charged {order} ({len(ran)})"

    def pay(state: State) -> dict[str, Any]:
        return {"done": [charge(state["order"]).result()]}

    builder = StateGraph(State)
    builder.add_node("pay", pay)
    builder.add_edge(START, "pay")
    builder.add_edge("pay", END)
    flow = durable(app, builder.compile(), name="stale-pay")

    def kept(run_id: str) -> list[Any]:
        with inner._read() as cur:
            cur.execute(
                "SELECT value FROM ms_checkpoint_writes WHERE thread_id = "
                + ("%s" if inner.dialect == "postgres" else "?")
                + " AND checkpoint_ns = '__mainspring_tasks__'",
                (run_id,),
            )
            return [decode_typed(row[0]) for row in cur.fetchall()]

    try:
        run = app.submit(flow, {"order": 3, "done": []})
        await asyncio.wait_for(app.worker().run(until_idle=True), 30)
        record = inner.get_run(run.run_id)
        assert record is not None and (record.status, record.owner) == ("running", "other")
        assert [c.method for c in store.injected] == ["put_checkpoint_writes"]
        assert ran == ["charge"]
        assert kept(run.run_id) == []  # the stale worker's result was refused

        clock.advance(10.0 + 1)  # "other" never ran it: its lease runs out in turn
        await asyncio.wait_for(app.worker().run(until_idle=True), 30)
        assert (await run.result())["done"] == ["charged 3 (2)"]
        assert ran == ["charge", "charge"]
        assert kept(run.run_id) == ["charged 3 (2)"]
    finally:
        app.close()
        inner.close()
