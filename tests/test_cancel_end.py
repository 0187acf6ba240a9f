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
import time
from collections.abc import Iterator

import pytest

import mainspring as ms
from mainspring.storage import RunTransition, RunWrite, StepRecord, Store, open_store
from mainspring.testing import check_invariants


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
