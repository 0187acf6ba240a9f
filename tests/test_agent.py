"""The agent loop, driven by ScriptedModel: tools, repair, policy, budgets, sessions."""

from __future__ import annotations

from typing import Any

import pytest
from _helpers import Crash, drain

import mainspring as ms
from mainspring.models import ModelResponse
from mainspring.testing import FakeClock, ScriptedModel

call = ScriptedModel.call


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fapp(db_url: str, clock: FakeClock) -> ms.App:
    return ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0)


def _tools(app: ms.App, sent: list[str]) -> tuple[ms.Tool[Any, Any], ms.Tool[Any, Any]]:
    @app.tool
    def lookup_ticket(ticket: int) -> dict[str, Any]:
        """Read a ticket.

        Args:
            ticket: the ticket number.
        """
        return {"ticket": ticket, "text": "printer on fire", "customer": "ana@example.com"}

    @app.tool(effect="write")
    def send_email(to: str, body: str, *, ctx: ms.ToolContext) -> str:
        """Send an email (the mail API deduplicates by idempotency key)."""
        sent.append(ctx.idempotency_key)
        return "queued"

    return lookup_ticket, send_email


async def test_agent_uses_tools_and_finishes(app: ms.App) -> None:
    sent: list[str] = []
    tools = _tools(app, sent)
    model = ScriptedModel(
        [
            call("update_state", {"plan": [{"text": "read ticket"}, {"text": "reply"}]}),
            call("lookup_ticket", {"ticket": 7}),
            call("send_email", {"to": "ana@example.com", "body": "On it."}),
            call("finish", {"answer": "replied to ticket 7"}),
        ]
    )
    agent = app.agent("support", model=model, instructions="Answer tickets.", tools=tools)
    result = await app.run(agent, "Answer ticket 7")
    assert result.status == "done"
    assert result.answer == "replied to ticket 7"
    assert (result.turns, result.tool_calls) == (4, 2)
    assert result.state["plan"] == [
        {"text": "read ticket", "status": "todo"},
        {"text": "reply", "status": "todo"},
    ]
    assert len(sent) == 1
    run_id = app.list_runs()[0].id
    names = [s.name for s in app.observe.steps(run_id)]
    assert names == [
        "model:scripted:scripted",
        "model:scripted:scripted",
        "tool:lookup_ticket",
        "model:scripted:scripted",
        "tool:send_email",
        "model:scripted:scripted",
    ]
    assert sent == [f"{run_id}:0:4"]
    # The model saw the tool's result and the state block in its next request.
    second = model.requests[2].messages
    assert any("printer on fire" in getattr(m, "content", "") for m in second)
    assert "[ ] 1. read ticket" in second[1].content  # type: ignore[union-attr]


async def test_crash_mid_agent_resumes_without_calling_the_model_again(
    fapp: ms.App, clock: FakeClock
) -> None:
    sent: list[str] = []
    lookup, send = _tools(fapp, sent)
    crashed = {"done": False}

    @fapp.tool(effect="write")
    def flaky_write(n: int) -> int:
        if not crashed["done"]:
            crashed["done"] = True
            raise Crash
        return n

    model = ScriptedModel(
        [
            call("lookup_ticket", {"ticket": 1}),
            call("flaky_write", {"n": 5}),
            call("finish", {"answer": "ok"}),
        ]
    )
    agent = fapp.agent("a", model=model, instructions="x", tools=[lookup, send, flaky_write])
    handle = fapp.submit(agent, "task")
    await drain(fapp)
    assert len(model.requests) == 2
    clock.advance(fapp.lease_s + 1)
    await drain(fapp)
    result = await handle.result()
    assert result.status == "done"
    assert len(model.requests) == 3  # turns 1 and 2 came from the journal


async def test_malformed_arguments_are_repaired(app: ms.App) -> None:
    tools = _tools(app, [])
    model = ScriptedModel(
        [
            call("lookup_ticket", '{"ticket": "seven"'),  # broken JSON
            call("lookup_ticket", {"ticket": "seven"}),  # wrong type
            call("lookup_ticket", {"ticket": 7}),
            call("finish", {"answer": "done"}),
        ]
    )
    agent = app.agent("r", model=model, instructions="x", tools=tools)
    result = await app.run(agent, "t")
    assert result.status == "done"
    assert result.state["repairs"] == 2
    feedback = [m for m in model.requests[2].messages if getattr(m, "is_error", False)]
    assert any("ticket" in m.content and "integer" in m.content for m in feedback)  # type: ignore[union-attr]


async def test_repairs_are_bounded(app: ms.App) -> None:
    tools = _tools(app, [])
    model = ScriptedModel([call("lookup_ticket", "not json")] * 5)
    agent = app.agent("r", model=model, instructions="x", tools=tools, max_repairs=2)
    with pytest.raises(ms.RunFailed) as info:
        await app.run(agent, "t")
    assert info.value.error["type"] == "mainspring._errors.ModelOutputError"


async def test_unknown_tool_stops_at_once(app: ms.App) -> None:
    tools = _tools(app, [])
    model = ScriptedModel([call("delete_everything", {})])
    agent = app.agent("u", model=model, instructions="x", tools=tools)
    with pytest.raises(ms.RunFailed) as info:
        await app.run(agent, "t")
    assert info.value.error["type"] == "mainspring._errors.UnknownTool"
    assert "delete_everything" in info.value.error["message"]


async def test_text_reply_with_fenced_action_is_an_action(app: ms.App) -> None:
    tools = _tools(app, [])
    model = ScriptedModel(
        [
            'Let me look.\n```json\n{"tool": "lookup_ticket", "arguments": {"ticket": 3}}\n```',
            "The printer is on fire.",  # plain text: the final answer
        ]
    )
    agent = app.agent("t", model=model, instructions="x", tools=tools)
    result = await app.run(agent, "t")
    assert (result.status, result.answer, result.tool_calls) == (
        "done",
        "The printer is on fire.",
        1,
    )


async def test_completion_validators_gate_finish(app: ms.App) -> None:
    tools = _tools(app, [])
    model = ScriptedModel([call("finish", {"answer": "maybe"}), call("finish", {"answer": "42"})])

    def numeric(answer: Any, state: ms.AgentState) -> str | None:
        return None if str(answer).isdigit() else "the answer must be a number"

    agent = app.agent("v", model=model, instructions="x", tools=tools, validators=[numeric])
    result = await app.run(agent, "t")
    assert result.answer == "42"
    assert any("must be a number" in getattr(m, "content", "") for m in model.requests[1].messages)


async def test_loop_detection_nudges_then_stops(app: ms.App) -> None:
    tools = _tools(app, [])
    model = ScriptedModel([call("lookup_ticket", {"ticket": 1})] * 10)
    agent = app.agent("l", model=model, instructions="x", tools=tools)
    with pytest.raises(ms.RunFailed) as info:
        await app.run(agent, "t")
    assert info.value.error["type"] == "mainspring._errors.LoopDetected"
    assert len(model.requests) == 6  # 3 repeats, a nudge, 3 more repeats
    nudged = model.requests[3].messages
    assert any("not making progress" in getattr(m, "content", "") for m in nudged)


async def test_a_run_that_recovered_from_a_loop_is_nudged_again_not_stopped(
    app: ms.App,
) -> None:
    """A long run meets unrelated repetitions now and then: after 20 clean turns the
    guard nudges a new loop rather than stopping the run (the horizon suite lost 3 of 7
    1,000-step runs to a second repetition hundreds of turns after the first)."""
    tools = _tools(app, [])
    script = (
        [call("lookup_ticket", {"ticket": 1})] * 3  # a loop: nudged
        + [call("lookup_ticket", {"ticket": 100 + i}) for i in range(20)]  # recovered
        + [call("lookup_ticket", {"ticket": 2})] * 3  # another loop: nudged again
        + [call("finish", {"answer": "done"})]
    )
    model = ScriptedModel(script)
    agent = app.agent("r", model=model, instructions="x", tools=tools)
    result = await app.run(agent, "t")
    assert result.status == "done"
    nudges = [
        i
        for i, request in enumerate(model.requests)
        if any("not making progress" in getattr(m, "content", "") for m in request.messages[-1:])
    ]
    assert nudges == [3, 26]


async def test_budget_stop_returns_partial_results(app: ms.App) -> None:
    tools = _tools(app, [])
    model = ScriptedModel([call("lookup_ticket", {"ticket": i}) for i in range(10)])
    limits = ms.Limits(max_steps=3, on_exceeded="stop")
    agent = app.agent("b", model=model, instructions="x", tools=tools, limits=limits)
    result = await app.run(agent, "t")
    assert (result.status, result.turns, result.answer) == ("partial", 3, None)
    assert result.reason == "max_steps reached (3 of 3)"


async def test_budget_pauses_for_a_human_before_stopping(app: ms.App) -> None:
    tools = _tools(app, [])
    script = [call("lookup_ticket", {"ticket": i}) for i in range(4)]
    model = ScriptedModel([*script, call("finish", {"answer": "all read"})])
    agent = app.agent(
        "h", model=model, instructions="x", tools=tools, limits=ms.Limits(max_steps=2)
    )
    handle = app.submit(agent, "t")
    await drain(app)
    run = app.get_run(handle.run_id)
    assert (run.status, run.wait_reason) == ("waiting", "signal:budget:max_steps")
    app.answer(handle.run_id, "budget:max_steps", decision="edit", arguments={"limit": 10})
    await drain(app)
    result = await handle.result()
    assert (result.status, result.turns) == ("done", 5)


async def test_irreversible_tool_waits_for_approval(app: ms.App) -> None:
    refunds: list[int] = []

    @app.tool(effect="irreversible")
    def refund(cents: int) -> str:
        refunds.append(cents)
        return "refunded"

    model = ScriptedModel(
        [
            call("refund", {"cents": 5000}, id="c1"),
            call("refund", {"cents": 9000}, id="c2"),
            call("finish", {"answer": "done"}),
        ]
    )
    agent = app.agent("p", model=model, instructions="x", tools=[refund])
    handle = app.submit(agent, "t")
    await drain(app)
    assert app.get_run(handle.run_id).wait_reason == "signal:approval:c1"
    app.answer(handle.run_id, "approval:c1", decision="edit", arguments={"cents": 4000})
    await drain(app)
    app.answer(handle.run_id, "approval:c2", decision="reject", reason="too much")
    await drain(app)
    assert (await handle.result()).status == "done"
    assert refunds == [4000]  # edited by the reviewer; the second was rejected
    rejected = model.requests[2].messages
    user = ms._app.local_user()  # who decided: the local user (the API key over HTTP)
    expected = f"rejected by the reviewer ({user}): too much"
    assert any(expected in getattr(m, "content", "") for m in rejected)


async def test_sessions_hand_off_state(app: ms.App) -> None:
    tools = _tools(app, [])
    turns: list[ModelResponse | str] = [
        call("update_state", {"facts": ["ticket 1 read"]}),
        *[call("lookup_ticket", {"ticket": i}) for i in range(2, 7)],
        call("finish", {"answer": "done"}),
    ]
    model = ScriptedModel(turns)
    agent = app.agent("s", model=model, instructions="x", tools=tools, session_turns=2)
    result = await app.run(agent, "t")
    assert (result.status, result.sessions, result.turns) == ("done", 4, 7)
    assert result.state["facts"] == ["ticket 1 read"]
    last = model.requests[-1].messages
    assert "ticket 1 read" in last[1].content  # type: ignore[union-attr]
    assert "Earlier sessions:" in last[1].content  # type: ignore[union-attr]
    run_id = app.list_runs()[0].id
    assert app.get_run(run_id).session == 3


async def test_context_stays_small_over_200_turns(app: ms.App) -> None:
    """Total prompt tokens: mainspring's policy vs resending the whole history."""
    from mainspring.context import History, Turn
    from mainspring.models._common import estimate_input_tokens

    @app.tool
    def read_page(page: int) -> str:
        return f"page {page}: " + "lorem ipsum dolor sit amet " * 40

    n = 200
    model = ScriptedModel(
        [*[call("read_page", {"page": i}) for i in range(n)], call("finish", {"answer": "read"})]
    )
    agent = app.agent(
        "c", model=model, instructions="Read.", tools=[read_page], limits=ms.Limits(max_steps=None)
    )
    await app.run(agent, "read the book")
    specs = app.agents["c"].tool_specs()
    ours = sum(estimate_input_tokens(r.messages, specs) for r in model.requests)
    naive_history = History()
    naive = 0
    for request in model.requests:
        messages = naive_history.full_messages(instructions="Read.", task="read the book")
        naive += estimate_input_tokens(messages, specs)
        del request
        step = len(naive_history.turns)
        if step < n:
            naive_history.add(
                Turn(
                    assistant=model.requests[step + 1].messages[-2],  # type: ignore[arg-type]
                    results=[model.requests[step + 1].messages[-1]],  # type: ignore[list-item]
                )
            )
    assert naive / ours >= 10, (naive, ours)


@pytest.mark.parametrize(
    ("bound", "value"),
    [("session_tokens", 3000), ("session_bytes", 1500), ("session_wall_s", 5.0)],
)
async def test_sessions_end_at_token_byte_and_time_bounds(
    fapp: ms.App, clock: FakeClock, bound: str, value: float
) -> None:
    @fapp.tool
    def read_page(page: int) -> str:
        clock.advance(2)  # each page takes two (fake) seconds
        return f"page {page}: " + "text " * 100

    turns: list[ModelResponse | str] = [call("read_page", {"page": i}) for i in range(6)]
    model = ScriptedModel([*turns, call("finish", {"answer": "read"})])
    agent = fapp.agent(
        f"bounded-{bound}", model=model, instructions="x", tools=[read_page], **{bound: value}
    )
    handle = fapp.submit(agent, "read six pages")
    await drain(fapp)
    result = await handle.result()
    assert result.status == "done"
    assert result.sessions > 1  # the bound ended sessions before the task did
    assert result.tool_calls == 6  # nothing repeated across the hand-offs


def test_a_cost_cap_needs_a_price(app: ms.App) -> None:
    model = ScriptedModel([call("finish", {"answer": "x"})], model_id="in-house-7b")
    with pytest.raises(ms.ConfigError, match="no price for model 'in-house-7b'"):
        app.agent("a", model=model, instructions="x", limits=ms.Limits(max_cost_usd=1.0))
    prices = {"in-house-7b": ms.limits.Price(0.1, 0.2)}
    app.agent("b", model=model, instructions="x", limits=ms.Limits(max_cost_usd=1.0), prices=prices)
