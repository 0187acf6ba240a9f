"""``doctor``: runs made to fail in each way of seed 000's failure table."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

import mainspring as ms
from mainspring.models import ModelResponse, Usage
from mainspring.testing import FakeClock, ScriptedModel

call = ScriptedModel.call
FAST = ms.RetryPolicy(max_attempts=2, initial_s=0.0, jitter=False)


@pytest.fixture
def fapp(db_url: str) -> ms.App:
    return ms.App(db_url, clock=FakeClock(), poll_interval_s=0.01, inline_wait_s=0.0)


def _tools(app: ms.App) -> list[ms.Tool[Any, Any]]:
    @app.tool
    def lookup(ticket: int) -> str:
        """Read a ticket."""
        return f"ticket {ticket}: open"

    @app.tool(retry=ms.RetryPolicy.never())
    def close(ticket: int) -> str:
        """Close a ticket."""
        raise PermissionError(f"ticket {ticket} is locked")

    return [lookup, close]


async def _run(app: ms.App, turns: list[Any], **options: Any) -> ms.RunTrace:
    agent = app.agent(
        "agent", model=ScriptedModel(turns), instructions="x", tools=_tools(app), **options
    )
    with contextlib.suppress(ms.RunFailed):  # some rows of the table fail the run
        await app.run(agent, "close the tickets")
    return app.observe.trace(app.list_runs()[0].id)


def _kinds(app: ms.App, trace: ms.RunTrace) -> set[str]:
    diagnosis = app.observe.diagnose(trace.run.id)
    for f in diagnosis.findings:
        assert f.evidence and f.next_steps
    return {f.kind for f in diagnosis.findings}


def _usage(turn: ModelResponse, tokens_in: int) -> ModelResponse:
    return ModelResponse(
        tool_calls=turn.tool_calls, usage=Usage(input_tokens=tokens_in, output_tokens=20)
    )


async def test_stopped_half_way(fapp: ms.App) -> None:
    trace = await _run(fapp, [ms.TransientError("upstream 503")] * 2, model_retry=FAST)
    assert trace.run.status == "failed"
    assert _kinds(fapp, trace) == {"stalled"}
    finding = fapp.observe.diagnose(trace.run.id).findings[0]
    assert "after 2 attempt(s) of TransientError" in finding.evidence[0]
    assert any("mainspring retry" in n for n in finding.next_steps)


async def test_repeating_the_same_action(fapp: ms.App) -> None:
    trace = await _run(fapp, [call("lookup", {"ticket": 7})] * 8 + [call("finish", {"answer": 1})])
    assert "looping" in _kinds(fapp, trace)


async def test_acting_on_stale_state(fapp: ms.App) -> None:
    """Nine tool turns with no plan written down, and then the run failed: stale state is
    one explanation the doctor offers."""
    turns = [call("lookup", {"ticket": n}) for n in range(9)]
    trace = await _run(fapp, [*turns, *[ms.TransientError("upstream 503")] * 2], model_retry=FAST)
    assert trace.run.status == "failed"
    assert _kinds(fapp, trace) == {"stalled", "stale_state"}


async def test_a_healthy_agent_gets_no_warning(fapp: ms.App) -> None:
    """The same nine tool turns in an agent that finished: nothing to report (an agent that
    keeps no written plan is not acting on stale state for it)."""
    turns = [call("lookup", {"ticket": n}) for n in range(9)] + [call("finish", {"answer": 1})]
    trace = await _run(fapp, turns)
    assert trace.run.status == "succeeded"
    diagnosis = fapp.observe.diagnose(trace.run.id)
    assert diagnosis.findings == ()
    assert diagnosis.summary == "succeeded; nothing from the failure table found"


async def test_a_healthy_agent_at_work_gets_no_warning(fapp: ms.App) -> None:
    """An agent in the middle of its work (nine tool turns, no plan written down, a
    status it polls that changed, now waiting for a person) is not acting on stale
    state: its page shows no warning."""
    polls = iter(["queued", "running"])

    @fapp.tool
    def status(job: int) -> str:
        """Poll a job's status."""
        return next(polls, "done")

    @fapp.tool(requires_approval=True)
    def send(ticket: int) -> str:
        """Send the report."""
        return "sent"

    turns = [call("lookup", {"ticket": n}) for n in range(7)]
    turns += [call("status", {"job": 1})] * 2 + [call("send", {"ticket": 1})]
    agent = fapp.agent(
        "agent",
        model=ScriptedModel(turns),
        instructions="x",
        tools=[*_tools(fapp), status, send],
    )
    with contextlib.suppress(ms.RunWaiting):
        await fapp.run(agent, "close the tickets")
    run = fapp.list_runs()[0]
    assert run.status == "waiting"
    diagnosis = fapp.observe.diagnose(run.id)
    assert diagnosis.findings == (), [f.title for f in diagnosis.findings]


async def test_tool_error_ignored(fapp: ms.App) -> None:
    trace = await _run(fapp, [call("close", {"ticket": 7}), call("finish", {"answer": "closed"})])
    kinds = _kinds(fapp, trace)
    assert "ignored_tool_error" in kinds
    finding = next(
        f for f in fapp.observe.diagnose(trace.run.id).findings if f.kind == "ignored_tool_error"
    )
    assert "PermissionError" in finding.evidence[0] and "ticket 7 is locked" in finding.evidence[0]


async def test_context_bloated(fapp: ms.App) -> None:
    sizes = [1000, 2000, 4000, 6000, 8000, 10000]
    turns = [_usage(call("lookup", {"ticket": n}), size) for n, size in enumerate(sizes)]
    trace = await _run(fapp, [*turns, _usage(call("finish", {"answer": 1}), 12000)])
    assert _kinds(fapp, trace) == {"context_bloat"}


async def test_done_but_wrong(fapp: ms.App) -> None:
    plan = [{"text": "read", "status": "done"}, {"text": "close"}, {"text": "report"}]
    trace = await _run(
        fapp,
        [
            call("update_state", {"plan": plan}),
            call("lookup", {"ticket": 7}),
            call("finish", {"answer": "all closed"}),
        ],
    )
    assert _kinds(fapp, trace) == {"done_but_wrong"}
    finding = fapp.observe.diagnose(trace.run.id).findings[0]
    assert "2 of 3 plan items open" in finding.evidence[0]


async def test_a_healthy_run_has_no_findings(fapp: ms.App) -> None:
    plan = [{"text": "read", "status": "done"}]
    trace = await _run(
        fapp,
        [
            call("update_state", {"plan": plan}),
            call("lookup", {"ticket": 7}),
            call("finish", {"answer": "read it"}),
        ],
    )
    diagnosis = fapp.observe.diagnose(trace.run.id)
    assert diagnosis.findings == ()
    assert "nothing from the failure table" in diagnosis.summary
