"""Sync (``def``) step functions: they run on a thread, their ``timeout=`` holds, a slow
or hung one never holds the event loop, and their context (the current step) is theirs.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import mainspring as ms


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
