"""Humans in the loop: approvals, gates, questions, checkpoints; durable and answered once."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _helpers import drain

import mainspring as ms
from mainspring.testing import FakeClock, ScriptedModel

call = ScriptedModel.call


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fapp(db_url: str, clock: FakeClock) -> ms.App:
    return ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0)


def _deploy_app(app: ms.App, effects: list[str]) -> ms.Workflow[[str], str]:
    @app.workflow
    async def deploy(ctx: ms.RunContext, env: str) -> str:
        await ctx.step(lambda: effects.append("build") or "built", name="build")
        decision = await ctx.approval("deploy", preview={"env": env, "version": "1.2"})
        if not decision.approved:
            return f"kept the old version: {decision.reason} ({decision.by})"
        version = (decision.arguments or {}).get("version", "1.2")
        region = await ctx.ask("Which region first?", choices=["eu", "us"], name="region")
        await ctx.step(lambda: effects.append(f"ship {version} {region}") or "shipped", name="ship")
        return f"{version} to {region}, approved by {decision.by}"

    return deploy


async def test_approval_then_question_leave_the_worker_and_resume(fapp: ms.App) -> None:
    effects: list[str] = []
    deploy = _deploy_app(fapp, effects)
    handle = fapp.submit(deploy, "prod")
    await drain(fapp)
    run = fapp.get_run(handle.run_id)
    assert (run.status, run.wait_reason) == ("waiting", "signal:approval:deploy")
    [request] = fapp.requests()
    assert (request.run_id, request.id, request.kind) == (
        handle.run_id,
        "approval:deploy",
        "approval",
    )
    assert request.workflow == "deploy" and request.title == "approve 'deploy'"
    assert request.preview == {"env": "prod", "version": "1.2"}
    assert request.created_at == fapp.clock.now() and request.deadline is None

    fapp.answer(
        handle.run_id, "approval:deploy", decision="edit", arguments={"version": "1.3"}, by="ana"
    )
    assert fapp.requests() == []  # answered: no longer pending, even before the run resumes
    await drain(fapp)
    [question] = fapp.requests(handle.run_id)
    assert (question.id, question.kind, question.choices) == (
        "question:region",
        "question",
        ("eu", "us"),
    )
    fapp.answer(handle.run_id, "question:region", answer="eu", by="ana")
    await drain(fapp)
    assert await fapp.result(handle.run_id) == "1.3 to eu, approved by ana"
    assert effects == ["build", "ship 1.3 eu"]  # the build step was not run again
    # The journal keeps what was asked and what was answered.
    rows = {s.name: s for s in fapp.observe.steps(handle.run_id)}
    out = json.loads(rows["approval:deploy"].output or "{}")
    assert out["request"]["preview"] == {"env": "prod", "version": "1.2"}
    assert out["signal"] == {"decision": "edit", "arguments": {"version": "1.3"}, "by": "ana"}


async def test_rejection_reason_reaches_the_workflow(fapp: ms.App) -> None:
    effects: list[str] = []
    deploy = _deploy_app(fapp, effects)
    handle = fapp.submit(deploy, "prod")
    await drain(fapp)
    fapp.answer(handle.run_id, "approval:deploy", decision="reject", reason="freeze week", by="bo")
    await drain(fapp)
    assert await fapp.result(handle.run_id) == "kept the old version: freeze week (bo)"
    assert effects == ["build"]


async def test_answers_are_checked_and_taken_once(fapp: ms.App) -> None:
    deploy = _deploy_app(fapp, [])
    handle = fapp.submit(deploy, "prod")
    with pytest.raises(ms.RequestNotFound, match="no request 'approval:deploy'"):
        fapp.answer(handle.run_id, "approval:deploy", decision="approve")  # not asked yet
    await drain(fapp)
    with pytest.raises(ms.InvalidAnswer, match="'decision' must be one of"):
        fapp.answer(handle.run_id, "approval:deploy", decision="maybe")  # type: ignore[arg-type]
    with pytest.raises(ms.InvalidAnswer, match="an 'edit' needs 'arguments'"):
        fapp.answer(handle.run_id, "approval:deploy", decision="edit")
    with pytest.raises(ms.InvalidAnswer, match="is an approval"):
        fapp.answer(handle.run_id, "approval:deploy", answer="yes")
    with pytest.raises(ms.RunNotFound):
        fapp.answer("nope", "approval:deploy", decision="approve")
    with pytest.raises(ms.RequestNotFound):
        fapp.answer(handle.run_id, "approval:other", decision="approve")
    assert [r.id for r in fapp.requests()] == ["approval:deploy"]  # nothing was taken

    fapp.answer(handle.run_id, "approval:deploy", decision="approve")
    with pytest.raises(ms.RunConflict, match="already answered"):
        fapp.answer(handle.run_id, "approval:deploy", decision="reject")
    await drain(fapp)
    with pytest.raises(ms.RunConflict, match="already answered"):  # consumed by now
        fapp.answer(handle.run_id, "approval:deploy", decision="approve")
    with pytest.raises(ms.InvalidAnswer, match="'mars' is not one of the choices"):
        fapp.answer(handle.run_id, "question:region", answer="mars")
    fapp.answer(handle.run_id, "question:region", answer="us")
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "succeeded"
    with pytest.raises(ms.RunConflict, match="already succeeded"):
        fapp.answer(handle.run_id, "question:region", answer="us")
    signals = [s for s in fapp.observe.steps(handle.run_id) if s.kind == "signal"]
    assert len(signals) == 2  # one wait per request, each answered once


async def test_wait_timeout_applies_the_default(fapp: ms.App, clock: FakeClock) -> None:
    @fapp.workflow
    async def gated(ctx: ms.RunContext) -> str:
        go = await ctx.approval("go", timeout=3600, default="approve")
        stop = await ctx.approval("stop", timeout=60)  # default: reject
        pick = await ctx.ask("colour?", choices=["red"], timeout=60, default="none given")
        return f"{go.approved}/{go.timed_out} {stop.approved} {pick}"

    handle = fapp.submit(gated)
    await drain(fapp)
    [request] = fapp.requests()
    assert request.deadline == clock.now() + 3600
    for _ in range(3):
        clock.advance(3601)
        await drain(fapp)
    assert await fapp.result(handle.run_id) == "True/True False none given"


async def test_question_without_default_times_out_with_an_error(
    fapp: ms.App, clock: FakeClock
) -> None:
    @fapp.workflow
    async def asks(ctx: ms.RunContext) -> str:
        return await ctx.ask("name?", timeout=10)

    handle = fapp.submit(asks)
    await drain(fapp)
    clock.advance(11)
    await drain(fapp)
    with pytest.raises(ms.RunFailed, match="no answer to 'name\\?' within 10 s"):
        await fapp.result(handle.run_id)


async def test_stage_gate_rejection_fails_the_run_with_the_reason(fapp: ms.App) -> None:
    imported: list[int] = []

    @fapp.workflow
    async def migrate(ctx: ms.RunContext) -> int:
        rows = await ctx.step(lambda: 120, name="export")
        await ctx.gate("import", preview={"rows": rows})
        await ctx.step(lambda: imported.append(rows), name="import")
        return rows

    ok = fapp.submit(migrate)
    bad = fapp.submit(migrate)
    await drain(fapp)
    assert {r.run_id for r in fapp.requests()} == {ok.run_id, bad.run_id}
    fapp.answer(ok.run_id, "approval:import", decision="approve")
    fapp.answer(bad.run_id, "approval:import", decision="reject", reason="counts look off", by="qa")
    await drain(fapp)
    assert await fapp.result(ok.run_id) == 120
    with pytest.raises(ms.RunFailed, match="stage gate 'import' rejected by qa: counts look off"):
        await fapp.result(bad.run_id)
    assert imported == [120]


# -- the agent ------------------------------------------------------------------------


def _refund_tool(app: ms.App, paid: list[int]) -> ms.Tool[Any, Any]:
    @app.tool(effect="irreversible")
    def refund(cents: int) -> str:
        """Refund the customer."""
        paid.append(cents)
        return f"refunded {cents}"

    return refund


async def test_agent_approval_is_a_listed_request(fapp: ms.App) -> None:
    paid: list[int] = []
    model = ScriptedModel(
        [
            call("refund", {"cents": 9000}, id="c1"),
            call("refund", {"cents": 5000}, id="c2"),
            call("finish", {"answer": "done"}),
        ]
    )
    agent = fapp.agent(
        "billing", model=model, instructions="Refund.", tools=[_refund_tool(fapp, paid)]
    )
    handle = fapp.submit(agent, "refund ana")
    await drain(fapp)
    [request] = fapp.requests()
    assert request.id == "approval:c1" and request.title == "run the irreversible tool 'refund'"
    assert request.preview == {
        "tool": "refund",
        "arguments": {"cents": 9000},
        "effect": "irreversible",
    }
    fapp.answer(handle.run_id, "approval:c1", decision="edit", arguments={"cents": 4000}, by="ana")
    await drain(fapp)
    fapp.answer(handle.run_id, "approval:c2", decision="reject", reason="already refunded", by="bo")
    await drain(fapp)
    result = await fapp.result(handle.run_id)
    assert result.status == "done" and paid == [4000]
    third = model.requests[2].messages
    assert any("rejected by the reviewer (bo): already refunded" in str(m) for m in third)


async def test_agent_can_ask_a_human(fapp: ms.App) -> None:
    model = ScriptedModel(
        [
            call("ask_human", {"question": "Which account?", "choices": ["A-1", "B-2"]}, id="q1"),
            call("finish", {"answer": "closed B-2"}),
        ]
    )
    agent = fapp.agent("closer", model=model, instructions="Close.", ask_human=True)
    assert "ask_human" in [t.name for t in fapp.agents["closer"].tool_specs()]
    handle = fapp.submit(agent, "close the duplicate account")
    await drain(fapp)
    [request] = fapp.requests()
    assert (request.id, request.kind, request.title) == (
        "question:q1",
        "question",
        "Which account?",
    )
    assert request.choices == ("A-1", "B-2")
    fapp.answer(handle.run_id, "question:q1", answer="B-2")
    await drain(fapp)
    assert (await fapp.result(handle.run_id)).answer == "closed B-2"
    assert any("The human answered: B-2" in str(m) for m in model.requests[1].messages)


async def test_agent_without_ask_human_cannot_call_it(fapp: ms.App) -> None:
    model = ScriptedModel([call("ask_human", {"question": "?"})])
    agent = fapp.agent("plain", model=model, instructions="x")
    handle = fapp.submit(agent, "task")
    await drain(fapp)
    with pytest.raises(ms.RunFailed, match="ask_human"):
        await fapp.result(handle.run_id)


async def test_cost_checkpoints_pause_each_n_tokens(fapp: ms.App) -> None:
    @fapp.tool
    def noop() -> str:
        """Nothing."""
        return "ok"

    model = ScriptedModel([call("noop", {}) for _ in range(6)] + [call("finish", {"answer": 1})])
    agent = fapp.agent(
        "spender",
        model=model,
        instructions="x",
        tools=[noop],
        limits=ms.Limits(checkpoint_tokens=1),  # every turn crosses a checkpoint
    )
    handle = fapp.submit(agent, "spend")
    await drain(fapp)
    [first] = fapp.requests()
    assert first.id.startswith("checkpoint:tokens:") and "continue?" in first.title
    fapp.answer(handle.run_id, first.id, decision="approve")
    await drain(fapp)
    [second] = fapp.requests()
    assert second.id != first.id
    fapp.answer(handle.run_id, second.id, decision="reject", reason="enough")
    await drain(fapp)
    result = await fapp.result(handle.run_id)
    assert result.status == "partial" and "checkpoint" in (result.reason or "")
    assert len(model.requests) == 2


async def test_budget_pause_is_a_request_the_edit_sets_the_new_cap(fapp: ms.App) -> None:
    model = ScriptedModel(
        [call("update_state", {"note": str(i)}) for i in range(4)] + [call("finish", {"answer": 4})]
    )
    agent = fapp.agent("capped", model=model, instructions="x", limits=ms.Limits(max_steps=2))
    handle = fapp.submit(agent, "go")
    await drain(fapp)
    [request] = fapp.requests()
    assert request.id == "budget:max_steps" and request.preview["cap"] == 2
    fapp.answer(handle.run_id, request.id, decision="edit", arguments={"limit": 10})
    await drain(fapp)
    assert (await fapp.result(handle.run_id)).answer == 4


async def test_a_budget_edit_not_above_what_is_used_is_refused(fapp: ms.App) -> None:
    model = ScriptedModel(
        [call("update_state", {"note": str(i)}) for i in range(4)] + [call("finish", {"answer": 4})]
    )
    agent = fapp.agent("capped", model=model, instructions="x", limits=ms.Limits(max_steps=2))
    handle = fapp.submit(agent, "go")
    await drain(fapp)
    [request] = fapp.requests()
    assert request.preview["used"] == 2
    for low in (1, 2, "lots"):
        # Accepted, it would only ask again at once: refused, and still pending.
        with pytest.raises(ms.InvalidAnswer, match=r"budget:max_steps"):
            fapp.answer(handle.run_id, request.id, decision="edit", arguments={"limit": low})
    assert [r.id for r in fapp.requests()] == ["budget:max_steps"]
    fapp.answer(handle.run_id, request.id, decision="edit", arguments={"limit": 3})
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status != "failed"


def test_a_raw_signal_without_a_decision_does_not_approve() -> None:
    from mainspring._requests import approval_from

    assert not approval_from({}).approved
    assert not approval_from({"reason": "looks fine"}).approved
    assert approval_from({"approve": True}).approved
    assert approval_from({"action": "retry"}).approved
    assert not approval_from({"action": "stop"}).approved
    assert approval_from({"limit": 80}).arguments == {"limit": 80}
    assert approval_from({"decision": "edit", "arguments": {"x": 1}}).arguments == {"x": 1}
    assert not approval_from({"decision": "reject", "reason": "no"}).approved
