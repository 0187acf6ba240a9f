"""Retention never cuts what a live run still needs: ``prune`` keeps a finished run
past the cut-off while an unfinished run descends from it, descends from it (a
child of its current session, a fork), holds its start, or needs it on the path a
child's end takes to the forks holding its start; and says what it kept and why."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from _helpers import drain
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.testing import StoreHistory, assert_invariants, check_invariants

DAY = 86_400.0


@pytest.fixture
def fapp(db_url: str) -> Iterator[ms.App]:
    app = ms.App(db_url, clock=ms.FakeClock(), poll_interval_s=0.01, inline_wait_s=0.0)
    yield app
    app.close()


def _prune(app: ms.App, **kw: Any) -> ms.storage.PruneResult:
    """Prune everything that finished before now (the clock moves a day on first)."""
    app.clock.advance(DAY)  # type: ignore[attr-defined]
    return app.store.prune(0, app.clock.now(), **kw)


def _kept(result: ms.storage.PruneResult) -> dict[str, tuple[str, str]]:
    return {k.run_id: (k.reason, k.by) for k in result.kept}


def _register_tree(app: ms.App) -> None:
    @app.workflow
    async def research(ctx: ms.RunContext) -> str:
        return str(await ctx.wait_for("go"))

    @app.workflow
    async def report(ctx: ms.RunContext) -> str:
        kid = await ctx.start_child(research, on_parent_close="abandon")  # step 0
        if await ctx.wait_for("decide") == "skip":  # step 1
            return "skipped"
        return f"got {await kid}"


async def test_a_pruned_middle_fork_never_strands_the_forks_below_it(fapp: ms.App) -> None:
    """P holds child C's start; f1 forks P, f2 forks f1, both past the start. f1 ends
    without waiting for C; f2 waits for it. prune must keep f1: C's end reaches f2
    through f1's row."""
    _register_tree(fapp)
    parent = fapp.submit("report")
    await drain(fapp)
    (kid,) = fapp.children(parent.run_id)
    f1 = fapp.fork(parent, from_step=0)
    await drain(fapp)
    fapp.signal(f1.run_id, "decide", "skip")
    await drain(fapp)
    assert await f1.result() == "skipped"
    f2 = fapp.fork(f1, from_step=0)
    await drain(fapp)
    fapp.signal(f2.run_id, "decide", "wait")
    fapp.signal(parent.run_id, "decide", "skip")  # the parent ends too; C runs on
    await drain(fapp)
    assert fapp.get_run(f2.run_id).wait_reason == f"child:{kid.id}"

    pruned = _prune(fapp)
    assert pruned.runs == 0
    assert _kept(pruned) == {
        parent.run_id: ("ancestor", kid.id),  # C (unfinished) is its child
        f1.run_id: ("ancestor", f2.run_id),
    }
    assert_invariants(fapp.store, now=fapp.clock.now())
    fapp.signal(kid.id, "go", "the answer")
    await drain(fapp)
    assert await asyncio.wait_for(f2.result(), 10) == "got the answer"
    # Nothing needs them now: the next prune deletes the whole tree.
    again = _prune(fapp)
    assert (again.runs, again.kept) == (4, ())
    assert fapp.list_runs() == []


async def test_a_fork_on_the_path_of_an_unfinished_childs_end_is_kept(fapp: ms.App) -> None:
    """f1 and f2 both ended, C still runs: a retry of f2 (or a fork of it) would wait
    for C through f1, so f1 stays while C runs (``child_path``)."""
    _register_tree(fapp)
    parent = fapp.submit("report")
    await drain(fapp)
    (kid,) = fapp.children(parent.run_id)
    f1 = fapp.fork(parent, from_step=0)
    await drain(fapp)
    fapp.signal(f1.run_id, "decide", "skip")
    await drain(fapp)
    f2 = fapp.fork(f1, from_step=0)
    await drain(fapp)
    fapp.cancel(f2.run_id)
    fapp.signal(parent.run_id, "decide", "skip")
    await drain(fapp)
    pruned = _prune(fapp)
    assert _kept(pruned) == {
        parent.run_id: ("ancestor", kid.id),
        f1.run_id: ("child_path", kid.id),
        f2.run_id: ("child_path", kid.id),
    }
    assert "reaches the forks below it" in pruned.kept[1].describe()
    # A fork of f2 made now waits for C through f1 and f2, and is told its end.
    f3 = fapp.fork(f2, from_step=0)
    await drain(fapp)
    fapp.signal(f3.run_id, "decide", "wait")
    await drain(fapp)
    fapp.signal(kid.id, "go", "late")
    await drain(fapp)
    assert await asyncio.wait_for(f3.result(), 10) == "got late"
    assert_invariants(fapp.store, now=fapp.clock.now(), settled=True)


async def test_a_retried_fork_gets_the_end_of_a_child_that_ended_meanwhile(fapp: ms.App) -> None:
    broken = {"check": True}

    def check() -> str:
        if broken["check"]:
            raise ValueError("not now")
        return "ok"

    @fapp.workflow
    async def research(ctx: ms.RunContext) -> str:
        return str(await ctx.wait_for("go"))

    @fapp.workflow
    async def report(ctx: ms.RunContext) -> str:
        kid = await ctx.start_child(research, on_parent_close="abandon")
        await ctx.wait_for("decide")
        await ctx.step(check, retry=ms.RetryPolicy.never())
        return f"got {await kid}"

    parent = fapp.submit("report")
    await drain(fapp)
    (kid,) = fapp.children(parent.run_id)
    fork = fapp.fork(parent, from_step=0)
    await drain(fapp)
    fapp.signal(fork.run_id, "decide", 1)
    await drain(fapp)
    assert fapp.get_run(fork.run_id).status == "failed"
    fapp.signal(kid.id, "go", "meanwhile")  # ends while the fork is failed: told nobody
    await drain(fapp)
    broken["check"] = False
    history = StoreHistory()
    history.reopen(fork.run_id)
    fapp.retry(fork)
    await drain(fapp)
    assert await asyncio.wait_for(fork.result(), 10) == "got meanwhile"
    assert_invariants(fapp.store, history=history, now=fapp.clock.now())


async def test_prune_keeps_the_finished_children_of_a_waiting_parent(fapp: ms.App) -> None:
    @fapp.workflow
    async def part(ctx: ms.RunContext, n: int) -> int:
        return n * n

    @fapp.workflow
    async def review(ctx: ms.RunContext) -> int:
        squares = await asyncio.gather(*(ctx.child(part, n) for n in (1, 2, 3)))
        await ctx.approval("publish", preview=squares)  # a person reads them first
        return sum(squares)

    @fapp.workflow
    async def alone(ctx: ms.RunContext) -> int:
        return 0

    run = fapp.submit(review)
    other = fapp.submit(alone)
    await drain(fapp)
    kids = [k.id for k in fapp.children(run.run_id)]
    assert len(kids) == 3 and fapp.get_run(run.run_id).status == "waiting"

    dry = _prune(fapp, dry_run=True)
    pruned = fapp.store.prune(0, fapp.clock.now())
    for result in (dry, pruned):
        assert (result.runs, result.steps) == (1, 0)  # only the unrelated run
        assert _kept(result) == {k: ("descendant", run.run_id) for k in kids}
    assert fapp.store.get_run(other.run_id) is None
    assert all(fapp.store.get_run(k) is not None for k in kids)
    fapp.answer(run.run_id, "approval:publish", decision="approve", by="ana")
    await drain(fapp)
    assert await run.result() == 14
    assert _prune(fapp).runs == 4  # now nothing holds them


async def test_children_of_a_live_parents_earlier_sessions_age_out(fapp: ms.App) -> None:
    """A loop that runs for ever does not keep every night's child for ever: only
    the children its current session started are still referenced."""

    @fapp.workflow
    async def job(ctx: ms.RunContext) -> str:
        return "done"

    @fapp.workflow
    async def loop(ctx: ms.RunContext) -> None:
        await ctx.child(job, key="night")
        if not ctx.handoff:
            ctx.continue_as_new(1)
        await ctx.wait_for("stop")

    run = fapp.submit(loop)
    await drain(fapp)
    first, second = fapp.children(run.run_id)
    pruned = _prune(fapp)
    assert pruned.runs == 1 and fapp.store.get_run(first.id) is None
    assert _kept(pruned) == {second.id: ("descendant", run.run_id)}


def test_mainspring_prune_says_what_it_kept_and_why(db_url: str) -> None:
    app = ms.App(db_url)
    now = app.clock.now()
    store = app.store
    store.create_run(run_id="p", workflow="wf", input="null", key=None, now=now - 3 * DAY)
    store.create_run(
        run_id="c", workflow="wf", input="null", key=None, now=now - 3 * DAY, parent="p",
        parent_step="0:0",
    )  # fmt: skip
    store.cancel("c", now - 2 * DAY)  # a finished child of a run still queued
    app.close()
    runner = CliRunner()
    text = runner.invoke(cli, ["prune", "--older-than", "1d", "--db", db_url])
    assert text.exit_code == 0, text.output
    assert "kept 1 finished run" in text.output and "c: it descends from unfinished run p" in (
        " ".join(text.output.split())
    )
    as_json = runner.invoke(cli, ["prune", "--older-than", "1d", "--db", db_url, "--json"])
    body = json.loads(as_json.output)
    assert body["runs"] == 0 and body["kept"] == [
        {
            "run_id": "c",
            "reason": "descendant",
            "by": "p",
            "why": "it descends from unfinished run p",
        }
    ]


async def test_the_invariant_sees_a_stranded_fork(fapp: ms.App) -> None:
    """What prune used to do: delete the middle fork. The child's end then never
    reaches f2, and check_invariants says so (the wait has a reason, so liveness
    alone does not)."""
    _register_tree(fapp)
    parent = fapp.submit("report")
    await drain(fapp)
    (kid,) = fapp.children(parent.run_id)
    f1 = fapp.fork(parent, from_step=0)
    await drain(fapp)
    fapp.signal(f1.run_id, "decide", "skip")
    await drain(fapp)
    f2 = fapp.fork(f1, from_step=0)
    await drain(fapp)
    fapp.signal(f2.run_id, "decide", "wait")
    await drain(fapp)
    with fapp.store._write() as cur:  # the old prune, by hand
        for table, column in (("ms_steps", "run_id"), ("ms_signals", "run_id"), ("ms_runs", "id")):
            cur.execute(f"DELETE FROM {table} WHERE {column} = ?", (f1.run_id,))
    fapp.signal(kid.id, "go", "lost")
    await drain(fapp)
    found = check_invariants(fapp.store, now=fapp.clock.now())
    assert [(v.kind, v.run_id) for v in found] == [("child_end_undelivered", f2.run_id)]
    assert kid.id in found[0].detail and "ended succeeded" in found[0].detail
