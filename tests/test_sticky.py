"""Sticky executions (issue 18, item 1): a worker resumes the live execution of a run
it suspended instead of replaying it, and the two paths give the same journal and
result. A takeover, an eviction, a restart or a cancel drop the kept execution; a
dropped or stale one can never commit (the fence)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mainspring as ms
from mainspring.journal import RunControl
from mainspring.storage import RunRecord

Action = tuple[Any, ...]


def make_app(tmp_path: Path, name: str) -> tuple[ms.App, ms.FakeClock]:
    clock = ms.FakeClock()
    app = ms.App(
        f"sqlite:///{tmp_path / name}.db",
        clock=clock,
        poll_interval_s=0.002,
        inline_wait_s=0.0,
        lease_s=30.0,
    )
    return app, clock


async def stable(app: ms.App, clock: ms.FakeClock, run_id: str) -> RunRecord:
    """Until the run is finished or suspended and not yet due (the worker is done with
    it for now)."""
    for _ in range(5000):
        record = app.get_run(run_id)
        if record.finished or (
            record.status in ("sleeping", "waiting")
            and (record.wake_at is None or record.wake_at > clock.now())
        ):
            await asyncio.sleep(0.005)  # the worker's own end of the execution
            return app.get_run(run_id)
        await asyncio.sleep(0.002)
    raise AssertionError(f"run {run_id} never settled: {app.get_run(run_id)}")


def journal(app: ms.App, run_id: str) -> list[tuple[Any, ...]]:
    return [
        (
            r.session,
            r.seq,
            r.kind,
            r.name,
            r.status,
            r.attempt,
            r.epoch,
            r.output,
            r.error,
            r.started_at,
            r.finished_at,
            r.wake_at,
        )
        for r in app.observe.steps(run_id)
    ]


def run_row(record: RunRecord) -> tuple[Any, ...]:
    return (record.status, record.output, record.session, record.epoch, record.wait_reason)


async def play(
    tmp_path: Path,
    name: str,
    define: Callable[[ms.App], Any],
    args: tuple[Any, ...],
    actions: list[Action],
    *,
    sticky: bool,
    **options: Any,
) -> tuple[list[tuple[Any, ...]], tuple[Any, ...], list[tuple[Any, ...]], ms.Worker]:
    """Run ``define``'s workflow under one worker, acting between suspensions; the
    journal, the run's row, the run's row after each action, and the worker."""
    app, clock = make_app(tmp_path, name)
    wf = define(app)
    handle = app.submit(wf, *args)
    worker = app.worker(sticky=sticky, **options)
    task = asyncio.create_task(worker.run())
    rows = [run_row(await stable(app, clock, handle.run_id))]
    for action in actions:
        if action[0] == "advance":
            clock.advance(action[1])
        elif action[0] == "signal":
            app.signal(handle.run_id, action[1], action[2])
        elif action[0] == "answer":
            app.answer(handle.run_id, action[1], decision=action[2], by="tester")
        elif action[0] == "cancel":
            app.cancel(handle.run_id)
        worker.wake()
        rows.append(run_row(await stable(app, clock, handle.run_id)))
    worker.request_stop()
    await asyncio.wait_for(task, 10)
    result = app.get_run(handle.run_id)
    app.close()
    return journal(app, handle.run_id), run_row(result), rows, worker


async def both(
    tmp_path: Path,
    define: Callable[[ms.App], Any],
    args: tuple[Any, ...],
    actions: list[Action],
    **options: Any,
) -> tuple[tuple[Any, ...], ms.Worker]:
    """Play sticky and not; assert the same journals and rows; the final row."""
    sticky = await play(tmp_path, "sticky", define, args, actions, sticky=True, **options)
    replay = await play(tmp_path, "replay", define, args, actions, sticky=False)
    assert sticky[0] == replay[0]  # the journal, row for row (epochs and times too)
    assert sticky[2] == replay[2]  # the run's row after every action
    assert sticky[1] == replay[1]
    assert replay[3].stats.resumed == 0
    return sticky[1], sticky[3]


RETRY = ms.RetryPolicy(initial_s=5.0, jitter=False)
ENTRIES: list[int] = []  # one per entry into sleeps_and_waits's workflow


def sleeps_and_waits(app: ms.App) -> Any:
    entries = ENTRIES
    fails = {"n": 0}

    def flaky(i: int) -> int:
        fails["n"] += 1
        if fails["n"] == 2:
            raise RuntimeError("once")
        return i

    @app.workflow
    async def wf(ctx: ms.RunContext, n: int) -> list[Any]:
        entries.append(1)
        out: list[Any] = []
        for i in range(n):
            out.append(
                await ctx.step(
                    flaky, i, name="flaky", retry=ms.RetryPolicy(initial_s=5.0, jitter=False)
                )
            )
            await ctx.sleep(10)
        out.append(await ctx.wait_for("go", timeout=100, default="timed out"))
        out.append(await ctx.wait_for("late", timeout=50, default="no late"))
        out.append(ctx.now().isoformat())
        out.extend(await asyncio.gather(ctx.wait_for("a"), ctx.wait_for("b"), ctx.sleep(30)))
        approval = await ctx.approval("ship", preview={"v": 1})
        out.append(approval.approved)
        return out

    return wf


SCRIPT: list[Action] = [
    ("advance", 10),  # the sleep ends; the flaky step fails once: a retry in 5 s
    ("advance", 5),
    ("advance", 10),
    ("advance", 10),  # waiting for "go"
    ("signal", "go", "G"),  # waiting for "late"
    ("advance", 50),  # "late" timed out; waiting for a, b and a sleep
    ("signal", "b", "B"),
    ("signal", "a", "A"),
    ("advance", 30),  # waiting for the approval
    ("answer", "approval:ship", "approve"),
]


async def test_sticky_and_replay_give_the_same_journal_and_result(tmp_path: Path):
    final, worker = await both(tmp_path, sleeps_and_waits, (3,), SCRIPT)
    assert final[0] == "succeeded"
    assert worker.stats.resumed >= 8  # it did resume, not replay
    assert worker.kept == []  # a stopped worker keeps nothing


async def test_a_kept_execution_is_entered_once(tmp_path: Path):
    app, clock = make_app(tmp_path, "once")
    wf = sleeps_and_waits(app)
    ENTRIES.clear()
    handle = app.submit(wf, 3)
    worker = app.worker(sticky=True)
    task = asyncio.create_task(worker.run())
    await stable(app, clock, handle.run_id)
    for action in SCRIPT:
        if action[0] == "advance":
            clock.advance(action[1])
        elif action[0] == "answer":
            app.answer(handle.run_id, action[1], decision=action[2], by="tester")
        else:
            app.signal(handle.run_id, action[1], action[2])
        worker.wake()
        await stable(app, clock, handle.run_id)
    worker.request_stop()
    await task
    assert app.get_run(handle.run_id).status == "succeeded"
    assert ENTRIES == [1]  # never replayed from the top


def catching(app: ms.App) -> Any:
    """User code that catches everything around its waits, and a stray task."""
    seen: list[str] = []

    @app.workflow
    async def wf(ctx: ms.RunContext) -> list[str]:
        for i in range(3):
            try:
                await ctx.sleep(10)
            except BaseException as exc:  # hostile on purpose
                seen.append(type(exc).__name__)
                raise
            finally:
                seen.append(f"finally {i}")
        try:
            value = await ctx.wait_for("x")
        except BaseException:
            seen.append("caught")
            raise
        return [str(value), str(await ctx.step(lambda: "done", name="end"))]

    return wf


async def test_user_code_catching_base_exceptions_behaves_the_same(tmp_path: Path):
    actions: list[Action] = [("advance", 10)] * 3 + [("signal", "x", "X")]
    final, _ = await both(tmp_path, catching, (), actions)
    assert final[:2] == ("succeeded", '["X","done"]')


def continuing(app: ms.App) -> Any:
    @app.workflow
    async def wf(ctx: ms.RunContext, left: int) -> int:
        if ctx.handoff is not None:
            left = int(ctx.handoff)
        await ctx.step(lambda: left, name="s")
        await ctx.sleep(5)
        if left > 0:
            ctx.continue_as_new(left - 1)
        return int(await ctx.wait_for("end"))

    return wf


async def test_continue_as_new_is_the_same(tmp_path: Path):
    actions: list[Action] = [("advance", 5)] * 3 + [("signal", "end", 7)]
    final, worker = await both(tmp_path, continuing, (2,), actions)
    assert final[:3] == ("succeeded", "7", 2)
    assert worker.stats.resumed >= 3


def racing(app: ms.App) -> Any:
    @app.workflow
    async def wf(ctx: ms.RunContext) -> list[str]:
        approve = asyncio.ensure_future(ctx.wait_for("approve"))
        reject = asyncio.ensure_future(ctx.wait_for("reject"))
        done, pending = await asyncio.wait([approve, reject], return_when="FIRST_COMPLETED")
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        first = "approve" if approve in done else f"reject {reject.result()}"
        both_ = await asyncio.gather(ctx.wait_for("n", timeout=20, default="-"), ctx.sleep(8))
        return [first, str(both_[0]), str(await ctx.wait_for("next"))]

    return wf


async def test_concurrent_waits_and_the_idle_heuristic_are_the_same(tmp_path: Path):
    actions: list[Action] = [
        ("signal", "reject", "R"),
        ("advance", 8),
        ("advance", 12),
        ("signal", "approve", "late"),
        ("signal", "next", "N"),
    ]
    final, worker = await both(tmp_path, racing, (), actions)
    assert final[:2] == ("succeeded", '["reject R","-","N"]')
    assert worker.stats.resumed >= 3


def signalled_early(app: ms.App) -> Any:
    @app.workflow
    async def wf(ctx: ms.RunContext) -> list[Any]:
        await ctx.sleep(10)
        first = await ctx.wait_for("s")  # its signal arrived while the run slept
        second = await ctx.wait_for("s")  # the second signal of the same name
        return [first, second]

    return wf


async def test_signals_sent_while_suspended_are_seen_as_on_replay(tmp_path: Path):
    actions: list[Action] = [("signal", "s", 1), ("signal", "s", 2), ("advance", 10)]
    final, worker = await both(tmp_path, signalled_early, (), actions)
    assert final[:2] == ("succeeded", "[1,2]")
    assert worker.stats.resumed == 1


async def test_cancel_while_suspended_drops_the_kept_execution(tmp_path: Path):
    actions: list[Action] = [("advance", 5), ("cancel",), ("advance", 31)]
    final, _ = await both(tmp_path, sleeps_and_waits, (3,), actions)
    assert final[0] == "cancelled"


async def test_lru_eviction_replays_the_evicted_run(tmp_path: Path):
    app, clock = make_app(tmp_path, "lru")
    entries: dict[int, int] = {}

    @app.workflow
    async def wf(ctx: ms.RunContext, k: int) -> int:
        entries[k] = entries.get(k, 0) + 1
        total = 0
        for i in range(3):
            total += await ctx.step(lambda i=i: i * k, name="s")
            await ctx.sleep(10 + k)  # the runs wake in order 0, 1, 2
        return total

    handles = [app.submit(wf, k) for k in range(3)]
    worker = app.worker(sticky=True, sticky_runs=2)
    task = asyncio.create_task(worker.run())
    for h in handles:
        await stable(app, clock, h.run_id)
    for _ in range(1000):  # the worker's own end of the three executions
        if worker.stats.outcomes.get("suspended", 0) == 3:
            break
        await asyncio.sleep(0.002)
    # Room for two: the run that suspended first (they run concurrently, so any of
    # them) was evicted, the other two are kept.
    assert len(worker.kept) == 2 and set(worker.kept) < {h.run_id for h in handles}
    for _ in range(3):
        clock.advance(13)
        worker.wake()
        for h in handles:
            await stable(app, clock, h.run_id)
    worker.request_stop()
    await task
    assert [await h.result() for h in handles] == [0, 3, 6]
    # Each wake-up of three suspended runs with room for two: one replay at least.
    assert sum(entries.values()) > 3 and worker.stats.resumed >= 3


async def test_a_restart_replays_and_gives_the_same_result(tmp_path: Path):
    app, clock = make_app(tmp_path, "restart")
    wf = sleeps_and_waits(app)
    handle = app.submit(wf, 2)
    for action in SCRIPT:
        worker = app.worker(sticky=True)
        task = asyncio.create_task(worker.run())
        await stable(app, clock, handle.run_id)
        worker.request_stop()  # a new worker for every wake-up: always a replay
        await task
        assert worker.stats.resumed == 0
        if action[0] == "advance":
            clock.advance(action[1])
        elif action[0] == "answer":
            app.answer(handle.run_id, action[1], decision=action[2], by="tester")
        else:
            app.signal(handle.run_id, action[1], action[2])
    worker = app.worker(sticky=True)
    task = asyncio.create_task(worker.run())
    await stable(app, clock, handle.run_id)
    worker.request_stop()
    await task
    reference = await play(tmp_path, "ref", sleeps_and_waits, (2,), SCRIPT, sticky=False)
    assert journal(app, handle.run_id) == reference[0]
    assert run_row(app.get_run(handle.run_id)) == reference[1]


def sleep_then_step(app: ms.App) -> Any:
    @app.workflow
    async def wf(ctx: ms.RunContext) -> int:
        await ctx.sleep(10)
        return int(await ctx.step(lambda: 1, name="after"))

    return wf


async def test_a_takeover_drops_the_held_execution_and_it_can_never_commit(tmp_path: Path):
    app, clock = make_app(tmp_path, "takeover")
    wf = sleep_then_step(app)
    handle = app.submit(wf)
    holder = app.worker(sticky=True, worker_id="holder")
    task = asyncio.create_task(holder.run())
    await stable(app, clock, handle.run_id)
    assert holder.kept == [handle.run_id]
    holder.request_stop()  # keep the execution alive for the test: take it from the worker
    kept = holder._kept.take(handle.run_id)
    assert kept is not None
    await task
    # Another worker takes the run over and finishes it (by replay).
    clock.advance(10)
    other = app.worker(sticky=False, worker_id="other")
    await asyncio.wait_for(other.run(until_idle=True), 10)
    assert await handle.result() == 1
    before = journal(app, handle.run_id)
    # The held execution no longer fits the run (it moved on without it) ...
    assert not kept.fits(app.get_run(handle.run_id))
    # ... and even resumed by force at its old epoch, nothing it does is committed.
    stale = dataclasses.replace(app.get_run(handle.run_id), epoch=kept.cur.epoch)
    kept.wake(stale, RunControl())
    await asyncio.wait({kept.task}, timeout=5)
    raised, _ = kept.task.result()
    assert "LeaseLost" in repr(raised)  # the fence refused its commit: it stopped
    assert journal(app, handle.run_id) == before
    assert app.get_run(handle.run_id).status == "succeeded"
    kept.drop()


async def test_a_holder_sweeps_runs_taken_over_by_another_worker(tmp_path: Path):
    app, clock = make_app(tmp_path, "sweep")
    wf = signalled_early(app)
    handle = app.submit(wf)
    holder = app.worker(sticky=True, worker_id="holder")
    task = asyncio.create_task(holder.run())
    await stable(app, clock, handle.run_id)
    assert holder.kept == [handle.run_id]
    kept = holder._kept.get(handle.run_id)
    assert kept is not None
    # Another worker claims the run at its wake time before the holder does.
    other = app.worker(sticky=False, worker_id="other")
    app.signal(handle.run_id, "s", 1)
    app.signal(handle.run_id, "s", 2)
    holder_claim = holder._claim_kept
    holder._claim_kept = _nothing  # type: ignore[method-assign]
    holder._only = "nobody"  # the holder claims nothing now
    clock.advance(10)
    await asyncio.wait_for(other.run(until_idle=True), 10)
    assert await handle.result() == [1, 2]
    holder._claim_kept = holder_claim  # type: ignore[method-assign]
    clock.advance(31)  # a lease later, the holder checks what it keeps
    holder.wake()
    for _ in range(500):
        if not holder.kept:
            break
        await asyncio.sleep(0.005)
    assert holder.kept == []
    assert kept.dropped
    await asyncio.wait({kept.task}, timeout=5)
    assert kept.task.done()
    holder.request_stop()
    await task


async def _nothing(names: list[str], free: int) -> list[RunRecord]:
    return []


refused: list[str] = []


def stray(app: ms.App) -> Any:
    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        async def late() -> None:
            await asyncio.sleep(0.05)  # not durable: still running when the run suspends
            try:
                await ctx.step(lambda: 1, name="stray")
            except BaseException as exc:
                refused.append(type(exc).__name__)  # and the task ends quietly

        side = asyncio.ensure_future(late())
        await ctx.wait_for("go")
        with_side: list[Any] = await asyncio.gather(side, return_exceptions=True)
        return type(with_side[0]).__name__

    return wf


async def test_a_task_using_the_context_while_kept_spoils_it(tmp_path: Path):
    app, clock = make_app(tmp_path, "stray")
    wf = stray(app)
    handle = app.submit(wf)
    worker = app.worker(sticky=True)
    task = asyncio.create_task(worker.run())
    await stable(app, clock, handle.run_id)
    await asyncio.sleep(0.2)  # the stray task tries to use the dormant context
    app.signal(handle.run_id, "go", 1)
    worker.wake()
    record = await stable(app, clock, handle.run_id)
    worker.request_stop()
    await task
    assert record.status == "succeeded"
    assert worker.stats.resumed == 0  # spoiled: replayed instead
    assert refused[:1] == ["_Closed"]  # the dormant context refused the stray task
    assert [r.name for r in app.observe.steps(handle.run_id)][:1] == ["go"]


async def test_the_holder_claims_a_kept_run_at_its_wake_time(tmp_path: Path):
    # Polls are 10 s apart: only the holder's own timer can bring the run back on time.
    app = ms.App(f"sqlite:///{tmp_path / 'timer.db'}", poll_interval_s=10.0, inline_wait_s=0.0)

    @app.workflow
    async def wf(ctx: ms.RunContext) -> int:
        for _ in range(3):
            await ctx.sleep(0.2)
        return 3

    handle = app.submit(wf)
    worker = app.worker(sticky=True)
    task = asyncio.create_task(worker.run())
    started = asyncio.get_running_loop().time()
    while not app.get_run(handle.run_id).finished:
        assert asyncio.get_running_loop().time() - started < 3, "not back on time"
        await asyncio.sleep(0.02)
    assert app.get_run(handle.run_id).output == "3"
    assert worker.stats.resumed == 3
    worker.request_stop()
    await task
    app.close()
