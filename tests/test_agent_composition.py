"""Agents composed as child runs: an agent as a tool of another agent
(``researcher.as_tool()``), each call a child run of the caller with its own journal."""

from __future__ import annotations

import json

import pytest
from _helpers import drain
from pydantic import BaseModel

import mainspring as ms
from mainspring.models import ToolResultMessage
from mainspring.testing import ScriptedModel


@pytest.fixture
def fapp(db_url: str) -> ms.App:
    app = ms.App(db_url, clock=ms.FakeClock(), poll_interval_s=0.01, inline_wait_s=0.0)
    yield app
    app.close()


def _tool_results(model: ScriptedModel) -> list[tuple[str, str, bool]]:
    last = model.requests[-1].messages
    return [(m.name, m.content, m.is_error) for m in last if isinstance(m, ToolResultMessage)]


async def test_an_agent_as_a_tool_runs_as_a_child_and_answers(fapp: ms.App):
    researcher_model = ScriptedModel(
        [
            ScriptedModel.call("finish", {"answer": "Paris"}),
            ScriptedModel.call("finish", {"answer": "Rome"}),
        ]
    )
    researcher = fapp.agent("researcher", model=researcher_model, instructions="Research.")
    planner_model = ScriptedModel(
        [
            ScriptedModel.call("ask_researcher", {"task": "capital of France?"}),
            ScriptedModel.call("ask_researcher", {"task": "capital of Italy?"}),
            ScriptedModel.call("finish", {"answer": "Paris and Rome"}),
        ]
    )
    tool = researcher.as_tool(name="ask_researcher")
    assert tool.spec().parameters["required"] == ["task"]
    planner = fapp.agent("planner", model=planner_model, instructions="Plan.", tools=[tool])

    handle = fapp.submit(planner, "Name two capitals")
    await drain(fapp)
    result = await handle.result()
    assert (result.status, result.answer) == ("done", "Paris and Rome")
    assert _tool_results(planner_model)[-1] == ("ask_researcher", "Rome", False)
    kids = fapp.children(handle.run_id)
    assert [(k.workflow, k.status) for k in kids] == [("researcher", "succeeded")] * 2
    # each child is a run of its own, with its own journal (its model call)
    assert any(s.name.startswith("model:") for s in fapp.observe.steps(kids[0].id))
    first_task = next(m for m in researcher_model.requests[0].messages if m.kind == "user")
    assert first_task.content.startswith("Task: capital of France?")


async def test_a_failing_sub_agent_is_an_error_result_for_the_caller(fapp: ms.App):
    broken = fapp.agent(
        "broken",
        model=ScriptedModel([ScriptedModel.call("no_such_tool", {})]),
        instructions="Fail.",
    )
    planner_model = ScriptedModel(
        [
            ScriptedModel.call("broken", {"task": "try"}),
            ScriptedModel.call("finish", {"answer": "gave up"}),
        ]
    )
    planner = fapp.agent(
        "planner", model=planner_model, instructions="Plan.", tools=[broken.as_tool()]
    )
    handle = fapp.submit(planner, "go")
    await drain(fapp)
    assert (await handle.result()).answer == "gave up"
    ((name, content, is_error),) = _tool_results(planner_model)
    assert (name, is_error) == ("broken", True)
    assert "agent 'broken' failed" in content
    (kid,) = fapp.children(handle.run_id)
    assert kid.status == "failed"


def test_an_agent_tool_is_not_called_directly(fapp: ms.App):
    helper = fapp.agent("helper", model=ScriptedModel([]), instructions="Help.")
    with pytest.raises(ms.ConfigError, match="child run"):
        helper.as_tool()("a task")


async def test_a_sub_agents_usage_counts_in_the_callers_budget(fapp: ms.App):
    from mainspring.models import ModelResponse, ToolCall, Usage

    big = ModelResponse(
        tool_calls=(ToolCall(id="c1", name="finish", arguments='{"answer": "found it"}'),),
        finish_reason="tool_calls",
        usage=Usage(input_tokens=5000, output_tokens=1000),
    )
    digger = fapp.agent("digger", model=ScriptedModel([big]), instructions="Dig.")
    planner_model = ScriptedModel(
        [
            ScriptedModel.call("digger", {"task": "dig"}),
            ScriptedModel.call("digger", {"task": "dig again"}),  # never asked
        ]
    )
    planner = fapp.agent(
        "planner",
        model=planner_model,
        instructions="Plan.",
        tools=[digger.as_tool()],
        limits=ms.Limits(max_tokens=3000, on_exceeded="stop"),
    )
    handle = fapp.submit(planner, "go")
    await drain(fapp)
    result = await handle.result()
    assert result.status == "partial" and "max_tokens reached" in (result.reason or "")
    assert result.input_tokens + result.output_tokens >= 6000  # the sub-agent's 6000
    assert len(fapp.children(handle.run_id)) == 1
    assert len(planner_model.requests) == 1  # its own usage alone was far below the cap


async def test_a_handoff_moves_the_task_to_another_agent_whose_result_is_final(fapp: ms.App):
    billing_model = ScriptedModel([ScriptedModel.call("finish", {"answer": "refunded 40 EUR"})])
    billing = fapp.agent("billing", model=billing_model, instructions="Handle billing.")
    triage_model = ScriptedModel(
        [
            ScriptedModel.call("update_state", {"facts": ["customer 7 was charged twice"]}),
            ScriptedModel.call("transfer_to_billing", {"note": "refund the double charge"}),
        ]
    )
    triage = fapp.agent(
        "triage", model=triage_model, instructions="Route tickets.", handoffs=[billing]
    )
    assert "transfer_to_billing" in [t.name for t in fapp.agents["triage"].tool_specs()]
    handle = fapp.submit(triage, "Ticket 7: I was charged twice")
    await drain(fapp)
    result = await handle.result()
    assert (result.status, result.answer) == ("done", "refunded 40 EUR")
    assert result.turns == 3  # two of triage's, one of billing's
    (kid,) = fapp.children(handle.run_id)
    assert kid.workflow == "billing"
    task = next(m for m in billing_model.requests[0].messages if m.kind == "user").content
    assert "Ticket 7: I was charged twice" in task
    assert "refund the double charge" in task
    assert "customer 7 was charged twice" in task  # the state moved with the task


def test_handoffs_take_agents(fapp: ms.App):
    @fapp.workflow
    async def plain(ctx: ms.RunContext, task: str) -> str:
        return task

    with pytest.raises(ms.ConfigError, match="handoffs take agents"):
        fapp.agent("x", model=ScriptedModel([]), instructions=".", handoffs=[plain])


async def test_a_typed_sub_agent_answers_its_caller_in_json(fapp: ms.App):
    """A sub-agent with an ``output_type`` hands its caller the validated value, which
    the calling model reads as JSON."""

    class Capital(BaseModel):
        country: str
        city: str

    researcher = fapp.agent(
        "typed_researcher",
        model=ScriptedModel([ScriptedModel.call("finish", {"country": "France", "city": "Paris"})]),
        instructions="Research.",
        output_type=Capital,
    )
    planner_model = ScriptedModel(
        [
            ScriptedModel.call("typed_researcher", {"task": "capital of France?"}),
            ScriptedModel.call("finish", {"answer": "Paris"}),
        ]
    )
    planner = fapp.agent(
        "typed_planner", model=planner_model, instructions="Plan.", tools=[researcher.as_tool()]
    )
    handle = fapp.submit(planner, "France?")
    await drain(fapp)
    assert (await handle.result()).answer == "Paris"
    name, content, is_error = _tool_results(planner_model)[-1]
    assert (name, is_error) == ("typed_researcher", False)
    assert json.loads(content) == {"country": "France", "city": "Paris"}
