"""Forking a parent past the step that started a child run: the fork holds that start,
so it gets the child's end as the parent does (result, failure or cancel), whether the
child had ended when the fork was made or ends later, and so do forks of the fork."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from _helpers import drain

import mainspring as ms
from mainspring.testing import assert_invariants


@pytest.fixture
def fapp(db_url: str) -> ms.App:
    app = ms.App(db_url, clock=ms.FakeClock(), poll_interval_s=0.01, inline_wait_s=0.0)
    yield app
    app.close()


async def _result(run: ms.RunHandle) -> Any:
    """The result of a run that has ended (a run that still waits fails the test)."""
    return await asyncio.wait_for(run.result(), 10)


def _child_signals(app: ms.App, run_id: str) -> list[tuple[str, bool]]:
    """The child ends stored for a run: (name, consumed)."""
    return [
        (s.name, s.consumed_at is not None)
        for s in app.store.list_signals(run_id)
        if s.name.startswith("child:")
    ]


def _register(app: ms.App, *, fail: bool = False) -> None:
    """A child that answers once it is sent ``go`` (or fails then), and a parent that
    starts it (step 0) and waits for it (step 1), reporting a failure as a value."""

    @app.workflow
    async def research(ctx: ms.RunContext, topic: str) -> dict:
        said = await ctx.wait_for("go")
        if fail:
            raise ValueError(f"no sources on {topic} ({said})")
        return {"topic": topic, "said": said}

    @app.workflow
    async def report(ctx: ms.RunContext, topic: str) -> str:
        handle = await ctx.start_child(research, topic)
        try:
            found = await handle
        except ms.ChildFailed as exc:
            return f"{exc.status}: {exc.error['type']}: {exc.error['message']}"
        return f"{found['topic']} / {found['said']}"


async def test_a_fork_past_the_start_of_an_ended_child_gets_its_result(fapp: ms.App):
    _register(fapp)
    parent = fapp.submit("report", "tides")
    await drain(fapp)
    (kid,) = fapp.children(parent.run_id)
    fapp.signal(kid.id, "go", "low at six")
    await drain(fapp)
    assert await _result(parent) == "tides / low at six"

    at_start = fapp.fork(parent, from_step=0)  # the child's start, not its wait
    past_wait = fapp.fork(parent, from_step=1)  # and past the wait: replayed
    await drain(fapp)
    for fork in (at_start, past_wait):
        assert await _result(fork) == "tides / low at six"
    # the fork awaited the parent's child; it started none of its own
    assert len(fapp.list_runs(workflow="research")) == 1
    assert fapp.children(at_start.run_id) == []
    assert _child_signals(fapp, at_start.run_id) == [(f"child:{kid.id}", True)]
    assert _child_signals(fapp, past_wait.run_id) == []  # its copy holds the answer
    assert_invariants(fapp.store, now=fapp.clock.now(), settled=True)


async def test_a_fork_past_the_start_of_a_running_child_gets_its_result(fapp: ms.App):
    _register(fapp)
    parent = fapp.submit("report", "tides")
    await drain(fapp)
    (kid,) = fapp.children(parent.run_id)
    at_start = fapp.fork(parent, from_step=0)
    waiting = fapp.fork(parent, from_step=1)  # copies the parent's open wait
    await drain(fapp)
    for run in (parent, at_start, waiting):
        record = fapp.get_run(run.run_id)
        assert (record.status, record.wait_reason) == ("waiting", f"child:{kid.id}")
    # a fork of a fork, made while the child runs and before that fork ever ran
    grandchild_fork = fapp.fork(fapp.fork(at_start, from_step=0), from_step=0)

    fapp.signal(kid.id, "go", "high at noon")
    await drain(fapp)
    for run in (parent, at_start, waiting, grandchild_fork):
        assert await _result(run) == "tides / high at noon"
        assert _child_signals(fapp, run.run_id) == [(f"child:{kid.id}", True)]
    assert len(fapp.list_runs(workflow="research")) == 1
    assert_invariants(fapp.store, now=fapp.clock.now(), settled=True)


async def test_a_fork_of_a_fork_made_after_the_child_ended_gets_its_result(fapp: ms.App):
    _register(fapp)
    parent = fapp.submit("report", "tides")
    await drain(fapp)
    (kid,) = fapp.children(parent.run_id)
    first = fapp.fork(parent, from_step=0)
    await drain(fapp)  # the fork waits for the child, as its parent does
    fapp.signal(kid.id, "go", "slack")
    await drain(fapp)
    second = fapp.fork(first, from_step=0)  # the child has ended by now
    third = fapp.fork(second, from_step=0)  # and a fork of that, before it ran
    await drain(fapp)
    for run in (parent, first, second, third):
        assert await _result(run) == "tides / slack"
    assert len(fapp.list_runs(workflow="research")) == 1


@pytest.mark.parametrize("ended_first", [True, False], ids=["ended", "running"])
async def test_a_fork_sees_a_failed_child_as_its_parent_does(fapp: ms.App, ended_first: bool):
    _register(fapp, fail=True)
    parent = fapp.submit("report", "tides")
    await drain(fapp)
    (kid,) = fapp.children(parent.run_id)
    if ended_first:
        fapp.signal(kid.id, "go", "none")
        await drain(fapp)
    fork = fapp.fork(parent, from_step=0)
    fork_of_fork = fapp.fork(fork, from_step=0)
    if not ended_first:
        await drain(fapp)
        fapp.signal(kid.id, "go", "none")
    await drain(fapp)
    assert fapp.get_run(kid.id).status == "failed"
    seen = await _result(parent)
    assert seen.startswith("failed: ") and seen.endswith("ValueError: no sources on tides (none)")
    assert await _result(fork) == seen
    assert await _result(fork_of_fork) == seen


async def test_an_unhandled_child_failure_fails_the_fork_as_the_parent(fapp: ms.App):
    @fapp.workflow
    async def broken(ctx: ms.RunContext) -> int:
        await ctx.wait_for("go")
        raise RuntimeError("the upstream API refused")

    @fapp.workflow
    async def parent_wf(ctx: ms.RunContext) -> int:
        return await ctx.child(broken)

    parent = fapp.submit(parent_wf)
    await drain(fapp)
    (kid,) = fapp.children(parent.run_id)
    fork = fapp.fork(parent, from_step=0)
    await drain(fapp)
    fapp.signal(kid.id, "go")
    await drain(fapp)
    for run in (parent, fork):
        with pytest.raises(ms.RunFailed, match=r"ChildFailed: child run .* refused"):
            await _result(run)
        assert fapp.get_run(run.run_id).status == "failed"
        assert kid.id in fapp.get_run(run.run_id).error


async def test_cancelling_a_fork_leaves_the_child_it_shares_running(fapp: ms.App):
    _register(fapp)
    parent = fapp.submit("report", "tides")
    await drain(fapp)
    (kid,) = fapp.children(parent.run_id)
    fork = fapp.fork(parent, from_step=0)
    await drain(fapp)
    assert fapp.cancel(fork.run_id) == "cancelled"
    assert fapp.get_run(kid.id).status == "waiting"  # the parent's child, not the fork's
    fapp.signal(kid.id, "go", "ebb")
    await drain(fapp)
    assert await _result(parent) == "tides / ebb"
    assert fapp.get_run(fork.run_id).status == "cancelled"
    assert _child_signals(fapp, fork.run_id) == []  # a finished fork is told nothing


async def test_cancelling_the_parent_cancels_the_child_a_fork_awaits(fapp: ms.App):
    _register(fapp)
    parent = fapp.submit("report", "tides")
    await drain(fapp)
    (kid,) = fapp.children(parent.run_id)
    fork = fapp.fork(parent, from_step=0)
    await drain(fapp)
    assert fapp.cancel(parent.run_id) == "cancelled"
    await drain(fapp)
    assert fapp.get_run(kid.id).status == "cancelled"
    assert (await _result(fork)).startswith("cancelled: Cancelled: ")


async def test_a_fork_keeps_an_awaited_childs_end_and_edits_a_later_step(fapp: ms.App):
    _register(fapp)

    @fapp.workflow
    async def digest(ctx: ms.RunContext) -> str:
        found = await ctx.child("research", "tides")  # steps 0 (start) and 1 (its end)
        return await ctx.step(lambda: f"{found['said']}!", name="shout")  # step 2

    parent = fapp.submit(digest)
    await drain(fapp)
    (kid,) = fapp.children(parent.run_id)
    fapp.signal(kid.id, "go", "calm")
    await drain(fapp)
    assert await _result(parent) == "calm!"
    # the child's end is no human's decision: the fork keeps it, and may edit past it
    edited = fapp.fork(parent, from_step=2, edit="rough!")
    await drain(fapp)
    assert await _result(edited) == "rough!"
    assert _child_signals(fapp, edited.run_id) == []


async def test_a_fork_made_while_its_child_ends_hears_of_the_end_once(fapp: ms.App):
    # The fork and the child's end race: either the fork sees the child ended, or
    # the end sees the fork; never neither (a fork that waits forever), never both.
    _register(fapp)
    for _ in range(4):
        parent = fapp.submit("report", "tides")
        await drain(fapp)
        (kid,) = fapp.children(parent.run_id)
        start = threading.Barrier(2)
        forks: list[ms.RunHandle] = []

        def fork(parent: ms.RunHandle, start: threading.Barrier, forks: list[ms.RunHandle]) -> None:
            start.wait()
            forks.append(fapp.fork(parent, from_step=0))

        def cancel(child: str, start: threading.Barrier) -> None:
            start.wait()
            fapp.cancel(child, reason="raced")

        threads = [
            threading.Thread(target=fork, args=(parent, start, forks)),
            threading.Thread(target=cancel, args=(kid.id, start)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        await drain(fapp)
        for run in (parent, *forks):
            assert await _result(run) == "cancelled: Cancelled: raced"
        assert _child_signals(fapp, forks[0].run_id) == [(f"child:{kid.id}", True)]


@pytest.mark.parametrize("policy", ["cancel", "abandon"])
async def test_a_parents_end_reaches_the_child_a_fork_shares_as_its_policy_says(
    fapp: ms.App, policy: str
):
    # The parent fails after starting the child and before awaiting it; a fork made
    # past the start goes on and awaits it. The parent's end cancels the child
    # (default policy: the fork sees ChildCancelled) or leaves it running ("abandon":
    # the fork gets the child's own end).
    broken = {"parent": True}

    @fapp.workflow
    async def research(ctx: ms.RunContext, topic: str) -> str:
        return f"{topic} / " + await ctx.wait_for("go")

    def check() -> str:
        if broken["parent"]:
            raise RuntimeError("the parent's check failed")
        return "ok"

    @fapp.workflow
    async def report(ctx: ms.RunContext, topic: str) -> str:
        handle = await ctx.start_child(research, topic, on_parent_close=policy)
        await ctx.wait_for("proceed")
        await ctx.step(check, retry=ms.RetryPolicy(max_attempts=1))
        try:
            return await handle
        except ms.ChildFailed as exc:
            return f"{exc.status}: {exc.error['message']}"

    parent = fapp.submit("report", "tides")
    await drain(fapp)
    (kid,) = fapp.children(parent.run_id)
    fork = fapp.fork(parent, from_step=0)
    await drain(fapp)
    fapp.signal(parent.run_id, "proceed", "now")
    await drain(fapp)
    assert fapp.get_run(parent.run_id).status == "failed"
    broken["parent"] = False
    fapp.signal(fork.run_id, "proceed", "now")
    await drain(fapp)
    if policy == "cancel":
        assert fapp.get_run(kid.id).status == "cancelled"
        assert await _result(fork) == f"cancelled: its parent run {parent.run_id!r} failed"
    else:
        assert fapp.get_run(kid.id).status == "waiting"
        fapp.signal(kid.id, "go", "ebb")
        await drain(fapp)
        assert await _result(fork) == "tides / ebb"
    assert_invariants(fapp.store, now=fapp.clock.now(), settled=True)
