"""Agent policies: a user's wrappers around tool and model calls, in a fixed order
with the built-in ones, without changing the journal of an agent that has none."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from _helpers import Crash, drain

import mainspring as ms
from mainspring.agent import (
    ModelCall,
    ModelNext,
    Policy,
    ToolAdmitNext,
    ToolNext,
    ToolOutcome,
    ToolUse,
    call_model,
)
from mainspring.limits import RateLimit, RateLimits
from mainspring.models import ModelResponse, ToolResultMessage, UserMessage
from mainspring.testing import FakeClock, ScriptedModel

call = ScriptedModel.call


def _results(model: ScriptedModel, turn: int) -> list[ToolResultMessage]:
    """The tool results the model saw in request ``turn``."""
    return [m for m in model.requests[turn].messages if isinstance(m, ToolResultMessage)]


class BlockOutsideMail(Policy):
    """Refuse mail to another domain: the tool does not run, the model reads why."""

    async def admit_tool(self, use: ToolUse, call_next: ToolAdmitNext) -> ToolUse | ToolOutcome:
        to = (use.arguments or {}).get("to", "")
        if use.name == "send_email" and not to.endswith("@example.com"):
            return ToolOutcome(f"send_email: {to!r} is outside example.com", is_error=True)
        return await call_next(use)


class CountModelCalls(Policy):
    def __init__(self) -> None:
        self.calls = 0

    async def around_model(self, call: ModelCall, call_next: ModelNext) -> ModelResponse:
        self.calls += 1
        return await call_next(call)


def _mail(app: ms.App, sent: list[str]) -> ms.Tool[Any, Any]:
    @app.tool(effect="write")
    def send_email(to: str, body: str) -> str:
        """Send an email."""
        sent.append(to)
        return f"sent to {to}"

    return send_email


async def test_a_users_policy_blocks_a_tool_call_and_the_model_is_told(app: ms.App) -> None:
    sent: list[str] = []
    model = ScriptedModel(
        [
            call("send_email", {"to": "eve@elsewhere.org", "body": "hi"}),
            call("send_email", {"to": "ana@example.com", "body": "hi"}),
            call("finish", {"answer": "ok"}),
        ]
    )
    counter = CountModelCalls()
    agent = app.agent(
        "mailer",
        model=model,
        instructions="x",
        tools=[_mail(app, sent)],
        policies=[BlockOutsideMail(), counter],
    )
    result = await app.run(agent, "mail")
    assert (result.status, result.tool_calls) == ("done", 1)  # the refused call never ran
    assert sent == ["ana@example.com"]
    refused = _results(model, 1)[-1]
    assert refused.is_error and "outside example.com" in refused.content
    assert counter.calls == 3
    # A refusal is not a repair: the model's call was well formed.
    assert result.state["repairs"] == 0


async def test_a_policy_edits_arguments_before_the_reviewer_sees_them(app: ms.App) -> None:
    refunds: list[int] = []

    @app.tool(effect="irreversible")
    def refund(cents: int, note: str) -> str:
        refunds.append(cents)
        return "refunded"

    class Redact(Policy):
        async def admit_tool(self, use: ToolUse, call_next: ToolAdmitNext) -> ToolUse | ToolOutcome:
            args = dict(use.arguments or {}, note="[redacted]")
            return await call_next(dataclasses.replace(use, arguments=args))

    model = ScriptedModel(
        [
            call("refund", {"cents": 500, "note": "card 4242"}, id="c1"),
            call("finish", {"answer": "done"}),
        ]
    )
    agent = app.agent("r", model=model, instructions="x", tools=[refund], policies=[Redact()])
    handle = app.submit(agent, "t")
    await drain(app)
    (request,) = app.requests(handle.run_id)
    assert request.preview["arguments"] == {"cents": 500, "note": "[redacted]"}
    app.answer(handle.run_id, "approval:c1", decision="approve")
    await drain(app)
    assert (await handle.result()).status == "done"
    assert refunds == [500]


async def test_around_tool_wraps_the_result_and_policies_nest_in_order(app: ms.App) -> None:
    seen: list[str] = []

    class Tag(Policy):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        async def admit_tool(self, use: ToolUse, call_next: ToolAdmitNext) -> ToolUse | ToolOutcome:
            seen.append(f"admit {self.tag}")
            return await call_next(use)

        async def around_tool(self, use: ToolUse, call_next: ToolNext) -> ToolOutcome:
            seen.append(f"run {self.tag}")
            outcome = await call_next(use)
            return dataclasses.replace(outcome, content=f"{self.tag}({outcome.content})")

    model = ScriptedModel(
        [
            call("send_email", {"to": "ana@example.com", "body": "hi"}),
            call("finish", {"answer": "ok"}),
        ]
    )
    agent = app.agent(
        "tagged",
        model=model,
        instructions="x",
        tools=[_mail(app, [])],
        policies=[Tag("outer"), Tag("inner")],
    )
    await app.run(agent, "t")
    assert seen == ["admit outer", "admit inner", "run outer", "run inner"]
    assert _results(model, 1)[0].content == "outer(inner(sent to ana@example.com))"


async def test_built_in_policies_come_first_and_approval_last(app: ms.App) -> None:
    """An unknown tool stops the run and invalid arguments or a used-up tool-call
    budget are answered before a user's policy sees the call."""
    seen: list[Any] = []

    class Record(Policy):
        async def admit_tool(self, use: ToolUse, call_next: ToolAdmitNext) -> ToolUse | ToolOutcome:
            seen.append(use.arguments)
            return await call_next(use)

    model = ScriptedModel(
        [
            call("send_email", {"to": 7}),  # invalid: repaired by the model
            call("send_email", {"to": "a@example.com", "body": "1"}),
            call("send_email", {"to": "b@example.com", "body": "2"}),  # past the cap
            call("finish", {"answer": "ok"}),
        ]
    )
    agent = app.agent(
        "capped",
        model=model,
        instructions="x",
        tools=[_mail(app, [])],
        limits=ms.Limits(max_tool_calls=1, on_exceeded="stop"),
        policies=[Record()],
    )
    result = await app.run(agent, "t")
    assert seen == [{"to": "a@example.com", "body": "1"}]
    assert result.tool_calls == 1

    unknown = app.agent(
        "unknown",
        model=ScriptedModel([call("rm_rf", {})]),
        instructions="x",
        policies=[Record()],
    )
    with pytest.raises(ms.RunFailed, match=r"ToolNotAllowed|UnknownTool"):
        await app.run(unknown, "t")
    assert len(seen) == 1


async def test_a_policy_may_ask_the_model_to_repair_a_call(app: ms.App) -> None:
    class NoEmptyBody(Policy):
        async def admit_tool(self, use: ToolUse, call_next: ToolAdmitNext) -> ToolUse | ToolOutcome:
            if not (use.arguments or {}).get("body"):
                raise ms.ToolInputError("send_email: 'body' must not be empty")
            return await call_next(use)

    model = ScriptedModel([call("send_email", {"to": "a@example.com", "body": ""})] * 3)
    agent = app.agent(
        "strict",
        model=model,
        instructions="x",
        tools=[_mail(app, [])],
        max_repairs=1,
        policies=[NoEmptyBody()],
    )
    with pytest.raises(ms.RunFailed, match="'body' must not be empty"):
        await app.run(agent, "t")


async def test_a_model_policy_sees_every_request_and_may_change_it(app: ms.App) -> None:
    class Remind(Policy):
        async def around_model(self, call: ModelCall, call_next: ModelNext) -> ModelResponse:
            messages = [*call.messages, UserMessage(content="Be brief.")]
            return await call_next(dataclasses.replace(call, messages=messages))

    model = ScriptedModel([call("finish", {"answer": "ok"})])
    agent = app.agent("brief", model=model, instructions="x", policies=[Remind()])
    assert (await app.run(agent, "t")).answer == "ok"
    last = model.requests[0].messages[-1]
    assert isinstance(last, UserMessage) and last.content == "Be brief."


async def test_a_pass_through_policy_leaves_the_journal_as_it_was(app: ms.App) -> None:
    def script() -> ScriptedModel:
        return ScriptedModel(
            [
                call("update_state", {"note": "start"}),
                call("send_email", {"to": "ana@example.com", "body": "hi"}),
                call("finish", {"answer": "ok"}),
            ]
        )

    mail = _mail(app, [])
    plain = app.agent("plain", model=script(), instructions="x", tools=[mail])
    wrapped = app.agent(
        "wrapped", model=script(), instructions="x", tools=[mail], policies=[Policy()]
    )
    journals = []
    for agent in (plain, wrapped):
        handle = app.submit(agent, "t")
        await drain(app)
        await handle.result()
        steps = app.observe.steps(handle.run_id)
        journals.append([(s.kind, s.name, s.status, s.output) for s in steps])
    assert journals[0] == journals[1]


async def test_policies_run_again_on_replay_but_the_model_is_not_called(
    db_url: str,
) -> None:
    clock = FakeClock()
    app = ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0)
    crashed: list[bool] = []

    @app.tool(effect="write")
    def flaky_write(n: int) -> int:
        if not crashed:
            crashed.append(True)
            raise Crash
        return n

    counter = CountModelCalls()
    model = ScriptedModel([call("flaky_write", {"n": 5}), call("finish", {"answer": "ok"})])
    agent = app.agent(
        "replayed", model=model, instructions="x", tools=[flaky_write], policies=[counter]
    )
    try:
        handle = app.submit(agent, "t")
        await drain(app)
        clock.advance(app.lease_s + 1)
        await drain(app)
        assert (await handle.result()).answer == "ok"
        assert len(model.requests) == 2  # the first reply came back from the journal
        assert counter.calls == 3  # but the hook saw it twice: count in the journal
    finally:
        app.close()


def test_rate_limits_are_bound_to_a_store_and_a_clock(app: ms.App) -> None:
    limits = RateLimits([RateLimit(provider="openai", model="m", rpm=60)])
    bound = limits.bind(lambda: app.store, app.clock)
    assert bound.clock is app.clock
    assert bound.limiter("openai", "m") is limits.limiter(app.store, app.clock, "openai", "m")
    assert bound.limiter("openai", "m").rate.rpm == 60


async def test_call_model_asks_for_bound_rate_limits(app: ms.App) -> None:
    limits = RateLimits()

    @app.workflow
    async def unbound(ctx: ms.RunContext) -> str:
        reply = await call_model(
            ctx, ScriptedModel(["hi"]), [UserMessage(content="x")], rate_limits=limits
        )  # type: ignore[arg-type]
        return reply.text or ""

    with pytest.raises(ms.RunFailed, match=r"rate_limits.bind\(app.store, app.clock\)"):
        await app.run(unbound)
