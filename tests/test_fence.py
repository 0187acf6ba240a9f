"""The fence (epoch and status) and the idempotency of every write, on both stores.

Issue 12, items 2, 6, 7, 8, 10 and 16: a stale holder cannot write into a run that
was dead-lettered, cancelled or retried; a re-sent write (after an ambiguous commit
or a busy answer) never replaces a newer row, never skips a session and never emits
an event twice; a signal is consumed by one wait; retry never deletes a completed
row; concurrent submits with one key all get the one run.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _helpers import drain

import mainspring as ms
from mainspring.storage import (
    RunTransition,
    RunWrite,
    StepRecord,
    Store,
    WriteResult,
    open_store,
)

T0 = 1_000.0


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = open_store(db_url)
    yield s
    s.close()


def _claim(s: Store, run_id: str, now: float = T0, *, max_recoveries: int = 5) -> list[Any]:
    return s.claim(
        worker="w",
        now=now,
        lease_s=15,
        limit=1,
        workflows=None,
        max_recoveries=max_recoveries,
        run_id=run_id,
    )


def _running(s: Store, run_id: str = "r1") -> int:
    s.create_run(run_id=run_id, workflow="wf", input="[]", key=None, now=T0)
    [run] = _claim(s, run_id)
    return int(run.epoch)


def _row(
    run_id: str, seq: int, status: str, *, epoch: int, attempt: int = 1, kind: str = "step"
) -> StepRecord:
    return StepRecord(
        run_id=run_id,
        session=0,
        seq=seq,
        kind=kind,  # type: ignore[arg-type]
        name=f"s{seq}",
        status=status,  # type: ignore[arg-type]
        attempt=attempt,
        epoch=epoch,
        output='"done"' if status == "completed" else None,
        started_at=T0,
        finished_at=T0 if status == "completed" else None,
    )


def _events(s: Store, run_id: str, event: str) -> int:
    return sum(1 for e in s.outbox(run_id) if e["event"] == event)


# -- the fence: epoch and status -----------------------------------------------------


def test_a_dead_lettered_run_refuses_its_stale_holder(store: Store) -> None:
    epoch = _running(store)
    # The holder stalls past its lease; the next claim dead-letters the run.
    assert _claim(store, "r1", T0 + 100, max_recoveries=0) == []
    dead = store.get_run("r1")
    assert dead is not None and dead.status == "failed" and dead.epoch == epoch + 1
    [result] = store.commit(
        [
            RunWrite(
                run_id="r1",
                epoch=epoch,
                steps=[_row("r1", 0, "completed", epoch=epoch)],
                transition=RunTransition(kind="finish", status="succeeded", output='"late"'),
            )
        ],
        T0 + 101,
    )
    assert result == WriteResult(ok=False)
    after = store.get_run("r1")
    assert after is not None and (after.status, after.output) == ("failed", None)
    assert store.load_steps("r1") == []  # the step the dead run's holder ran is not journaled


def test_a_cancelled_waiting_run_refuses_writes_at_its_old_epoch(store: Store) -> None:
    epoch = _running(store)
    store.commit(
        [
            RunWrite(
                run_id="r1",
                epoch=epoch,
                transition=RunTransition(
                    kind="suspend", status="waiting", wait_reason="signal:go", wait_signal="go"
                ),
            )
        ],
        T0,
    )
    assert store.cancel("r1", T0 + 1) == "cancelled"
    [result] = store.commit(
        [RunWrite(run_id="r1", epoch=epoch, steps=[_row("r1", 0, "started", epoch=epoch)])],
        T0 + 2,
    )
    assert not result.ok
    assert store.load_steps("r1") == []
    run = store.get_run("r1")
    assert run is not None and run.status == "cancelled" and run.epoch == epoch + 1


def test_cancel_never_modifies_a_finished_run(store: Store) -> None:
    epoch = _running(store)
    store.commit(
        [
            RunWrite(
                run_id="r1",
                epoch=epoch,
                transition=RunTransition(kind="finish", status="succeeded", output='"ok"'),
            )
        ],
        T0,
    )
    before = store.get_run("r1")
    assert store.cancel("r1", T0 + 1, "too late") == "succeeded"
    assert store.get_run("r1") == before


# -- re-sent writes ------------------------------------------------------------------


@pytest.mark.parametrize("status", ["succeeded", "failed"])
def test_a_resent_finish_is_applied_once_and_says_so(store: Store, status: str) -> None:
    store.add_webhook("http://127.0.0.1:9/hook", T0)
    epoch = _running(store)
    write = RunWrite(
        run_id="r1",
        epoch=epoch,
        steps=[_row("r1", 0, "completed", epoch=epoch)],
        transition=RunTransition(
            kind="finish",
            status=status,  # type: ignore[arg-type]
            output='"ok"' if status == "succeeded" else None,
            error='{"type":"Boom"}' if status == "failed" else None,
        ),
    )
    first = store.commit([write], T0)
    again = store.commit([write], T0 + 1)  # the caller saw the first one fail
    assert first == [WriteResult(ok=True)]
    assert again == [WriteResult(ok=True, already=True)]
    assert _events(store, "r1", f"run.{status}") == 1
    run = store.get_run("r1")
    assert run is not None and run.finished_at == T0  # not re-stamped


def test_a_resent_finish_is_not_mistaken_for_a_dead_letter(store: Store) -> None:
    epoch = _running(store)
    _claim(store, "r1", T0 + 100, max_recoveries=0)  # dead-lettered at epoch + 1
    write = RunWrite(
        run_id="r1",
        epoch=epoch,
        transition=RunTransition(kind="finish", status="failed", error='{"type":"Mine"}'),
    )
    assert store.commit([write], T0 + 101) == [WriteResult(ok=False)]


def test_a_resent_suspend_keeps_the_wake_up_a_signal_set(store: Store) -> None:
    store.add_webhook("http://127.0.0.1:9/hook", T0)
    epoch = _running(store)
    write = RunWrite(
        run_id="r1",
        epoch=epoch,
        steps=[_row("r1", 0, "started", epoch=epoch, kind="signal")],
        transition=RunTransition(
            kind="suspend", status="waiting", wait_reason="signal:go", wait_signal="go"
        ),
    )
    assert store.commit([write], T0) == [WriteResult(ok=True)]
    store.send_signal("r1", "go", "1", T0 + 1)  # wakes it: wake_at = now
    assert store.commit([write], T0 + 2) == [WriteResult(ok=True, already=True)]
    run = store.get_run("r1")
    assert run is not None and run.status == "waiting" and run.wake_at == 0.0  # WAKE_NOW
    assert _events(store, "r1", "run.waiting") == 1
    assert [r.epoch for r in _claim(store, "r1", T0 + 3)] == [epoch + 1]  # wakes at once


def test_a_resent_continue_as_new_moves_one_session(store: Store) -> None:
    epoch = _running(store)
    write = RunWrite(
        run_id="r1",
        epoch=epoch,
        steps=[_row("r1", 0, "completed", epoch=epoch)],
        transition=RunTransition(kind="next_session", handoff='{"n":1}', session=0),
    )
    store.commit([write], T0)
    store.commit([write], T0 + 1)
    run = store.get_run("r1")
    assert run is not None and (run.session, run.handoff) == (1, '{"n":1}')


def test_an_older_snapshot_never_replaces_a_newer_row(store: Store) -> None:
    epoch = _running(store)
    started = _row("r1", 0, "started", epoch=epoch)
    done = _row("r1", 0, "completed", epoch=epoch)
    retrying = _row("r1", 1, "retrying", epoch=epoch)
    second = _row("r1", 1, "started", epoch=epoch, attempt=2)
    store.commit([RunWrite(run_id="r1", epoch=epoch, steps=[done, second])], T0)
    # A flush retried late re-sends what it had before.
    store.commit([RunWrite(run_id="r1", epoch=epoch, steps=[started, retrying])], T0 + 1)
    rows = store.load_steps("r1")
    assert [(r.status, r.attempt) for r in rows] == [("completed", 1), ("started", 2)]
    # A newer row still replaces an older one.
    store.commit(
        [
            RunWrite(
                run_id="r1", epoch=epoch, steps=[_row("r1", 1, "completed", epoch=epoch, attempt=2)]
            )
        ],
        T0 + 2,
    )
    assert [r.status for r in store.load_steps("r1")] == ["completed", "completed"]


def test_a_signal_is_consumed_by_one_wait_only(store: Store) -> None:
    epoch = _running(store)
    sid = store.send_signal("r1", "go", "1", T0)
    first = RunWrite(run_id="r1", epoch=epoch, consume=[(sid, "0:0")])
    second = RunWrite(run_id="r1", epoch=epoch, consume=[(sid, "0:1")])
    # In one batch (group commit) and in two.
    ok, lost = store.commit([first, second], T0)
    assert ok.ok and not lost.ok and lost.conflict is not None and "0:0" in lost.conflict
    [again] = store.commit([second], T0 + 1)
    assert not again.ok
    assert store.commit([first], T0 + 2) == [WriteResult(ok=True)]  # a re-send is fine
    assert store.next_signal("r1", "go") is None


def test_concurrent_submits_with_one_key_all_get_one_run(db_url: str) -> None:
    _race_submits(db_url, threads=6, keys=5)


@pytest.mark.slow
def test_concurrent_submits_with_one_key_all_get_one_run_many(db_url: str) -> None:
    _race_submits(db_url, threads=8, keys=60)


def _race_submits(db_url: str, *, threads: int, keys: int) -> None:
    app = ms.App(db_url)

    @app.workflow
    async def wf(ctx: ms.RunContext, n: int) -> int:
        return n

    try:
        for k in range(keys):
            got, errors = _submit_together(app, wf, k, threads)
            assert errors == []
            assert len(got) == threads and len(set(got)) == 1
        assert sum(app.store.count_runs().values()) == keys
    finally:
        app.close()


def _submit_together(
    app: ms.App, wf: Any, k: int, threads: int
) -> tuple[list[str], list[BaseException]]:
    """``threads`` submits of one key, released at once, each on its own connection."""
    barrier = threading.Barrier(threads)
    got: list[str] = []
    errors: list[BaseException] = []

    def submit() -> None:
        barrier.wait()
        try:
            got.append(app.submit(wf, k, key=f"key-{k}").run_id)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=submit) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return got, errors


# -- through the engine ---------------------------------------------------------------


async def test_an_ambiguous_finish_is_a_success_with_one_event(db_url: str) -> None:
    app = ms.App(db_url, poll_interval_s=0.01)
    app.store.add_webhook("http://127.0.0.1:9/hook", 0.0)
    commit = app.store.commit
    finishes = 0

    def ambiguous(batch: Any, now: float) -> list[WriteResult]:
        nonlocal finishes
        results = commit(batch, now)
        if any(w.transition is not None and w.transition.kind == "finish" for w in batch):
            finishes += 1
            if finishes == 1:
                raise ms.StoreUnavailable("connection reset after COMMIT was sent")
        return results

    app.store.commit = ambiguous  # type: ignore[method-assign]

    @app.workflow
    async def wf(ctx: ms.RunContext) -> int:
        return int(await ctx.step(lambda: 7, name="seven"))

    try:
        handle = app.submit(wf)
        worker = await drain(app)
        assert worker.stats.outcomes == {"succeeded": 1}
        assert await handle.result() == 7
        assert _events(app.store, handle.run_id, "run.succeeded") == 1
    finally:
        app.close()


async def test_an_ambiguous_continue_as_new_runs_each_session_once(db_url: str) -> None:
    app = ms.App(db_url, poll_interval_s=0.01)
    commit = app.store.commit
    calls: list[tuple[int, str]] = []
    failed = False

    def ambiguous(batch: Any, now: float) -> list[WriteResult]:
        nonlocal failed
        results = commit(batch, now)
        if not failed and any(
            w.transition is not None and w.transition.kind == "next_session" for w in batch
        ):
            failed = True
            raise ms.StoreUnavailable("connection reset after COMMIT was sent")
        return results

    app.store.commit = ambiguous  # type: ignore[method-assign]

    def effect() -> str:
        calls.append((ms.current_step().session, ms.current_step().idempotency_key))
        return "ok"

    @app.workflow
    async def wf(ctx: ms.RunContext) -> int:
        await ctx.step(effect)
        if ctx.session < 2:
            ctx.continue_as_new(ctx.session)
        return ctx.session

    try:
        handle = app.submit(wf)
        await drain(app)
        assert await handle.result() == 2
        assert [s for s, _ in calls] == [0, 1, 2]
        # The store agrees with the worker: a replay would load the session that ran.
        assert app.get_run(handle.run_id).session == 2
    finally:
        app.close()


async def test_a_busy_retry_never_reverts_a_parallel_completed_step(db_url: str) -> None:
    """gather: the flush of B (holding A's intent) is answered busy, A completes, then
    B's flush is retried: A's row must stay completed."""
    app = ms.App(db_url, poll_interval_s=0.01)
    commit = app.store.commit
    answered = 0
    rank = {"started": 0, "retrying": 1, "completed": 2, "failed": 2}
    stored: dict[int, tuple[int, int]] = {}  # seq -> (attempt, rank) committed
    stale: list[tuple[int, str]] = []  # rows sent older than what was committed

    def busy_twice(batch: Any, now: float) -> list[WriteResult]:
        nonlocal answered
        for w in batch:
            for r in w.steps:
                if (r.attempt, rank[r.status]) < stored.get(r.seq, (0, -1)):
                    stale.append((r.seq, r.status))
        if answered < 2 and any(s.status == "started" for w in batch for s in w.steps):
            answered += 1  # nothing is written: what a row lock or busy timeout gives
            return [WriteResult(ok=False, busy=True) for _ in batch]
        results = commit(batch, now)
        for w, res in zip(batch, results, strict=True):
            for r in w.steps if res.ok else ():
                stored[r.seq] = max(stored.get(r.seq, (0, -1)), (r.attempt, rank[r.status]))
        return results

    app.store.commit = busy_twice  # type: ignore[method-assign]
    charged: list[int] = []

    async def charge() -> str:
        charged.append(1)
        return "charged"

    async def other() -> str:
        await asyncio.sleep(0.3)
        return "other"

    @app.workflow
    async def wf(ctx: ms.RunContext) -> list[str]:
        return list(
            await asyncio.gather(
                ctx.step(charge, mode="at_most_once"), ctx.step(other, name="other")
            )
        )

    try:
        handle = app.submit(wf)
        await drain(app)
        assert await handle.result() == ["charged", "other"]
        rows = app.observe.steps(handle.run_id)
        assert [(r.name.rsplit(".", 1)[-1], r.status) for r in rows] == [
            ("charge", "completed"),
            ("other", "completed"),
        ]
        assert charged == [1]
        assert stale == []  # the retry sent what was buffered then, not its old snapshot
    finally:
        app.close()


async def test_gathered_waits_on_one_name_take_different_signals(db_url: str) -> None:
    """Group commit (several runs in one worker): the second wait must not be handed
    the signal the first took before its commit landed."""
    app = ms.App(db_url, poll_interval_s=0.01)

    @app.workflow
    async def wf(ctx: ms.RunContext) -> list[int]:
        got = await asyncio.gather(ctx.wait_for("go"), ctx.wait_for("go"))
        return sorted(int(g) for g in got)

    try:
        handles = [app.submit(wf) for _ in range(4)]
        for h in handles:
            app.signal(h.run_id, "go", 1)
            app.signal(h.run_id, "go", 2)
        await drain(app)
        for h in handles:
            assert await h.result() == [1, 2]
            steps = app.observe.steps(h.run_id)
            assert len({s.output for s in steps}) == 2
    finally:
        app.close()


async def test_a_run_incompatible_code_left_never_reruns_a_completed_step(db_url: str) -> None:
    charged: list[int] = []

    async def charge() -> str:
        charged.append(1)
        return "charged"

    async def other() -> str:
        return "other"

    def v1_app() -> ms.App:
        app = ms.App(db_url, poll_interval_s=0.01)

        @app.workflow(name="flow")
        async def flow(ctx: ms.RunContext) -> str:
            await ctx.step(charge, mode="at_most_once")
            return str(await ctx.wait_for("go"))

        return app

    v1 = v1_app()
    handle = v1.submit("flow")
    await drain(v1)
    v1.close()

    v2 = ms.App(db_url, poll_interval_s=0.01)

    @v2.workflow(name="flow")
    async def flow_v2(ctx: ms.RunContext) -> str:
        await ctx.step(other)  # where the journal has the completed charge
        return str(await ctx.wait_for("go"))

    v2.signal(handle.run_id, "go", "x")
    await drain(v2)
    # Code that cannot replay the run leaves it for code that can (docs/workflows.md,
    # rolling deploys): never failed, nothing of it re-run.
    run = v2.get_run(handle.run_id)
    assert (run.status, run.wait_reason) == ("sleeping", "replay"), run
    v2.close()

    fixed = v1_app()  # the code is put back: its worker takes the run on
    try:
        await drain(fixed)
        assert await fixed.result(handle.run_id) == "x"
        assert charged == [1]
    finally:
        fixed.close()


def test_retry_keeps_completed_rows_and_moves_the_fence(store: Store) -> None:
    epoch = _running(store)
    store.commit(
        [
            RunWrite(
                run_id="r1",
                epoch=epoch,
                steps=[
                    _row("r1", 0, "completed", epoch=epoch),
                    _row("r1", 1, "failed", epoch=epoch),
                    _row("r1", 2, "completed", epoch=epoch),
                ],
                transition=RunTransition(kind="finish", status="failed", error='{"type":"X"}'),
            )
        ],
        T0,
    )
    failed = store.get_run("r1")
    assert failed is not None
    run = store.retry_run("r1", from_seq=0, now=T0 + 1)
    assert run.status == "queued" and run.epoch == failed.epoch + 1
    assert [(r.seq, r.status) for r in store.load_steps("r1")] == [
        (0, "completed"),
        (2, "completed"),
    ]
    assert json.loads(store.get_run("r1").error or "null") is None  # type: ignore[union-attr]


async def test_a_stalled_holder_cannot_revive_a_dead_lettered_run(db_url: str) -> None:
    """The holder stalls inside a step past its lease, the run is dead-lettered, then
    the holder wakes up: nothing it does lands, and its next step never runs."""
    clock = ms.FakeClock()
    app = ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0)
    app.store.add_webhook("http://127.0.0.1:9/hook", 0.0)
    stalled = asyncio.Event()
    wake = asyncio.Event()
    ran: list[int] = []

    async def work(i: int) -> int:
        ran.append(i)
        if i == 0:
            stalled.set()
            await wake.wait()
        return i

    @app.workflow
    async def wf(ctx: ms.RunContext) -> int:
        return sum([await ctx.step(work, i) for i in range(2)])

    try:
        handle = app.submit(wf)
        holder = app.worker(concurrency=1)  # no free slot: it cannot take its own run over
        task = asyncio.create_task(holder.run(until_idle=True))
        await asyncio.wait_for(stalled.wait(), 10)
        clock.advance(app.lease_s + 1)
        assert _claim(app.store, handle.run_id, clock.now(), max_recoveries=0) == []
        wake.set()
        await asyncio.wait_for(task, 10)
        assert holder.stats.outcomes == {"lost": 1}
        run = app.get_run(handle.run_id)
        assert run.status == "failed" and "dead-lettered" in (run.error or "")
        assert ran == [0]  # the step after the dead-letter never ran
        assert [s.status for s in app.observe.steps(handle.run_id)] == ["started"]
        assert [e["event"] for e in app.store.outbox(handle.run_id)] == ["run.failed"]
    finally:
        app.close()


def test_fork_copies_the_session_it_was_asked_for(store: Store) -> None:
    epoch = _running(store)
    store.commit(
        [
            RunWrite(
                run_id="r1",
                epoch=epoch,
                steps=[_row("r1", 0, "completed", epoch=epoch)],
                transition=RunTransition(kind="next_session", handoff='{"n":1}', session=0),
            )
        ],
        T0,
    )
    stale = store.get_run("r1")
    assert stale is not None and stale.session == 1
    fork = store.fork_run(stale, run_id="f1", session=1, upto_seq=0, output=None, now=T0)
    assert (fork.session, fork.handoff) == (1, '{"n":1}')
    store.commit(
        [
            RunWrite(
                run_id="r1",
                epoch=epoch,
                transition=RunTransition(kind="next_session", handoff='{"n":2}', session=1),
            )
        ],
        T0 + 1,
    )
    # The caller's record is of session 1; the run has moved on: that record's
    # hand-off is still session 1's.
    again = store.fork_run(stale, run_id="f2", session=1, upto_seq=0, output=None, now=T0 + 2)
    assert (again.session, again.handoff) == (1, '{"n":1}')


@pytest.mark.parametrize("stall", [False, True])
async def test_a_worker_stalled_after_a_steps_intent_starts_nothing_of_a_run_taken_over(
    db_url: str, stall: bool
) -> None:
    """The process freezes (SIGSTOP, a long pause) right after a step's intent row
    committed and before its function starts; meanwhile its lease runs out and another
    worker takes the run over. Thawed, it used to start the function anyway, beside the
    new holder. Its run last proven its own more than half a lease before, it now sends
    the intent through the fence again first, finds the run taken and stops."""
    from mainspring.testing import FaultyStore

    inner = open_store(db_url)
    clock = ms.FakeClock()
    calls: list[str] = []

    def takeover(method: str, args: Any, kwargs: Any, result: Any) -> None:
        batch = kwargs.get("batch", args[0] if args else [])
        intent = method == "commit" and any(
            s.name.endswith("charge") and s.status == "started" for w in batch for s in w.steps
        )
        if intent and stall and not calls:
            calls.append("stalled")
            clock.advance(10.0 + 1)  # past the lease, between the commit and the function
            inner.claim(
                worker="other", now=clock.now(), lease_s=10.0, limit=1, workflows=None,
                max_recoveries=5,
            )  # fmt: skip

    app = ms.App(
        FaultyStore(inner, after_call=takeover), clock=clock, lease_s=10.0, poll_interval_s=0.01
    )

    def charge() -> str:
        calls.append("charged")
        return "ok"

    @app.workflow
    async def pay(ctx: ms.RunContext) -> str:
        return await ctx.step(charge)

    try:
        run_id = app.submit(pay).run_id
        await asyncio.wait_for(app.worker().run(until_idle=True), 30)
        run = inner.get_run(run_id)
        assert run is not None
        if stall:
            assert calls == ["stalled"]  # the stale worker never charged
            assert (run.status, run.owner, run.epoch) == ("running", "other", 2)
        else:  # no stall: no extra commit, nothing in the way
            assert calls == ["charged"] and run.status == "succeeded"
    finally:
        app.close()
