"""What a parent's end does to the children it started and did not wait for
(``on_parent_close``): by default they are cancelled with it, through the cascade a
cancel takes, grandchildren included; an ``"abandon"`` child runs on, on its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from _helpers import drain

import mainspring as ms
from mainspring.storage import RunTransition, RunWrite, open_store
from mainspring.testing import assert_invariants


@pytest.fixture
def fapp(db_url: str) -> Iterator[ms.App]:
    app = ms.App(db_url, clock=ms.FakeClock(), poll_interval_s=0.01, inline_wait_s=0.0)
    yield app
    app.close()


def _tree(app: ms.App) -> None:
    """``top`` starts ``mid`` in the background (which waits for its own child
    ``leaf``), then waits for the signal ``end`` and succeeds, or fails when the
    signal says so."""

    @app.workflow
    async def leaf(ctx: ms.RunContext) -> str:
        return await ctx.wait_for("go")

    @app.workflow
    async def mid(ctx: ms.RunContext) -> str:
        return await ctx.child(leaf)

    @app.workflow
    async def top(ctx: ms.RunContext) -> str:
        await ctx.start_child(mid)
        if await ctx.wait_for("end") == "fail":
            raise ValueError("the parent gave up")
        return "done"


def _family(app: ms.App, run_id: str) -> tuple[ms.RunRecord, ms.RunRecord]:
    (mid,) = app.children(run_id)
    (leaf,) = app.children(mid.id)
    return app.get_run(mid.id), app.get_run(leaf.id)  # type: ignore[return-value]


@pytest.mark.parametrize(("signal", "ended"), [("ok", "succeeded"), ("fail", "failed")])
async def test_a_parent_that_ends_cancels_its_unawaited_children_and_theirs(
    fapp: ms.App, signal: str, ended: str
):
    _tree(fapp)
    handle = fapp.submit("top")
    await drain(fapp)
    mid, leaf = _family(fapp, handle.run_id)
    assert (mid.status, leaf.status) == ("waiting", "waiting")
    assert mid.parent_close == "cancel"

    fapp.signal(handle.run_id, "end", signal)
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == ended
    mid, leaf = _family(fapp, handle.run_id)
    assert (mid.status, leaf.status) == ("cancelled", "cancelled")
    assert f"its parent run {handle.run_id!r} {ended}" in (mid.error or "")
    assert_invariants(fapp.store, now=fapp.clock.now(), settled=True)


async def test_a_running_child_is_cancelled_at_its_next_commit(fapp: ms.App):
    effects: list[str] = []

    def until_ended(run_id: str) -> None:
        for _ in range(3000):
            if fapp.get_run(run_id).finished:  # type: ignore[union-attr]
                return
            time.sleep(0.01)
        raise AssertionError(f"run {run_id} never ended")

    def until_running(run_id: str) -> None:
        for _ in range(3000):
            if fapp.get_run(run_id).status == "running":  # type: ignore[union-attr]
                return
            time.sleep(0.01)
        raise AssertionError(f"run {run_id} never ran")

    @fapp.workflow
    async def busy(ctx: ms.RunContext, parent: str) -> str:
        await ctx.step(until_ended, parent)  # in a step while its parent ends
        await ctx.sleep(1)  # its next commit learns of the cancel
        await ctx.step(lambda: effects.append("after"), name="after")
        return "finished"

    @fapp.workflow
    async def parent(ctx: ms.RunContext) -> str:
        child = await ctx.start_child(busy, ctx.run_id)
        await ctx.step(until_running, child.run_id)
        return "done"

    handle = fapp.submit(parent)
    await drain(fapp)
    assert await handle.result() == "done"
    (kid,) = fapp.children(handle.run_id)
    assert fapp.get_run(kid.id).status == "cancelled"  # type: ignore[union-attr]
    assert effects == []  # its next step never ran
    assert_invariants(fapp.store, now=fapp.clock.now(), settled=True)


@pytest.mark.parametrize("close", ["cancel", "abandon"])
async def test_a_retried_parent_learns_how_its_children_ended_meanwhile(fapp: ms.App, close: str):
    """A child that ends while its parent is failed (cancelled by that failure, or on
    its own) has no parent to tell; a retry of the parent finds its end all the same."""
    failures = [ValueError("the parent gave up")]

    @fapp.workflow
    async def leaf(ctx: ms.RunContext) -> str:
        return await ctx.wait_for("go")

    @fapp.workflow
    async def parent(ctx: ms.RunContext) -> str:
        child = await ctx.start_child(leaf, on_parent_close=close)
        if failures:
            raise failures.pop()
        try:
            return await child
        except ms.ChildCancelled as exc:
            return f"child {exc.status}"

    handle = fapp.submit(parent)
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "failed"  # type: ignore[union-attr]
    (kid,) = fapp.children(handle.run_id)
    if close == "abandon":
        fapp.signal(kid.id, "go", "ended on its own")
        await drain(fapp)
    fapp.retry(handle.run_id)
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "succeeded"  # type: ignore[union-attr]
    expected = "child cancelled" if close == "cancel" else "ended on its own"
    assert await handle.result() == expected


async def test_an_abandoned_child_runs_on_and_finishes_after_its_parent(fapp: ms.App):
    @fapp.workflow
    async def report(ctx: ms.RunContext) -> str:
        return f"sent {await ctx.wait_for('go')}"

    @fapp.workflow
    async def parent(ctx: ms.RunContext) -> str:
        await ctx.start_child(report, on_parent_close="abandon")
        return "done"

    handle = fapp.submit(parent)
    await drain(fapp)
    assert await handle.result() == "done"
    (kid,) = fapp.children(handle.run_id)
    assert (kid.status, kid.parent_close) == ("waiting", "abandon")

    fapp.signal(kid.id, "go", "weekly")
    await drain(fapp)
    assert await fapp.result(kid.id) == "sent weekly"
    assert_invariants(fapp.store, now=fapp.clock.now(), settled=True)


async def test_a_cancel_of_the_parent_leaves_an_abandoned_child_running(fapp: ms.App):
    @fapp.workflow
    async def leaf(ctx: ms.RunContext) -> str:
        return await ctx.wait_for("go")

    @fapp.workflow
    async def parent(ctx: ms.RunContext) -> str:
        await ctx.start_child(leaf, on_parent_close="abandon")
        kept = await ctx.start_child(leaf)
        return await kept

    handle = fapp.submit(parent)
    await drain(fapp)
    abandoned, kept = fapp.children(handle.run_id)
    assert fapp.cancel(handle.run_id) == "cancelled"
    assert fapp.get_run(kept.id).status == "cancelled"  # type: ignore[union-attr]
    assert fapp.get_run(abandoned.id).status == "waiting"  # type: ignore[union-attr]
    fapp.signal(abandoned.id, "go", "still here")
    await drain(fapp)
    assert await fapp.result(abandoned.id) == "still here"


async def test_a_finished_child_is_left_as_it_is(fapp: ms.App):
    @fapp.workflow
    async def quick(ctx: ms.RunContext) -> int:
        return 7

    @fapp.workflow
    async def parent(ctx: ms.RunContext) -> str:
        await ctx.start_child(quick)
        await ctx.wait_for("end")
        return "done"

    handle = fapp.submit(parent)
    await drain(fapp)
    (kid,) = fapp.children(handle.run_id)
    before = fapp.get_run(kid.id)
    assert before is not None and before.status == "succeeded"
    fapp.signal(handle.run_id, "end")
    await drain(fapp)
    assert await handle.result() == "done"
    assert fapp.get_run(kid.id) == before
    assert await fapp.result(kid.id) == 7


async def test_a_child_started_before_the_policy_keeps_its_old_behaviour(fapp: ms.App):
    """A child row written before ``parent_close`` existed (NULL) outlives its
    parent's normal end, as every child did then."""

    @fapp.workflow
    async def leaf(ctx: ms.RunContext) -> str:
        return await ctx.wait_for("go")

    @fapp.workflow
    async def parent(ctx: ms.RunContext) -> str:
        await ctx.start_child(leaf)
        await ctx.wait_for("end")
        return "done"

    handle = fapp.submit(parent)
    await drain(fapp)
    (kid,) = fapp.children(handle.run_id)
    with fapp.store._write() as cur:  # as migration 14 leaves an older child
        cur.execute("UPDATE ms_runs SET parent_close = NULL WHERE id = ?", (kid.id,))
    fapp.signal(handle.run_id, "end")
    await drain(fapp)
    assert await handle.result() == "done"
    assert fapp.get_run(kid.id).status == "waiting"  # type: ignore[union-attr]


async def test_an_unknown_policy_is_refused(fapp: ms.App):
    @fapp.workflow
    async def leaf(ctx: ms.RunContext) -> str:
        return "leaf"

    @fapp.workflow
    async def parent(ctx: ms.RunContext) -> str:
        return await ctx.child(leaf, on_parent_close="detach")  # type: ignore[arg-type]

    handle = fapp.submit(parent)
    await drain(fapp)
    with pytest.raises(ms.RunFailed, match="on_parent_close must be 'cancel' or 'abandon'"):
        await handle.result()
    assert fapp.children(handle.run_id) == []


def test_a_parent_and_its_child_ending_at_once_never_deadlock(db_url: str):
    """The parent's end locks its children's rows before its own, as a child's end
    does (its row, then its parent's): neither commit fails, on any store."""
    store = open_store(db_url)
    running = RunTransition(kind="finish", status="succeeded", output="1")
    try:
        for i in range(8):
            store.create_run(run_id=f"p{i}", workflow="top", input="{}", key=None, now=1.0)
            store.create_run(run_id=f"c{i}", workflow="kid", input="{}", key=None, now=1.0,
                             parent=f"p{i}", parent_step="0:0")  # fmt: skip
            held = store.claim(worker="w", now=1.0, lease_s=60, limit=2, workflows=None,
                               max_recoveries=3)  # fmt: skip
            assert len(held) == 2
            gate = threading.Barrier(2)

            def end(run: ms.RunRecord, gate: threading.Barrier = gate) -> bool:
                gate.wait()
                write = RunWrite(run_id=run.id, epoch=run.epoch, transition=running)
                for _ in range(200):  # a row held by the other commit: busy, retried
                    [result] = store.commit([write], 2.0)
                    if not result.busy:
                        return result.ok
                    time.sleep(0.005)
                return False

            with ThreadPoolExecutor(2) as pool:
                assert list(pool.map(end, held)) == [True, True]
            child = store.get_run(f"c{i}")
            assert child is not None
            # Ended first, or asked to cancel by its parent's end (then its own end,
            # already sent, ends it cancelled).
            assert child.status == ("cancelled" if child.cancel_requested else "succeeded")
    finally:
        store.close()


def test_a_child_suspending_in_the_batch_that_ends_its_parent_is_cancelled(db_url: str):
    """One worker's group commit holds the parent's finish and, after it, its running
    child's suspend: the parent's end asks the child to cancel, and the suspend must
    see that request (it used to read the fence taken before the batch applied, and
    left the child waiting for ever, asked to cancel and never woken)."""
    store = open_store(db_url)
    now = time.time()
    try:
        store.create_run(run_id="p", workflow="wf", input="null", key=None, now=now)
        [p] = store.claim(
            worker="w", now=now, lease_s=60, limit=1, workflows=None, max_recoveries=3
        )
        store.create_run(
            run_id="c", workflow="wf", input="null", key=None, now=now, parent="p",
            parent_step="0:0",
        )  # fmt: skip
        [c] = store.claim(
            worker="w", now=now, lease_s=60, limit=1, workflows=None, max_recoveries=3
        )
        end = RunTransition(kind="finish", status="succeeded", output='"ok"')
        wait = RunTransition(kind="suspend", status="waiting", wait_signal="never")
        results = store.commit(
            [
                RunWrite(run_id="p", epoch=p.epoch, transition=end),
                RunWrite(run_id="c", epoch=c.epoch, transition=wait),
            ],
            now,
        )
        assert [r.ok for r in results] == [True, True]
        child = store.get_run("c")
        assert child is not None and child.cancel_requested
        assert child.status == "waiting" and child.wake_at == ms.storage.WAKE_NOW  # to cancel
        assert_invariants(store, now=now)
        [again] = store.claim(
            worker="w", now=now, lease_s=60, limit=1, workflows=None, max_recoveries=3
        )
        assert again.id == "c" and again.cancel_requested  # its worker cancels it now
    finally:
        store.close()
