"""The durable engine in one process: replay, step modes, retries, waits, sessions."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
from _helpers import Crash, drain

import mainspring as ms
from mainspring.storage import SQLiteStore


@pytest.fixture
def clock() -> ms.FakeClock:
    return ms.FakeClock()


@pytest.fixture
def fapp(db_url: str, clock: ms.FakeClock) -> ms.App:
    """An App on a fake clock: time moves only when a test says so."""
    return ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0)


async def test_completed_steps_never_rerun_after_a_crash(fapp: ms.App, clock: ms.FakeClock):
    calls: list[str] = []
    crash_once = {"armed": True}

    async def effect(i: int) -> int:
        key = ms.current_step().idempotency_key
        calls.append(key)
        if i == 3 and crash_once["armed"]:
            crash_once["armed"] = False
            raise Crash
        return i * 10

    @fapp.workflow
    async def five(ctx: ms.RunContext) -> list[int]:
        return [await ctx.step(effect, i) for i in range(5)]

    handle = fapp.submit(five)
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "running"  # died holding its lease
    clock.advance(fapp.lease_s + 1)
    await drain(fapp)
    assert await handle.result() == [0, 10, 20, 30, 40]
    # Steps 0-2 ran once; step 3 ran twice under the same key; step 4 once.
    key = f"{handle.run_id}:0:"
    assert calls == [key + "0", key + "1", key + "2", key + "3", key + "3", key + "4"]
    steps = fapp.observe.steps(handle.run_id)
    assert [(s.seq, s.status, s.attempt) for s in steps] == [
        (0, "completed", 1),
        (1, "completed", 1),
        (2, "completed", 1),
        (3, "completed", 2),
        (4, "completed", 1),
    ]
    assert fapp.get_run(handle.run_id).recoveries == 0  # progress resets the count


async def test_at_most_once_step_is_not_rerun(fapp: ms.App, clock: ms.FakeClock):
    sent: list[str] = []

    async def charge() -> str:
        sent.append(ms.current_step().idempotency_key)
        if len(sent) == 1:
            raise Crash
        return "charged"

    @fapp.workflow
    async def pay(ctx: ms.RunContext) -> str:
        try:
            return await ctx.step(charge, mode="at_most_once")
        except ms.StepInterrupted:
            return "ask a human"

    handle = fapp.submit(pay)
    await drain(fapp)
    clock.advance(fapp.lease_s + 1)
    await drain(fapp)
    assert await handle.result() == "ask a human"
    assert len(sent) == 1
    [row] = fapp.observe.steps(handle.run_id)
    assert row.status == "failed"
    assert "StepInterrupted" in json.loads(row.error or "{}")["type"]


async def test_changed_code_raises_nondeterminism(db_url: str, clock: ms.FakeClock):
    v1 = ms.App(db_url, clock=clock, poll_interval_s=0.01)

    async def a() -> int:
        return 1

    async def b() -> int:
        return 2

    @v1.workflow(name="flow")
    async def flow_v1(ctx: ms.RunContext) -> int:
        await ctx.step(a)
        return int(await ctx.wait_for("go"))

    handle = v1.submit(flow_v1)
    await drain(v1)
    assert v1.get_run(handle.run_id).status == "waiting"

    v2 = ms.App(db_url, clock=clock, poll_interval_s=0.01)

    @v2.workflow(name="flow")
    async def flow_v2(ctx: ms.RunContext) -> int:
        await ctx.step(b)  # a different step where the journal has `a`
        return int(await ctx.wait_for("go"))

    v2.signal(handle.run_id, "go", 5)
    await drain(v2)
    run = v2.get_run(handle.run_id)
    # Never failed for it: left for a worker whose code can replay it.
    assert (run.status, run.wait_reason) == ("sleeping", "replay")
    error = json.loads(run.error or "{}")
    assert error["type"] == "mainspring._errors.NondeterminismError"
    assert "'test_changed_code_raises_nondeterminism.<locals>.a'" in error["message"]
    assert "'test_changed_code_raises_nondeterminism.<locals>.b'" in error["message"]
    await drain(v1)  # the code that wrote the journal finishes it
    assert await v1.result(handle.run_id) == 5


async def test_retries_back_off_then_succeed(app: ms.App):
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(ms.current_step().attempt)
        if len(attempts) < 3:
            raise ConnectionError("reset by peer")
        return "ok"

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        fast = ms.RetryPolicy(max_attempts=5, initial_s=0.001, max_s=0.01)
        return await ctx.step(flaky, retry=fast)

    assert await app.run(wf) == "ok"
    assert attempts == [1, 2, 3]
    [row] = app.observe.steps(app.list_runs()[0].id)
    assert (row.status, row.attempt) == ("completed", 3)


async def test_retry_after_is_honoured_durably(fapp: ms.App, clock: ms.FakeClock):
    def limited() -> str:
        if ms.current_step().attempt == 1:
            raise ms.RateLimited("slow down", retry_after=30)
        return "through"

    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> str:
        return await ctx.step(limited, retry=ms.RetryPolicy(max_attempts=2, initial_s=0.001))

    handle = fapp.submit(wf)
    start = clock.now()
    await drain(fapp)
    run = fapp.get_run(handle.run_id)
    assert run.status == "sleeping"  # the back-off released the worker
    assert run.wake_at is not None and run.wake_at >= start + 30
    assert run.wait_reason and run.wait_reason.startswith("retry:")
    clock.advance(29)
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "sleeping"
    clock.advance(2)
    await drain(fapp)
    assert await handle.result() == "through"


async def test_non_retryable_error_fails_at_once_and_replays_the_same(
    fapp: ms.App, clock: ms.FakeClock
):
    calls = []

    def broken() -> None:
        calls.append(1)
        raise ms.PermissionDenied("bad api key")

    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> str:
        try:
            await ctx.step(broken)
        except ms.StepFailed as exc:
            outcome = f"{exc.error_type}:{exc.attempts}"
        await ctx.wait_for("go")
        return outcome

    handle = fapp.submit(wf)
    await drain(fapp)
    fapp.signal(handle.run_id, "go")
    await drain(fapp)  # replays: the failure comes from the journal, not a new call
    assert await handle.result() == "mainspring._errors.PermissionDenied:1"
    assert calls == [1]


async def test_unhandled_step_failure_fails_the_run(app: ms.App):
    def boom() -> None:
        raise ValueError("the input was 42")

    @app.workflow
    async def wf(ctx: ms.RunContext) -> None:
        await ctx.step(boom, retry=ms.RetryPolicy.never())

    with pytest.raises(ms.RunFailed) as info:
        await app.run(wf)
    assert info.value.status == "failed"
    assert info.value.error["type"] == "mainspring._errors.StepFailed"
    assert "ValueError: the input was 42" in info.value.error["message"]


async def test_long_sleep_releases_the_worker_and_wakes_on_time(fapp: ms.App, clock: ms.FakeClock):
    @fapp.workflow
    async def nap(ctx: ms.RunContext) -> str:
        await ctx.sleep(3600)
        return "rested"

    handle = fapp.submit(nap)
    await drain(fapp)
    run = fapp.get_run(handle.run_id)
    assert (run.status, run.owner, run.wake_at) == ("sleeping", None, clock.now() + 3600)
    clock.advance(3599)
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "sleeping"
    clock.advance(1)
    await drain(fapp)
    assert await handle.result() == "rested"


async def test_signal_sent_before_the_wait_is_not_lost(app: ms.App):
    @app.workflow
    async def wf(ctx: ms.RunContext) -> list[object]:
        first = await ctx.wait_for("approve")
        second = await ctx.wait_for("approve")
        return [first, second]

    handle = app.submit(wf)
    app.signal(handle.run_id, "approve", {"by": "ana"})
    app.signal(handle.run_id, "approve", "again")
    await drain(app)  # the worker starts only now; the signals were kept
    assert await handle.result() == [{"by": "ana"}, "again"]


async def test_wait_for_timeout(fapp: ms.App, clock: ms.FakeClock):
    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> str:
        got = await ctx.wait_for("maybe", timeout=60, default="defaulted")
        try:
            await ctx.wait_for("never", timeout=60)
        except ms.WaitTimeout:
            return f"{got}+timeout"
        return "unreachable"

    handle = fapp.submit(wf)
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "waiting"
    clock.advance(61)
    await drain(fapp)
    clock.advance(61)
    await drain(fapp)
    assert await handle.result() == "defaulted+timeout"


async def test_now_uuid_random_are_journaled(fapp: ms.App, clock: ms.FakeClock):
    seen: list[tuple[datetime, uuid.UUID, float]] = []

    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> str:
        values = (ctx.now(), ctx.uuid(), ctx.random())
        seen.append(values)
        await ctx.wait_for("go")
        return str(values[1])

    handle = fapp.submit(wf)
    await drain(fapp)
    clock.advance(100)
    fapp.signal(handle.run_id, "go")
    await drain(fapp)
    assert len(seen) == 2
    assert seen[0] == seen[1]  # replay saw the journaled values, not new ones
    assert seen[0][1].version == 4
    assert await handle.result() == str(seen[0][1])


async def test_continue_as_new_starts_a_fresh_session(app: ms.App):
    loaded: list[int] = []

    async def work(n: int) -> int:
        return n

    @app.workflow
    async def long(ctx: ms.RunContext, total: int) -> dict[str, int]:
        done = ctx.handoff["done"] if ctx.handoff else 0
        loaded.append(ctx.session)
        for _ in range(3):
            if done == total:
                return {"done": done, "sessions": ctx.session + 1}
            done = done + await ctx.step(work, 1)
        ctx.continue_as_new({"done": done})

    assert await app.run(long, 7) == {"done": 7, "sessions": 3}
    run_id = app.list_runs()[0].id
    steps = app.observe.steps(run_id)
    assert [(s.session, s.seq) for s in steps] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0)
    ]  # fmt: skip
    assert loaded == [0, 1, 2]
    assert app.get_run(run_id).session == 2


async def test_cancel_a_waiting_run_and_a_running_run(app: ms.App):
    started = asyncio.Event()
    never = asyncio.Event()

    async def block() -> None:
        started.set()
        await never.wait()

    @app.workflow
    async def waits(ctx: ms.RunContext) -> None:
        await ctx.wait_for("never")

    @app.workflow
    async def works(ctx: ms.RunContext) -> None:
        await ctx.step(block)

    waiting = app.submit(waits)
    await drain(app)
    assert app.cancel(waiting.run_id, reason="not needed") == "cancelled"
    with pytest.raises(ms.RunFailed, match="cancelled"):
        await waiting.result()

    app.heartbeat_s = 0.05
    running = app.submit(works)
    worker = app.worker()
    task = asyncio.create_task(worker.run(until_idle=True))
    await asyncio.wait_for(started.wait(), 10)
    assert app.cancel(running.run_id) == "running"  # its worker stops it
    await asyncio.wait_for(task, 10)
    assert app.get_run(running.run_id).status == "cancelled"
    assert app.cancel(running.run_id) == "cancelled"


async def test_submit_is_idempotent_by_key(app: ms.App):
    @app.workflow
    async def wf(ctx: ms.RunContext, x: int) -> int:
        return x

    a = app.submit(wf, 1, key="order-1")
    b = app.submit(wf, 1, key="order-1")
    assert (a.run_id, a.created, b.created) == (b.run_id, True, False)
    assert await app.run(wf, 1, key="order-1") == 1
    assert len(app.list_runs()) == 1


async def test_bad_input_gets_clear_errors(app: ms.App):
    @app.workflow
    async def wf(ctx: ms.RunContext, x: int) -> object:
        return await ctx.step(lambda: object())

    with pytest.raises(ms.UnknownWorkflow, match="'nope'"):
        app.submit("nope")
    with pytest.raises(ms.SerializationError, match="object"):
        app.submit(wf, object())
    with pytest.raises(ms.ConfigError, match="cannot take"):
        app.submit(wf, 1, 2)
    with pytest.raises(ms.RunNotFound, match="'missing'"):
        app.signal("missing", "go")
    with pytest.raises(ms.RunFailed) as info:
        await app.run(wf, 1)  # the step returns something that is not JSON
    assert "cannot be stored as JSON" in info.value.error["message"]
    with pytest.raises(ms.RunConflict, match="already failed"):
        app.signal(info.value.run_id or "", "go")


async def test_hung_sync_step_times_out_without_hanging_the_run(app: ms.App):
    import threading

    release = threading.Event()

    def hangs() -> None:
        release.wait(30)

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        try:
            await ctx.step(hangs, timeout=0.1, retry=ms.RetryPolicy(max_attempts=2, initial_s=0))
        except ms.StepFailed as exc:
            return exc.error_type
        return "finished?"

    try:
        assert await asyncio.wait_for(app.run(wf), 20) == "mainspring._errors.StepTimeout"
    finally:
        release.set()


async def test_dead_letter_after_repeated_crashes(db_url: str, clock: ms.FakeClock):
    app = ms.App(db_url, clock=clock, max_recoveries=2, poll_interval_s=0.01)

    async def poison() -> None:
        raise Crash

    @app.workflow
    async def wf(ctx: ms.RunContext) -> None:
        await ctx.step(poison)

    handle = app.submit(wf)
    for _ in range(4):
        await drain(app)
        clock.advance(app.lease_s + 1)
    run = app.get_run(handle.run_id)
    assert run.status == "failed"
    assert "dead-lettered" in json.loads(run.error or "{}")["message"]


async def test_a_stale_worker_writes_nothing(fapp: ms.App, clock: ms.FakeClock):
    gate = asyncio.Event()
    proceed = asyncio.Event()

    async def slow(i: int) -> int:
        if i == 1:
            gate.set()
            await proceed.wait()
        return i

    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> int:
        return sum([await ctx.step(slow, i) for i in range(3)])

    handle = fapp.submit(wf)
    stale = fapp.worker(concurrency=1)  # no free slot: it cannot take its own run over
    task = asyncio.create_task(stale.run(until_idle=True))
    await asyncio.wait_for(gate.wait(), 10)
    clock.advance(fapp.lease_s + 1)  # its heartbeat is slower than the fake clock
    [taken] = fapp.store.claim(
        worker="other",
        now=clock.now(),
        lease_s=15,
        limit=1,
        workflows=None,
        max_recoveries=5,
    )
    proceed.set()
    await asyncio.wait_for(task, 10)
    assert stale.stats.outcomes == {"lost": 1}
    rows = fapp.observe.steps(handle.run_id)
    assert all(r.epoch < taken.epoch for r in rows)
    assert [r.seq for r in rows] == [0, 1]
    assert rows[1].status == "started"  # the stale completion of step 1 was refused


class FlakyCommitStore(SQLiteStore):
    """Commits, then reports failure: the classic ambiguous commit."""

    fail_on: set[int]
    commits = 0

    def commit(self, batch, now):  # type: ignore[no-untyped-def]
        result = super().commit(batch, now)
        self.commits += 1
        if self.commits in self.fail_on:
            raise ms.StoreUnavailable("connection reset after COMMIT was sent")
        return result


async def test_ambiguous_commit_does_not_duplicate_a_step(tmp_path: Path):
    store = FlakyCommitStore(tmp_path / "flaky.db")
    store.fail_on = {2, 3, 5}
    app = ms.App(store, poll_interval_s=0.01)
    calls: list[int] = []

    def effect(i: int) -> int:
        calls.append(i)
        return i

    @app.workflow
    async def wf(ctx: ms.RunContext) -> int:
        return sum([await ctx.step(effect, i) for i in range(4)])

    assert await app.run(wf) == 6
    assert calls == [0, 1, 2, 3]


async def test_graceful_shutdown_releases_runs(app: ms.App):
    in_step = asyncio.Event()
    finish = asyncio.Event()
    calls: list[int] = []

    async def step(i: int) -> int:
        calls.append(i)
        if i == 1 and len(calls) == 2:
            in_step.set()
            await finish.wait()
        return i

    @app.workflow
    async def wf(ctx: ms.RunContext) -> int:
        return sum([await ctx.step(step, i) for i in range(3)])

    handle = app.submit(wf)
    worker = app.worker()
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(in_step.wait(), 10)
    worker.request_stop()
    finish.set()  # the step in flight finishes; the run is given back at the boundary
    await asyncio.wait_for(task, 10)
    run = app.get_run(handle.run_id)
    assert (run.status, run.owner, run.recoveries) == ("queued", None, 0)
    assert worker.stats.outcomes == {"released": 1}
    await drain(app)
    assert await handle.result() == 3
    assert calls == [0, 1, 2]  # nothing ran twice


async def test_many_runs_share_commits(app: ms.App):
    async def step(i: int) -> int:
        await asyncio.sleep(0)
        return i

    @app.workflow
    async def wf(ctx: ms.RunContext, n: int) -> int:
        return sum([await ctx.step(step, i) for i in range(n)])

    handles = [app.submit(wf, 20) for _ in range(30)]
    worker = await drain(app, concurrency=30)
    assert [await h.result() for h in handles] == [190] * 30
    assert worker.stats.outcomes == {"succeeded": 30}


def test_corrupt_and_newer_databases_are_refused(tmp_path: Path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ms.StoreError, match=r"junk\.db"):
        ms.App(f"sqlite:///{junk}").store  # noqa: B018
    newer = tmp_path / "newer.db"
    store = SQLiteStore(newer)
    with store._write() as cur:
        cur.execute("UPDATE ms_meta SET value = '999' WHERE key = 'schema_version'")
    store.close()
    with pytest.raises(ms.SchemaVersionError, match="999"):
        SQLiteStore(newer)


def test_locked_database_is_a_transient_error(tmp_path: Path):
    import sqlite3

    path = tmp_path / "locked.db"
    store = SQLiteStore(path, busy_timeout_ms=100)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(ms.StoreUnavailable, match="locked") as info:
            store.create_run(run_id="r", workflow="w", input="{}", key=None, now=0)
        assert info.value.retryable
    finally:
        blocker.execute("ROLLBACK")
    store.create_run(run_id="r", workflow="w", input="{}", key=None, now=0)
    assert store.get_run("r") is not None


async def test_parallel_steps_are_journaled_in_call_order(fapp: ms.App, clock: ms.FakeClock):
    calls: list[int] = []
    crash = {"armed": True}

    async def fetch(i: int) -> int:
        calls.append(i)
        await asyncio.sleep(0.01 * (5 - i))  # finish in reverse order: step 0 last
        if i == 0 and crash["armed"]:
            crash["armed"] = False
            # Crash once steps 1-4 are journaled (their commits may lag on a loaded
            # machine): the claim is that a crash then costs only step 0.
            for _ in range(500):
                done = [r for r in fapp.observe.steps(handle.run_id) if r.status == "completed"]
                if len(done) == 4:
                    break
                await asyncio.sleep(0.01)
            raise Crash
        return i * i

    @fapp.workflow
    async def fan_out(ctx: ms.RunContext) -> list[int]:
        first = await asyncio.gather(*(ctx.step(fetch, i) for i in range(5)))
        return [*first, await ctx.step(fetch, 9)]

    handle = fapp.submit(fan_out)
    await drain(fapp)
    clock.advance(fapp.lease_s + 1)
    await drain(fapp)
    assert await handle.result() == [0, 1, 4, 9, 16, 81]
    rows = fapp.observe.steps(handle.run_id)
    assert [(r.seq, r.status) for r in rows] == [(i, "completed") for i in range(6)]
    assert [r.output for r in rows] == ["0", "1", "4", "9", "16", "81"]
    # Steps 1-4 completed while step 0 still ran, and were journaled at once; the
    # crash in step 0 cost only step 0.
    assert sorted(calls) == [0, 0, 1, 2, 3, 4, 9]


async def test_a_worker_that_outlives_its_own_lease_does_not_lose_track(
    fapp: ms.App, clock: ms.FakeClock
) -> None:
    stalled = {"done": False}

    def slow(i: int) -> int:
        if i == 1 and not stalled["done"]:
            stalled["done"] = True
            clock.advance(fapp.lease_s + 1)  # a stall longer than the lease, mid-step
            run_id = ms.current_step().run_id
            for _ in range(500):  # ...until this very worker claims the run afresh
                if fapp.get_run(run_id).epoch >= 2:
                    break
                time.sleep(0.01)
        return i

    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> int:
        return sum([await ctx.step(slow, i) for i in range(4)])

    handle = fapp.submit(wf)
    worker = await drain(fapp)  # the worker re-claims its own run: the stale copy stops
    assert await handle.result() == 6
    assert worker.stats.outcomes.get("succeeded") == 1
    assert fapp.get_run(handle.run_id).epoch >= 2
