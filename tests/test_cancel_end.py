"""A run's end and its cancel: a cancel answered "asked" is honoured by the finish.

``app.cancel`` of a running run answers ``running`` (asked) and marks the run; its
children are cancelled at once by the cascade. Before, the run could still commit
``succeeded`` afterwards (a cancel asked during its last step): the finish wrote its
result over the request and cleared the cancel's error, while its children had been
cancelled "because the parent was cancelled" and the webhooks said ``succeeded``.
Now the finish reads the request under the fence and ends the run ``cancelled``; only
a finish that committed before the cancel keeps its result (and the cancel says so).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator

import pg
import pytest

import mainspring as ms
from mainspring.storage import RunTransition, RunWrite, StepRecord, Store, open_store
from mainspring.testing import Fault, FaultyStore, check_invariants


@pytest.fixture
def app(db_url: str) -> Iterator[ms.App]:
    application = ms.App(db_url, poll_interval_s=0.02)
    application.store.add_webhook("http://127.0.0.1:9/hook", time.time())
    yield application
    application.close()


def _events(app: ms.App, run_id: str) -> list[str]:
    return [o["event"] for o in app.store.outbox(run_id) if o["event"] != "run.waiting"]


@pytest.mark.parametrize("last", ["returns", "raises"])
async def test_a_cancel_asked_during_the_last_step_ends_the_run_cancelled(
    app: ms.App, last: str
) -> None:
    answers: list[str] = []

    @app.workflow
    async def helper(ctx: ms.RunContext) -> str:
        return str(await ctx.wait_for("never"))

    def final() -> str:
        # The cancel comes while the last step runs: asked, not yet carried out.
        answers.append(app.cancel(ms.current_step().run_id, "stop now"))
        if last == "raises":
            raise ValueError("the last step fails too")
        return "the result"

    @app.workflow
    async def parent(ctx: ms.RunContext) -> str:
        await ctx.start_child(helper)
        return await ctx.step(final, retry=ms.RetryPolicy.never())

    run_id = app.submit(parent).run_id
    worker = app.worker()
    await asyncio.wait_for(worker.run(until_idle=True), 30)

    assert answers == ["running"]
    run = app.get_run(run_id)
    assert (run.status, run.output) == ("cancelled", None)
    assert json.loads(run.error or "null")["message"] == "stop now"
    [child] = app.children(run_id)
    assert child.status == "cancelled"
    # The parent is announced as it ended, once; the journal still says the step ran.
    assert _events(app, run_id) == ["run.cancelled"]
    last_row = app.store.load_steps(run_id)[-1]
    assert last_row.status == ("completed" if last == "returns" else "failed")
    assert worker.stats.outcomes.get("cancelled", 0) >= 1
    assert "succeeded" not in worker.stats.outcomes and "failed" not in worker.stats.outcomes
    assert check_invariants(app.store) == []


async def test_a_finish_that_commits_first_keeps_its_result(app: ms.App) -> None:
    @app.workflow
    async def quick(ctx: ms.RunContext) -> str:
        return "done"

    run_id = app.submit(quick).run_id
    await asyncio.wait_for(app.worker().run(until_idle=True), 30)
    assert app.cancel(run_id, "late") == "succeeded"  # too late, and it says so
    run = app.get_run(run_id)
    assert (run.status, run.output, run.error) == ("succeeded", '"done"', None)


# -- the store: a finish commit honours a cancel asked before it -------------------------


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = open_store(db_url)
    yield s
    s.close()


def _claimed(store: Store, run_id: str) -> int:
    store.create_run(run_id=run_id, workflow="wf", input="null", key=None, now=time.time())
    [run] = store.claim(
        worker="w", now=time.time(), lease_s=60, limit=1, workflows=None,
        max_recoveries=3, run_id=run_id,
    )  # fmt: skip
    return run.epoch


@pytest.mark.parametrize("batched", [False, True])
def test_a_finish_commit_after_a_cancel_ends_the_run_cancelled(store: Store, batched: bool) -> None:
    epoch = _claimed(store, "r")
    other = _claimed(store, "o")
    assert store.cancel("r", time.time(), "asked") == "running"
    step = StepRecord(
        run_id="r", session=0, seq=0, kind="step", name="s", status="completed",
        attempt=1, epoch=epoch, output="1", started_at=time.time(), finished_at=time.time(),
    )  # fmt: skip
    end = RunTransition(kind="finish", status="succeeded", output='"x"')
    write = RunWrite(run_id="r", epoch=epoch, steps=[step], transition=end)
    batch = [write, RunWrite(run_id="o", epoch=other)] if batched else [write]
    first = store.commit(batch, time.time())[0]
    assert (first.ok, first.already, first.cancel_requested) == (True, False, True)
    run = store.get_run("r")
    assert run is not None
    assert (run.status, run.output, run.epoch) == ("cancelled", None, epoch + 1)
    assert json.loads(run.error or "null")["message"] == "asked"
    assert [s.status for s in store.load_steps("r")] == ["completed"]  # the step's end stays
    # Sent again (its answer was lost): recognised as applied, nothing changes.
    again = store.commit([write], time.time())[0]
    assert (again.ok, again.already, again.cancel_requested) == (True, True, True)
    assert [o["event"] for o in store.outbox("r")] == []  # no webhook registered here
    assert store.get_run("r") == run


def test_a_dead_letter_of_a_run_asked_to_cancel_ends_it_cancelled(store: Store) -> None:
    """Its workers keep dying: the claim that would dead-letter it ends it as its
    finish would have, cancelled with the cancel's reason (and its children with it)."""
    epoch = _claimed(store, "p")
    store.create_run(
        run_id="kid", workflow="wf", input="null", key=None, now=time.time(), parent="p",
        parent_step="0:0", parent_close="abandon",
    )  # fmt: skip
    assert store.cancel("p", time.time(), "asked") == "running"
    dead: list[tuple[str, str]] = []
    got = store.claim(
        worker="w2", now=time.time() + 3600, lease_s=60, limit=5, workflows=None,
        max_recoveries=0, dead_lettered=dead,
    )  # fmt: skip
    assert [r.id for r in got] == ["kid"] and dead == []  # not dead-lettered: cancelled
    run = store.get_run("p")
    assert run is not None
    assert (run.status, run.epoch) == ("cancelled", epoch + 1)
    assert json.loads(run.error or "null")["message"] == "asked"
    assert check_invariants(store, run_ids=["p"]) == []


# -- a cancel that reaches the worker while a run commits how it leaves ------------------


@pytest.mark.parametrize("sticky", [True, False])
async def test_a_cancel_reaching_the_worker_during_a_suspend_commit_loses_nothing(
    db_url: str, sticky: bool
) -> None:
    """The parent suspends to wait for its child while its row is held elsewhere (the
    cancel's cascade, a child's end): its commit is answered busy and retried. The
    cancel, asked meanwhile, reaches its worker through a heartbeat during the retry.
    Before, the worker stopped the execution there: nothing was written, the run
    stayed running with nobody holding it until its lease expired, and the takeover
    charged a recovery to a run whose worker never died. Now the suspension commits,
    reads the request and wakes the run at once, which is then cancelled."""
    inner = open_store(db_url)
    parent: list[str] = []
    box: list[ms.Worker] = []

    def seen() -> bool:  # the worker has the cancel in hand (a heartbeat brought it)
        active = box[0]._active.get(parent[0]) if box and parent else None
        return active is not None and active.control.reason == "cancel"

    def held(args: tuple[object, ...], kwargs: dict[str, object]) -> bool:
        batch = kwargs.get("batch", args[0] if args else [])
        return (
            isinstance(batch, list)
            and not seen()
            and any(
                isinstance(w, RunWrite)
                and w.run_id in parent
                and w.transition is not None
                and w.transition.kind == "suspend"
                for w in batch
            )
        )

    answers: list[str] = []

    def cancel() -> None:
        if not answers:
            answers.append(inner.cancel(parent[0], time.time(), "stop"))

    fault = Fault(kind="locked", when=held, times=10**6, during=cancel)
    app = ms.App(FaultyStore(inner, [fault]), lease_s=5.0, heartbeat_s=0.02, poll_interval_s=0.02)

    @app.workflow
    async def kid(ctx: ms.RunContext) -> str:
        return str(await ctx.wait_for("never"))

    @app.workflow
    async def waits_for_kid(ctx: ms.RunContext) -> str:
        return await ctx.child(kid)

    try:
        parent.append(app.submit(waits_for_kid).run_id)
        worker = app.worker(sticky=sticky)
        box.append(worker)
        await asyncio.wait_for(worker.run(until_idle=True), 30)
        assert answers == ["running"] and fault.hits >= 1
        run = app.get_run(parent[0])
        assert (run.status, run.recoveries) == ("cancelled", 0), run
        assert "lost" not in worker.stats.outcomes, worker.stats.outcomes
        assert [c.status for c in app.children(parent[0])] == ["cancelled"]
    finally:
        app.close()


@pytest.fixture
def pg_url(db_url: str) -> str:
    if not db_url.startswith("postgresql"):
        pytest.skip("a race on PostgreSQL's row locks")
    return db_url


async def _parents_cancelled_as_children_end(dsn: str, rounds: int, parents: int) -> dict[str, int]:
    """Parents each wait for two short children (a sticky suspension while the
    children's ends lock the parent's row) while another thread cancels each at a
    random moment once its children exist; heartbeats come often, so that cancels
    reach the worker while a suspension is being committed."""
    seen = {"parents": 0, "asked": 0, "lost": 0, "takeovers": 0}
    for _ in range(rounds):
        pg.reset(dsn)
        await _cancel_round(dsn, parents, seen)
    # No run of a live worker was dropped as lost, nor charged a recovery.
    assert (seen["lost"], seen["takeovers"]) == (0, 0), seen
    return seen


async def _cancel_round(dsn: str, parents: int, seen: dict[str, int]) -> None:
    def count_takeovers(method: str, args: object, kwargs: object, result: object) -> None:
        if method == "claim":  # a claim of a running run whose lease expired
            seen["takeovers"] += sum(1 for r in result if r.recoveries)  # type: ignore[attr-defined]

    outside = open_store(dsn)
    store = FaultyStore(open_store(dsn), after_call=count_takeovers)
    app = ms.App(store, lease_s=3.0, heartbeat_s=0.05, poll_interval_s=0.02)

    async def work(n: int) -> int:
        await asyncio.sleep(random.uniform(0, 0.01))
        return n

    @app.workflow
    async def kid(ctx: ms.RunContext, n: int) -> int:
        return await ctx.step(work, n)

    @app.workflow
    async def parent(ctx: ms.RunContext, n: int) -> int:
        a, b = await asyncio.gather(ctx.child(kid, n), ctx.child(kid, n + 1))
        return a + b

    ids = [app.submit(parent, i).run_id for i in range(parents)]
    answers: dict[str, str] = {}

    def cancel() -> None:
        left, deadline = list(ids), time.monotonic() + 60
        while left and time.monotonic() < deadline:
            for rid in list(left):
                started = len(outside.list_runs(parent=rid, summary=True)) == 2
                if started and random.random() < 0.3:
                    time.sleep(random.uniform(0, 0.01))
                    answers[rid] = outside.cancel(rid, time.time(), "race")
                    left.remove(rid)
            time.sleep(0.001)
        ends = time.monotonic() + 30
        while time.monotonic() < ends and not all(
            outside.get_run(r).finished  # type: ignore[union-attr]
            for r in ids
        ):
            time.sleep(0.05)

    try:
        worker = app.worker(concurrency=256)
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.to_thread(cancel)
        finally:
            worker.request_stop()
            await asyncio.wait_for(task, 30)
        seen["parents"] += len(ids)
        seen["asked"] += sum(1 for a in answers.values() if a == "running")
        seen["lost"] += worker.stats.outcomes.get("lost", 0)
        assert check_invariants(outside) == []
        for rid in ids:
            run = outside.get_run(rid)
            assert run is not None and run.finished, run
            if answers.get(rid) == "running":
                assert run.status == "cancelled", run
    finally:
        outside.close()
        app.close()


async def test_parents_cancelled_as_their_children_end_are_never_lost(pg_url: str) -> None:
    seen = await _parents_cancelled_as_children_end(pg_url, rounds=2, parents=20)
    print(f"\nparents cancelled as their children end: {seen}")


@pytest.mark.slow
async def test_parents_cancelled_as_their_children_end_are_never_lost_many(pg_url: str) -> None:
    seen = await _parents_cancelled_as_children_end(pg_url, rounds=25, parents=40)
    print(f"\nparents cancelled as their children end: {seen}")
