"""Outside actions racing a run's own transitions, in real threads, on
PostgreSQL (where the races were) and SQLite.

Issue 12, items 1 and 5. A worker executes the runs in this process's event loop
while another thread, on its own connections, signals or cancels each run the
moment the run is about to commit its next transition (it polls the journal for
that moment). Before ``send_signal`` and ``cancel`` locked the run row, a signal
stored while its run committed a suspend never woke it, a cancel answered
``running`` while the run went on to wait for ever, and a cancel racing completion
wrote a ``Cancelled`` error onto a succeeded run.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator

import pytest

import mainspring as ms
from mainspring.storage import FINISHED, Store, open_store

# How long the outside thread keeps going before it declares the runs stuck. Not a
# duration under test: a correct run finishes in well under a second.
GIVE_UP_S = 60.0


@pytest.fixture
def dsn(db_url: str) -> str:
    """Both stores: the races are PostgreSQL's (SQLite's writers queue on one lock),
    and SQLite must hold the same promises."""
    return db_url


@pytest.fixture
def outside(dsn: str) -> Iterator[Store]:
    """The other party's own store: its own pool, its own connections."""
    store = open_store(dsn)
    yield store
    store.close()


async def _race(app: ms.App, act: Callable[[], None]) -> None:
    """Run a worker here while ``act`` runs in another thread; stop when it returns."""
    worker = app.worker(concurrency=64)
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.to_thread(act)
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)


def _consumed(store: Store, run_id: str) -> int:
    steps = store.load_steps(run_id)
    return sum(1 for s in steps if s.kind == "signal" and s.status == "completed")


async def _signal_right_after_each_wait(dsn: str, outside: Store, runs: int, waits: int) -> None:
    app = ms.App(dsn, poll_interval_s=0.05)

    @app.workflow
    async def loop(ctx: ms.RunContext, n: int) -> int:
        for _ in range(n):
            await ctx.wait_for("go")
        return n

    try:
        ids = [app.submit(loop, waits).run_id for _ in range(runs)]

        def send() -> None:
            sent = dict.fromkeys(ids, 0)
            for rid in ids:
                outside.send_signal(rid, "go", "1", time.time())
                sent[rid] = 1
            deadline = time.monotonic() + GIVE_UP_S
            while time.monotonic() < deadline:
                left = [rid for rid, n in sent.items() if n < waits]
                if not left:
                    return
                for rid in left:
                    # The previous signal was consumed: the run is on its way to the
                    # next wait's suspend. Send the next one now, into that commit.
                    if _consumed(outside, rid) == sent[rid]:
                        outside.send_signal(rid, "go", "1", time.time())
                        sent[rid] += 1
                time.sleep(0.001)

        await _race(app, send)
        # Every signal was stored and each must have woken its run: what is left
        # runnable finishes now, and a run that slept through its signal stays.
        await _drain_once(app)
        stuck = {
            rid: (run.status, run.wait_reason)
            for rid in ids
            if (run := outside.get_run(rid)) is not None and run.status != "succeeded"
        }
        assert stuck == {}, f"{len(stuck)} of {runs} runs never woke for a stored signal"
    finally:
        app.close()


async def _drain_once(app: ms.App) -> None:
    worker = app.worker(concurrency=64)
    await asyncio.wait_for(worker.run(until_idle=True), 30)


async def test_every_stored_signal_wakes_its_waiting_run(dsn: str, outside: Store) -> None:
    await _signal_right_after_each_wait(dsn, outside, runs=12, waits=4)


@pytest.mark.slow
async def test_every_stored_signal_wakes_its_waiting_run_many(dsn: str, outside: Store) -> None:
    await _signal_right_after_each_wait(dsn, outside, runs=60, waits=10)


async def _cancel_as_the_run_moves(dsn: str, outside: Store, runs: int, *, then_wait: bool) -> None:
    """Cancel each run the moment its one step starts: that races its suspend
    (``then_wait``) or its completion."""
    app = ms.App(dsn, poll_interval_s=0.05)

    async def work(ms_: float) -> str:
        await asyncio.sleep(ms_ / 1000)
        return "x"

    @app.workflow
    async def wf(ctx: ms.RunContext, ms_: float) -> str:
        # The step's intent row is what the other thread sees; the transition follows
        # within a few milliseconds, spread so that cancels land all around it.
        await ctx.step(work, ms_)
        if then_wait:
            await ctx.wait_for("never")
        return "done"

    try:
        ids = [app.submit(wf, (i % 8) * 1.5).run_id for i in range(runs)]
        answers: dict[str, str] = {}

        def cancel() -> None:
            deadline = time.monotonic() + GIVE_UP_S
            while len(answers) < len(ids) and time.monotonic() < deadline:
                for rid in ids:
                    if rid in answers:
                        continue
                    steps = outside.load_steps(rid)
                    if steps:  # the step started: its run is about to move
                        answers[rid] = outside.cancel(rid, time.time(), "racing")
                time.sleep(0.001)

        await _race(app, cancel)
        assert len(answers) == runs
        await _drain_once(app)  # a cancel that landed on a running run is carried out
        for rid in ids:
            run = outside.get_run(rid)
            assert run is not None
            answer = answers[rid]
            if answer in FINISHED:  # what cancel reported is the final truth
                assert run.status == answer, (rid, answer, run.status)
            else:
                assert answer == "running"
            assert run.status in FINISHED, f"run {rid} is {run.status} after a cancel"
            if then_wait:
                assert run.status == "cancelled"
            if run.status == "succeeded":  # a finished run is never modified
                assert (run.error, run.output) == (None, '"done"')
            else:
                assert run.status == "cancelled"
                assert json.loads(run.error or "{}")["message"] == "racing"
    finally:
        app.close()


async def test_cancel_racing_a_suspend_always_cancels(dsn: str, outside: Store) -> None:
    await _cancel_as_the_run_moves(dsn, outside, 30, then_wait=True)


async def test_cancel_racing_completion_never_touches_a_succeeded_run(
    dsn: str, outside: Store
) -> None:
    await _cancel_as_the_run_moves(dsn, outside, 30, then_wait=False)


@pytest.mark.slow
@pytest.mark.parametrize("then_wait", [True, False])
async def test_cancel_races_many(dsn: str, outside: Store, then_wait: bool) -> None:
    for _ in range(5):
        await _cancel_as_the_run_moves(dsn, outside, 60, then_wait=then_wait)
