"""Sync (``def``) step functions: they run on a thread, their ``timeout=`` holds, a slow
or hung one never holds the event loop, and their context (the current step) is theirs.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest

import mainspring as ms
from mainspring.storage import RunWrite, open_store
from mainspring.testing import FaultyStore


def quick(i: int) -> dict[str, object]:
    info = ms.current_step()
    on_main = threading.current_thread() is threading.main_thread()
    return {"i": i, "seq": info.seq, "thread": on_main}


async def many_quick(ctx: ms.RunContext, n: int) -> list[dict[str, object]]:
    return [await ctx.step(quick, i) for i in range(n)]


async def test_sync_steps_run_on_threads_with_their_step_info(app: ms.App) -> None:
    app.workflow(many_quick)
    out = await app.run("many_quick", 5)
    assert [x["i"] for x in out] == list(range(5))
    assert [x["seq"] for x in out] == list(range(5))
    assert not any(x["thread"] for x in out)  # never on the event loop's thread


release = threading.Event()


def hangs() -> str:
    release.wait(30)
    return "late"


def raises() -> str:
    raise SystemExit(3)  # from user code in a thread: a failed attempt, as any error


async def system_exit(ctx: ms.RunContext) -> str:
    try:
        return await ctx.step(raises, retry=ms.RetryPolicy.never())
    except ms.StepFailed as exc:
        return exc.error_type


@pytest.mark.parametrize("timeout_s", [0.0005, 0.05])
async def test_a_timeout_shorter_or_longer_than_the_short_wait_holds(
    app: ms.App, timeout_s: float
) -> None:
    async def wf(ctx: ms.RunContext) -> list[object]:
        try:
            await ctx.step(hangs, timeout=timeout_s, retry=ms.RetryPolicy.never())
        except ms.StepFailed as exc:
            error = exc.error_type
        # the abandoned attempt still holds its thread: the next steps run on others
        return [error, await ctx.step(quick, 7), await ctx.step(quick, 8)]

    app.workflow(name=f"times_out_{timeout_s}")(wf)
    release.clear()
    try:
        error, a, b = await app.run(f"times_out_{timeout_s}")
    finally:
        release.set()
    assert error == "mainspring._errors.StepTimeout"
    assert (a["i"], b["i"]) == (7, 8)  # type: ignore[index]


async def test_system_exit_in_a_sync_step_is_a_failed_attempt(app: ms.App) -> None:
    app.workflow(system_exit)
    assert await app.run("system_exit") == "builtins.SystemExit"


async def test_a_hung_sync_step_without_timeout_leaves_the_loop_free(app: ms.App) -> None:
    """The run is alone in its worker (the loop's thread may block briefly for its
    result): the step hangs, and the loop still runs other tasks meanwhile."""

    async def waits(ctx: ms.RunContext) -> str:
        return str(await ctx.step(hangs))

    app.workflow(waits)
    release.clear()
    task = asyncio.create_task(app.run("waits"))
    ticks = 0
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            ticks += 1
        assert not task.done()
        assert ticks >= 10  # the loop went on while the step hung
    finally:
        release.set()
    assert await asyncio.wait_for(task, 30) == "late"


def sleeps(i: int, seconds: float) -> int:
    time.sleep(seconds)
    return i


async def around_the_short_wait(ctx: ms.RunContext, n: int) -> list[int]:
    # Durations on both sides of the loop's short wait (1 ms): each result comes back
    # either through the blocking wait or through the event loop, and the hand-off
    # of the next call must never take the previous call's end for its own.
    return [await ctx.step(sleeps, i, (0.0003, 0.0012, 0.0, 0.002)[i % 4]) for i in range(n)]


async def test_results_around_the_short_wait_come_back_in_order(app: ms.App) -> None:
    app.workflow(around_the_short_wait)
    assert await app.run("around_the_short_wait", 60) == list(range(60))


async def test_concurrent_runs_share_the_warm_thread_and_the_pool(app: ms.App) -> None:
    app.workflow(around_the_short_wait)
    outs = await asyncio.gather(*(app.run("around_the_short_wait", 12) for _ in range(4)))
    assert outs == [list(range(12))] * 4


async def test_after_an_abandoned_step_ends_sync_steps_still_run(app: ms.App) -> None:
    async def wf(ctx: ms.RunContext) -> list[object]:
        with pytest.raises(ms.StepFailed):
            await ctx.step(hangs, timeout=0.01, retry=ms.RetryPolicy.never())
        release.set()  # the abandoned call ends: its thread takes calls again
        await asyncio.sleep(0.05)
        return [(await ctx.step(quick, i))["i"] for i in range(20)]

    app.workflow(name="abandoned_then_quick")(wf)
    release.clear()
    try:
        assert await app.run("abandoned_then_quick") == list(range(20))
    finally:
        release.set()


# -- a sync step the run's end stops: its thread is waited for ---------------------------


def _watch_ends(ended: threading.Event, seen: list[bool]) -> Any:
    """A ``FaultyStore`` hook: whether the sync step had ended (``ended``) at each
    commit that ended a run."""

    def hook(method: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        batch = kwargs.get("batch", args[0] if args else [])
        if method == "commit":
            seen.extend(ended.is_set() for w in batch if _ends(w))

    return hook


def _ends(w: RunWrite) -> bool:
    return w.transition is not None and w.transition.kind == "finish"


@pytest.mark.parametrize("how", ["gather", "cancel"])
async def test_a_sync_step_the_end_stops_has_ended_before_the_run_ends(
    db_url: str, how: str
) -> None:
    """``gather(step(a), step(b))`` where ``a`` fails and the workflow handles it (or a
    cancel of the run, which its worker carries out at once, while ``b`` runs): ``b``'s
    thread cannot be stopped. The run's end waits for it and journals how it ended;
    before, the run ended at once with ``b`` journaled ``failed (Cancelled)`` while
    ``b``'s effect happened afterwards."""
    ended, seen = threading.Event(), list[bool]()
    store = FaultyStore(open_store(db_url), after_call=_watch_ends(ended, seen))
    app = ms.App(store, lease_s=5.0, heartbeat_s=0.05, poll_interval_s=0.02)
    try:
        await _stopped_sync_step(app, how, ended, seen)
    finally:
        app.close()


async def _stopped_sync_step(
    app: ms.App, how: str, ended: threading.Event, seen: list[bool]
) -> None:
    finished = threading.Event()
    effects: list[str] = []

    def fails() -> None:
        raise ValueError("a fails")

    def effect() -> str:
        started.set()
        finished.wait(2.0)  # until the run's end commits (before the fix), or 2 s
        effects.append("b")
        ended.set()
        return "b done"

    started = threading.Event()
    never = ms.RetryPolicy.never()

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        try:
            if how == "gather":
                await asyncio.gather(ctx.step(fails, retry=never), ctx.step(effect, name="b"))
            else:
                await ctx.step(effect, name="b")
        except ms.StepFailed:
            return "handled"
        return "no"

    run_id = app.submit(wf).run_id
    worker = app.worker()
    task = asyncio.create_task(worker.run(until_idle=True))
    if how == "cancel":
        await asyncio.to_thread(started.wait, 10)
        assert app.cancel(run_id, "stop") == "running"
    await asyncio.wait_for(task, 30)
    finished.set()
    assert seen == [True]  # the run's end committed after b's thread returned
    run = app.get_run(run_id)
    assert run.status == ("succeeded" if how == "gather" else "cancelled")
    [b] = [r for r in app.observe.steps(run_id) if r.name == "b"]
    assert (b.status, b.output) == ("completed", '"b done"')  # what really happened
    assert effects == ["b"]


async def test_a_stopped_sync_step_past_its_timeout_is_journaled_as_unknown(app: ms.App) -> None:
    release = threading.Event()

    def fails() -> None:
        raise ValueError("a fails")

    def stuck() -> str:
        release.wait(10)
        return "late"

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        try:
            await asyncio.gather(
                ctx.step(fails, retry=ms.RetryPolicy.never()),
                ctx.step(stuck, name="stuck", timeout=0.3),
            )
        except ms.StepFailed:
            return "handled"
        return "no"

    try:
        run_id = app.submit(wf).run_id
        await asyncio.wait_for(app.worker().run(until_idle=True), 30)
        assert app.get_run(run_id).status == "succeeded"
        [row] = [r for r in app.observe.steps(run_id) if r.name == "stuck"]
        error = json.loads(row.error or "{}")
        assert (row.status, error["type"].rsplit(".", 1)[-1]) == ("failed", "StepInterrupted")
        assert "may or may not take effect" in error["message"]
    finally:
        release.set()
