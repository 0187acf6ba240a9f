"""Child runs (``ctx.child`` / ``ctx.start_child``): results, fan-out, failures,
cancellation cascading down, and no child started twice across crashes and replays."""

from __future__ import annotations

import asyncio

import pytest
from _helpers import Crash, drain

import mainspring as ms
from mainspring.testing import ScriptedModel, assert_invariants


@pytest.fixture
def clock() -> ms.FakeClock:
    return ms.FakeClock()


@pytest.fixture
def fapp(db_url: str, clock: ms.FakeClock) -> ms.App:
    app = ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0)
    yield app
    app.close()


def _count(app: ms.App, workflow: str) -> int:
    return len(app.list_runs(workflow=workflow, limit=1000))


async def test_child_result_is_returned(fapp: ms.App):
    @fapp.workflow
    async def double(ctx: ms.RunContext, n: int) -> int:
        return await ctx.step(lambda: n * 2, name="double")

    @fapp.workflow
    async def parent(ctx: ms.RunContext, n: int) -> int:
        return await ctx.child(double, n) + 1

    handle = fapp.submit(parent, 20)
    await drain(fapp)
    assert await handle.result() == 41
    kids = fapp.children(handle.run_id)
    assert [(k.workflow, k.status, k.parent_kind) for k in kids] == [
        ("double", "succeeded", "child")
    ]
    assert kids[0].parent == handle.run_id and kids[0].parent_step == "0:0"
    # the child's key is derived from the parent's position, under a reserved prefix
    assert fapp.get_run(kids[0].id).key == f"child:{handle.run_id}:0:0"


async def test_fan_out_with_gather(fapp: ms.App):
    @fapp.workflow
    async def square(ctx: ms.RunContext, n: int) -> int:
        await ctx.sleep(0)
        return n * n

    @fapp.workflow
    async def fan(ctx: ms.RunContext) -> list[int]:
        results = await asyncio.gather(*(ctx.child(square, i) for i in (1, 2, 3)))
        later = await ctx.start_child("square", 4, key="four")
        both = await asyncio.gather(later.result(), later)  # one wait answers both
        return [*results, *both]

    handle = fapp.submit(fan)
    await drain(fapp)
    assert await handle.result() == [1, 4, 9, 16, 16]
    assert _count(fapp, "square") == 4
    assert_invariants(fapp.store, now=fapp.clock.now(), settled=True)
    assert fapp.get_run([k for k in fapp.children(handle.run_id)][-1].id).key == (
        f"child:{handle.run_id}:0:key:four"
    )


async def test_child_failure_raises_child_failed(fapp: ms.App):
    @fapp.workflow
    async def broken(ctx: ms.RunContext) -> int:
        raise ValueError("no such thing")

    @fapp.workflow
    async def parent(ctx: ms.RunContext) -> str:
        try:
            await ctx.child(broken)
        except ms.ChildFailed as exc:
            error = f"{exc.error['type']}:{exc.error['message']}"
            return f"{type(exc).__name__}:{exc.status}:{error}:{exc.child_id}"
        return "unreachable"

    handle = fapp.submit(parent)
    await drain(fapp)
    result = await handle.result()
    (kid,) = fapp.children(handle.run_id)
    assert result == f"ChildFailed:failed:builtins.ValueError:no such thing:{kid.id}"


async def test_cancel_cascades_to_children_recursively(fapp: ms.App):
    @fapp.workflow
    async def leaf(ctx: ms.RunContext) -> str:
        return await ctx.wait_for("go")

    @fapp.workflow
    async def middle(ctx: ms.RunContext) -> str:
        return await ctx.child(leaf)

    @fapp.workflow
    async def top(ctx: ms.RunContext) -> str:
        return await ctx.child(middle)

    handle = fapp.submit(top)
    await drain(fapp)
    (mid,) = fapp.children(handle.run_id)
    (lf,) = fapp.children(mid.id)
    assert fapp.get_run(handle.run_id).wait_reason == f"child:{mid.id}"
    assert fapp.get_run(lf.id).status == "waiting"
    assert fapp.cancel(handle.run_id) == "cancelled"
    for rid in (handle.run_id, mid.id, lf.id):
        assert fapp.get_run(rid).status == "cancelled"
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "cancelled"
    assert_invariants(fapp.store, now=fapp.clock.now(), settled=True)
    # a raw signal cannot forge a child's end
    with pytest.raises(ms.ReservedSignal):
        fapp.signal(handle.run_id, f"child:{mid.id}", {})


async def test_cancelled_child_surfaces_as_child_cancelled(fapp: ms.App):
    @fapp.workflow
    async def slow(ctx: ms.RunContext) -> str:
        return await ctx.wait_for("go")

    @fapp.workflow
    async def parent(ctx: ms.RunContext) -> str:
        try:
            return await ctx.child(slow)
        except ms.ChildCancelled as exc:
            return f"child {exc.status}"

    handle = fapp.submit(parent)
    await drain(fapp)
    (kid,) = fapp.children(handle.run_id)
    assert fapp.cancel(kid.id) == "cancelled"
    await drain(fapp)
    assert await handle.result() == "child cancelled"


async def test_child_that_finishes_before_the_parent_waits_still_wakes_it(fapp: ms.App):
    @fapp.workflow
    async def quick(ctx: ms.RunContext) -> str:
        return "done"

    @fapp.workflow
    async def parent(ctx: ms.RunContext) -> str:
        handle = await ctx.start_child(quick)
        await ctx.wait_for("later")  # the child ends while the parent waits for this
        return await handle

    handle = fapp.submit(parent)
    await drain(fapp)
    (kid,) = fapp.children(handle.run_id)
    assert fapp.get_run(kid.id).status == "succeeded"
    assert fapp.get_run(handle.run_id).status == "waiting"
    fapp.signal(handle.run_id, "later")
    await drain(fapp)
    assert await handle.result() == "done"


async def test_a_replayed_parent_never_starts_a_child_twice(fapp: ms.App, clock: ms.FakeClock):
    crashes = {"workflow": 1, "step": 1}

    @fapp.workflow
    async def kid(ctx: ms.RunContext, n: int) -> int:
        return n

    async def boom() -> None:
        if crashes["step"]:
            crashes["step"] -= 1
            raise Crash

    @fapp.workflow
    async def parent(ctx: ms.RunContext) -> int:
        first = await ctx.start_child(kid, 1)
        if crashes["workflow"]:  # dies before the start is committed
            crashes["workflow"] -= 1
            raise Crash
        second = await ctx.start_child(kid, 2, key="second")
        await ctx.step(boom)  # dies after both starts are committed
        return await first + await second

    handle = fapp.submit(parent)
    await drain(fapp)
    assert fapp.observe.steps(handle.run_id) == []  # the child exists, its start is not journaled
    assert _count(fapp, "kid") == 1
    clock.advance(fapp.lease_s + 1)  # the lease expires: another worker replays it
    await drain(fapp)
    assert [s.name for s in fapp.observe.steps(handle.run_id)][:2] == ["child:kid", "child:kid"]
    assert _count(fapp, "kid") == 2
    clock.advance(fapp.lease_s + 1)
    await drain(fapp)
    assert await handle.result() == 3
    assert _count(fapp, "kid") == 2
    assert_invariants(fapp.store, now=fapp.clock.now(), settled=True)


async def test_an_agent_runs_as_a_child_step(fapp: ms.App):
    researcher = fapp.agent(
        "researcher",
        model=ScriptedModel([ScriptedModel.call("finish", {"answer": "Paris"})]),
        instructions="Answer briefly.",
    )

    @fapp.workflow
    async def pipeline(ctx: ms.RunContext, country: str) -> str:
        checked = await ctx.step(lambda: country.strip(), name="validate")
        answer = await ctx.child(researcher, f"capital of {checked}?")
        assert isinstance(answer, ms.AgentResult)
        return f"{answer.answer} ({answer.status})"

    handle = fapp.submit(pipeline, " France ")
    await drain(fapp)
    assert await handle.result() == "Paris (done)"
    (kid,) = fapp.children(handle.run_id)
    assert kid.workflow == "researcher"


async def test_child_of_an_unknown_workflow_fails_clearly(fapp: ms.App):
    @fapp.workflow
    async def parent(ctx: ms.RunContext) -> int:
        return await ctx.child("nope")

    handle = fapp.submit(parent)
    await drain(fapp)
    with pytest.raises(ms.RunFailed, match="no workflow named 'nope'"):
        await handle.result()


async def test_app_run_runs_the_children_too(db_url: str):
    app = ms.App(db_url, poll_interval_s=0.01)

    @app.workflow
    async def leaf(ctx: ms.RunContext, n: int) -> int:
        return n + 1

    @app.workflow
    async def mid(ctx: ms.RunContext, n: int) -> int:
        return await ctx.child(leaf, n) * 10

    @app.workflow
    async def gate(ctx: ms.RunContext) -> str:
        return (await ctx.approval("go")).reason or "ok"

    @app.workflow
    async def top(ctx: ms.RunContext) -> int:
        values = await asyncio.gather(ctx.child(mid, 1), ctx.child(mid, 2))
        return sum(values)

    @app.workflow
    async def waits_for_a_person(ctx: ms.RunContext) -> str:
        return await ctx.child(gate)

    try:
        assert await asyncio.wait_for(app.run(top), 60) == 50
        with pytest.raises(ms.RunWaiting, match="approval:go"):  # a person, not a hang
            await asyncio.wait_for(app.run(waits_for_a_person, key="w"), 60)
    finally:
        app.close()


async def test_a_child_carries_the_code_version_of_its_parent(db_url: str):
    """Workers claim the versions they accept: a child of a version-2 parent is a
    version-2 run, so the fleet that runs the parent runs the child too."""
    app = ms.App(db_url, poll_interval_s=0.01, inline_wait_s=0.0, version="2")

    @app.workflow
    async def leaf(ctx: ms.RunContext) -> str:
        return "leaf"

    @app.workflow
    async def root(ctx: ms.RunContext) -> str:
        return await ctx.child(leaf)

    try:
        handle = app.submit(root)
        await drain(app)
        assert await handle.result() == "leaf"
        assert [k.version for k in app.children(handle.run_id)] == ["2"]
    finally:
        app.close()
