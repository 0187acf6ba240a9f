"""``ctx.request``, the one primitive under approvals, gates and questions, and
``ctx.sleep_until``, a wait for an instant computed from journaled values."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from _helpers import drain

import mainspring as ms


@pytest.fixture
def clock() -> ms.FakeClock:
    return ms.FakeClock()


@pytest.fixture
def fapp(db_url: str, clock: ms.FakeClock) -> ms.App:
    return ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0)


# -- ctx.request --------------------------------------------------------------------------


async def test_an_approval_request_is_listed_and_returns_the_decision(fapp: ms.App) -> None:
    @fapp.workflow
    async def ship(ctx: ms.RunContext) -> list[Any]:
        decision = await ctx.request("approval:ship", title="ship 1.3?", preview={"version": "1.3"})
        return [decision.approved, decision.reason, decision.by, decision.timed_out]

    handle = fapp.submit(ship)
    await drain(fapp)
    [request] = fapp.requests(handle.run_id)
    assert (request.id, request.kind, request.title) == ("approval:ship", "approval", "ship 1.3?")
    assert request.preview == {"version": "1.3"} and request.deadline is None
    fapp.answer(handle.run_id, "approval:ship", decision="reject", reason="friday", by="ana")
    await drain(fapp)
    assert await handle.result() == [False, "friday", "ana", False]


async def test_a_question_request_returns_the_answer(fapp: ms.App) -> None:
    @fapp.workflow
    async def paint(ctx: ms.RunContext) -> str:
        color = await ctx.request(
            "question:color", kind="question", title="Which color?", choices=["red", "blue"]
        )
        return f"painted {color}"

    handle = fapp.submit(paint)
    await drain(fapp)
    [request] = fapp.requests(handle.run_id)
    assert (request.kind, request.title, request.choices) == (
        "question",
        "Which color?",
        ("red", "blue"),
    )
    with pytest.raises(ms.InvalidAnswer):
        fapp.answer(handle.run_id, "question:color", answer="green")
    fapp.answer(handle.run_id, "question:color", answer="blue")
    await drain(fapp)
    assert await handle.result() == "painted blue"


async def test_on_timeout_an_approval_takes_its_default_decision(
    fapp: ms.App, clock: ms.FakeClock
) -> None:
    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> list[Any]:
        no = await ctx.request("approval:a", timeout=60)
        yes = await ctx.request("approval:b", timeout=60, default="approve")
        return [(d.approved, d.timed_out, d.reason) for d in (no, yes)]

    handle = fapp.submit(wf)
    await drain(fapp)
    [request] = fapp.requests(handle.run_id)
    assert request.deadline == clock.now() + 60
    clock.advance(60)
    await drain(fapp)
    clock.advance(60)
    await drain(fapp)
    assert await handle.result() == [
        [False, True, "no decision within 60 s; the default is 'reject'"],
        [True, True, "no decision within 60 s; the default is 'approve'"],
    ]


async def test_on_timeout_a_question_returns_its_default_or_raises(
    fapp: ms.App, clock: ms.FakeClock
) -> None:
    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> list[str]:
        first = await ctx.request("question:a", kind="question", title="a?", timeout=5, default="x")
        try:
            await ctx.request("question:b", kind="question", title="b?", timeout=5)
        except ms.WaitTimeout as exc:
            return [first, exc.message]
        return [first]

    handle = fapp.submit(wf)
    for _ in range(2):
        await drain(fapp)
        clock.advance(5)
    await drain(fapp)
    assert await handle.result() == ["x", "no answer to 'b?' within 5 s"]


async def test_approval_gate_and_ask_journal_what_request_journals(fapp: ms.App) -> None:
    """The short methods are ``request`` with their ids and titles: same rows."""

    @fapp.workflow
    async def short(ctx: ms.RunContext) -> None:
        await ctx.approval("deploy", preview=1)
        await ctx.ask("Why?", name="why")

    @fapp.workflow
    async def long(ctx: ms.RunContext) -> None:
        await ctx.request("approval:deploy", title="approve 'deploy'", preview=1)
        await ctx.request("question:why", kind="question", title="Why?")

    outputs = []
    for wf in (short, long):
        handle = fapp.submit(wf)
        await drain(fapp)
        fapp.answer(handle.run_id, "approval:deploy", decision="approve", by="ana")
        await drain(fapp)
        fapp.answer(handle.run_id, "question:why", answer="because", by="ana")
        await drain(fapp)
        await handle.result()
        outputs.append([(s.kind, s.name, s.output) for s in fapp.observe.steps(handle.run_id)])
    assert outputs[0] == outputs[1]
    assert json.loads(outputs[0][1][2] or "{}")["request"] == {
        "kind": "question",
        "title": "Why?",
        "preview": None,
    }


async def test_a_request_id_must_be_reserved_for_requests(fapp: ms.App) -> None:
    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> list[str]:
        errors = []
        for call in (
            lambda: ctx.request("deploy"),  # any raw signal could answer it
            lambda: ctx.request("approval:x", choices=["a"]),  # type: ignore[call-overload]
            lambda: ctx.request("question:x", kind="maybe"),  # type: ignore[call-overload]
        ):
            try:
                await call()
            except (ms.ConfigError, ValueError) as exc:
                errors.append(type(exc).__name__)
        return errors

    handle = fapp.submit(wf)
    await drain(fapp)
    assert await handle.result() == ["ConfigError", "ValueError", "ValueError"]


# -- ctx.sleep_until ----------------------------------------------------------------------


async def test_sleep_until_parks_the_run_and_wakes_it_on_time(
    fapp: ms.App, clock: ms.FakeClock
) -> None:
    @fapp.workflow
    async def nap(ctx: ms.RunContext) -> str:
        wake = ctx.now() + timedelta(hours=1)
        await ctx.sleep_until(wake, reason="cooldown")
        return f"rested until {wake.isoformat()}"

    start = clock.now()
    handle = fapp.submit(nap)
    await drain(fapp)
    run = fapp.get_run(handle.run_id)
    assert (run.status, run.owner, run.wake_at, run.wait_reason) == (
        "sleeping",
        None,
        start + 3600,
        "cooldown",
    )
    clock.advance(3599)
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "sleeping"
    clock.advance(1)
    await drain(fapp)
    assert (await handle.result()).startswith("rested until 2026-01-01T01:00:00")
    # Nothing of its own in the journal: the instant came from ctx.now().
    assert [s.kind for s in fapp.observe.steps(handle.run_id)] == ["now"]


async def test_a_replay_after_the_instant_does_not_wait_again(
    fapp: ms.App, clock: ms.FakeClock
) -> None:
    calls: list[str] = []

    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> str:
        await ctx.sleep_until(ctx.now() + timedelta(minutes=10))
        await ctx.step(lambda: calls.append("after") or "done", name="after")
        return str(await ctx.wait_for("go"))

    handle = fapp.submit(wf)
    await drain(fapp)
    clock.advance(600)
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "waiting"  # past the sleep, on the signal
    fapp.signal(handle.run_id, "go", "went")
    await drain(fapp)  # replays now(), sleep_until (long past: no wait) and the step
    assert await handle.result() == "went"
    assert calls == ["after"]
