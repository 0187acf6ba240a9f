"""What a queue's slot covers, as users read ``concurrency``: runs in progress. A run
sleeping between two attempts of a step keeps its slot (the queue does not start
another run that would hit the same failing service); a run waiting for a person,
a signal or a child gives it up. On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _helpers import drain

import mainspring as ms
from mainspring.testing import FakeClock, assert_invariants

BACK_OFF_S = 30.0


@pytest.fixture
def app(db_url: str) -> Iterator[ms.App]:
    application = ms.App(db_url, clock=FakeClock(), poll_interval_s=0.01, inline_wait_s=0.0)
    yield application
    application.close()


def _status(app: ms.App, handle: ms.RunHandle) -> str:
    return app.get_run(handle.run_id).status


async def test_a_run_backing_off_between_attempts_keeps_its_slot(app: ms.App) -> None:
    app.queues.add("reports", concurrency=1)
    calls: list[str] = []

    def fetch(name: str) -> str:
        calls.append(name)
        if calls.count(name) == 1:
            raise ConnectionError("the warehouse is down")  # retried after a back-off
        return f"{name} fetched"

    retry = ms.RetryPolicy(max_attempts=3, initial_s=BACK_OFF_S, max_s=BACK_OFF_S, jitter=False)

    @app.workflow
    async def report(ctx: ms.RunContext, name: str) -> str:
        return await ctx.step(fetch, name, retry=retry)

    first = app.submit(report, "sales", queue="reports")
    app.clock.advance(1)  # type: ignore[attr-defined]
    second = app.submit(report, "stock", queue="reports")
    await drain(app)
    # The first failed once and sleeps before its next attempt: still in progress.
    assert (_status(app, first), _status(app, second)) == ("sleeping", "queued")
    assert calls == ["sales"]
    [queue] = app.queues.list()
    assert (queue.running, queue.retrying, queue.queued) == (0, 1, 1)
    app.clock.advance(BACK_OFF_S + 1)  # type: ignore[attr-defined]
    await drain(app)
    assert await first.result() == "sales fetched"
    # Only then the second: the warehouse saw one report at a time.
    assert calls == ["sales", "sales", "stock"]
    app.clock.advance(BACK_OFF_S + 1)  # type: ignore[attr-defined]
    await drain(app)
    assert await second.result() == "stock fetched"
    assert_invariants(app.store, now=app.clock.now(), settled=True)


async def test_a_run_waiting_for_a_person_gives_its_slot_up(app: ms.App) -> None:
    app.queues.add("deploys", concurrency=1)

    @app.workflow
    async def deploy(ctx: ms.RunContext, env: str) -> str:
        decision = await ctx.approval("go", preview=env)
        return f"{env}: {'shipped' if decision.approved else 'held'}"

    first = app.submit(deploy, "staging", queue="deploys")
    second = app.submit(deploy, "prod", queue="deploys")
    await drain(app)
    # Both wait for a person: a run waiting a day holds no slot.
    assert (_status(app, first), _status(app, second)) == ("waiting", "waiting")
    [queue] = app.queues.list()
    assert (queue.running, queue.retrying, queue.waiting) == (0, 0, 2)
    for handle in (first, second):
        app.answer(handle.run_id, "approval:go", decision="approve", by="ana")
    await drain(app)
    assert [await h.result() for h in (first, second)] == ["staging: shipped", "prod: shipped"]
