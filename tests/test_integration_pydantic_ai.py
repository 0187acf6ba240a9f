"""Pydantic AI agents on mainspring (mainspring.integrations.pydantic_ai): real agents
talking Chat Completions through the official openai SDK to FakeOpenAIServer on
127.0.0.1, on SQLite and PostgreSQL; crashes in process (SimulatedCrash, a FakeClock
moving past the lease). The SIGKILL chaos of real worker processes is in
tests/test_integration_pydantic_ai_processes.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _helpers import Crash, drain
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry
from pydantic_ai import RunContext as AgentContext
from pydantic_ai.exceptions import CallDeferred
from pydantic_ai.messages import (
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
)
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.run import AgentRunResult
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import UsageLimits

import mainspring as ms
from mainspring.integrations.pydantic_ai import durable, forward_idempotency_key
from mainspring.limits import RateLimits
from mainspring.testing import EffectLedger, FakeClock, FakeOpenAIServer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as s:
        yield s


@pytest.fixture
def fake(server: FakeOpenAIServer) -> FakeOpenAIServer:
    server.reset()
    return server


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fapp(db_url: str, clock: FakeClock) -> Iterator[ms.App]:
    app = ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0)
    yield app
    app.close()


def model_of(server: FakeOpenAIServer) -> OpenAIChatModel:
    provider = OpenAIProvider(base_url=server.base_url, api_key="sk-test")
    return OpenAIChatModel("gpt-4.1-mini", provider=provider)


async def settle(app: ms.App, clock: FakeClock, rounds: int = 6) -> None:
    """Run workers until nothing is due, moving the fake clock past sleeps and leases."""
    for _ in range(rounds):
        await drain(app)
        clock.advance(app.lease_s + 1)


def steps(app: ms.App, run_id: str) -> list[tuple[str, str, str]]:
    return [(s.name, s.role or "", s.status) for s in app.store.load_steps(run_id)]


# -- model requests and tool calls are journaled steps ------------------------------------


class Refund(BaseModel):
    order: int
    status: str


async def test_an_agent_runs_as_a_workflow_with_journaled_turns(
    app: ms.App, fake: FakeOpenAIServer, tmp_path: Path
) -> None:
    ledger = EffectLedger(tmp_path / "ledger.db")
    agent = Agent(model_of(fake), name="support", output_type=Refund, instructions="Help.")

    @agent.tool_plain
    def refund(order: int) -> str:
        """Refund an order."""
        ledger.apply(ms.current_step().idempotency_key, "refund", order)
        return f"refunded {order}"

    support = durable(app, agent)
    fake.script(
        [
            fake.tool_call("refund", {"order": 7}),
            fake.tool_call("final_result", {"order": 7, "status": "refunded"}),
        ]
    )
    handle = app.submit(support, "Refund order 7", key="t-7")
    await drain(app)
    result = await handle.result()
    assert isinstance(result, AgentRunResult)
    assert result.output == Refund(order=7, status="refunded")
    assert [m.kind for m in result.all_messages()].count("response") == 2
    assert steps(app, handle.run_id) == [  # rate limits are on by default: a slot a call
        ("rate:openai:gpt-4.1-mini:default", "rate", "completed"),
        ("model:openai:gpt-4.1-mini", "model", "completed"),
        ("tool:refund", "tool", "completed"),
        ("rate:openai:gpt-4.1-mini:default", "rate", "completed"),
        ("model:openai:gpt-4.1-mini", "model", "completed"),
    ]
    assert ledger.report().keys == 1
    # the trace shows the turns with their tokens, cost and the tool's input
    trace = app.observe.trace(handle.run_id)
    models = [e for e in trace.entries if e.kind == "model"]
    assert len(models) == 2 and all(e.tokens_in > 0 and e.cost_usd > 0 for e in models)
    assert [e.input_summary for e in trace.entries if e.kind == "tool"] == ['{"order":7}']
    # the journaled reply holds Pydantic AI's response as JSON, never a pickle
    row = next(s for s in app.store.load_steps(handle.run_id) if s.role == "model")
    reply = json.loads(row.output or "{}")
    assert reply["response"]["kind"] == "response"
    assert reply["tool_calls"][0]["name"] == "refund"
    # the same key is the same run
    assert app.submit(support, "Refund order 7", key="t-7").run_id == handle.run_id


async def test_a_crash_sends_no_completed_request_again_and_no_effect_twice(
    fapp: ms.App, clock: FakeClock, fake: FakeOpenAIServer, tmp_path: Path
) -> None:
    ledger = EffectLedger(tmp_path / "ledger.db")
    agent = Agent(model_of(fake), name="crashy")
    crashed: list[int] = []

    @agent.tool_plain
    async def charge(amount: int) -> str:
        ledger.apply(ms.current_step().idempotency_key, "charge", amount)
        if amount == 2 and not crashed:
            crashed.append(amount)
            raise Crash  # the process dies after the effect, before the step's end
        return f"charged {amount}"

    flow = durable(fapp, agent)
    fake.script(
        [
            fake.tool_call("charge", {"amount": 1}),
            fake.tool_call("charge", {"amount": 2}),
            fake.text("all charged"),
        ]
    )
    handle = fapp.submit(flow, "charge twice")
    await settle(fapp, clock)
    assert (await handle.result()).output == "all charged"
    assert crashed == [2]
    assert len(fake.requests) == 3  # the two completed requests were not sent again
    report = ledger.report()
    assert report.keys == 2 and report.duplicate_effects == {}
    assert report.duplicate_calls  # the interrupted call ran again, under the same key


async def test_requests_book_the_shared_limiter_which_learns_from_headers(
    tmp_path: Path, fake: FakeOpenAIServer
) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'rate.db'}", rate_limits=RateLimits())
    flow = durable(app, Agent(model_of(fake), name="limited"))
    fake.script([fake.text("paced")])
    assert (await app.run(flow, "hello")).output == "paced"
    assert [(s[0], s[1]) for s in steps(app, app.list_runs()[0].id)] == [
        ("rate:openai:gpt-4.1-mini:default", "rate"),
        ("model:openai:gpt-4.1-mini", "model"),
    ]
    # the reply's x-ratelimit-* headers, read from the openai SDK's HTTP client
    assert app.rate_limits is not None
    limiter = app.rate_limits.bind(app.store, app.clock).limiter("openai", "gpt-4.1-mini")
    learned = limiter.table.state(limiter.key).learned
    assert (learned["rpm"], learned["tpm"]) == (10000, 2000000)
    app.close()


async def test_a_429_is_waited_out_never_a_failure(
    db_url: str, clock: FakeClock, fake: FakeOpenAIServer
) -> None:
    # Without a limiter (the path where a 429 is the only news of a limit; with one, a
    # test's FakeClock and PostgreSQL's own clock would disagree on when to come back).
    fapp = ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0, rate_limits=False)
    agent = Agent(model_of(fake), name="patient")
    flow = durable(fapp, agent)
    fake.script([fake.rate_limited(retry_after=30), fake.text("after the wait")])
    handle = fapp.submit(flow, "hello")
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "sleeping"  # back-pressure: it waits
    await settle(fapp, clock, rounds=40)
    assert (await handle.result()).output == "after the wait"
    assert fake.too_many_requests == 1 and len(fake.requests) == 2
    model_rows = [s for s in fapp.store.load_steps(handle.run_id) if s.role == "model"]
    assert [s.status for s in model_rows] == ["failed", "completed"]
    assert all(s.attempt == 1 for s in model_rows)  # the 429 spent no attempt
    fapp.close()


async def test_tool_control_flow_is_journaled_with_the_step(
    fapp: ms.App, clock: FakeClock, fake: FakeOpenAIServer
) -> None:
    agent = Agent(model_of(fake), name="retrying")
    calls: list[int] = []
    crashed: list[int] = []

    @agent.tool_plain
    def lookup(ticket: int) -> str:
        calls.append(ticket)
        if ticket < 0:
            raise ModelRetry("tickets are positive")
        if ticket == 13 and not crashed:
            crashed.append(ticket)
            raise Crash
        return f"ticket {ticket}"

    flow = durable(fapp, agent, effects={"lookup": "read"})
    fake.script(
        [
            fake.tool_call("lookup", {"ticket": -1}),
            fake.tool_call("lookup", {"ticket": 13}),
            fake.text("done"),
        ]
    )
    handle = fapp.submit(flow, "look")
    await drain(fapp)
    assert calls == [-1, 13]
    # Recovery replays the retry from the journal: the model is told the same thing.
    calls.clear()
    await settle(fapp, clock)
    assert (await handle.result()).output == "done"
    assert calls == [13]  # only the interrupted call ran again
    told = json.dumps(fake.requests[1].body)
    assert "tickets are positive" in told


async def test_a_fork_replays_the_turns_it_keeps_and_asks_the_model_anew_after(
    app: ms.App, fake: FakeOpenAIServer
) -> None:
    agent = Agent(model_of(fake), name="forked")

    @agent.tool_plain
    def lookup(ticket: int) -> str:
        return f"ticket {ticket}: open"

    flow = durable(app, agent)
    fake.script([fake.tool_call("lookup", {"ticket": 7}), fake.text("first answer")])
    first = await app.run(flow, "ticket 7?")
    assert first.output == "first answer"
    run_id = app.list_runs()[0].id
    tool_seq = next(s.seq for s in app.store.load_steps(run_id) if s.role == "tool")
    fake.script([fake.text("second answer")])
    fork = app.fork(run_id, from_step=tool_seq)
    await drain(app)
    assert (await fork.result()).output == "second answer"
    assert len(fake.requests) == 3  # the fork's first request and tool came from the journal


# -- typed outputs -------------------------------------------------------------------------


async def test_output_validation_retries_are_journaled_model_turns(
    app: ms.App, fake: FakeOpenAIServer
) -> None:
    agent = Agent(model_of(fake), name="typed", output_type=Refund, retries=3)

    @agent.output_validator
    def known(output: Refund) -> Refund:
        if output.order != 7:
            raise ModelRetry("only order 7 exists")
        return output

    flow = durable(app, agent)
    fake.script(
        [
            fake.tool_call("final_result", {"order": "seven", "status": "x"}),  # bad type
            fake.tool_call("final_result", {"order": 8, "status": "x"}),  # validator
            fake.tool_call("final_result", {"order": 7, "status": "refunded"}),
        ]
    )
    result = await app.run(flow, "refund 7")
    assert result.output == Refund(order=7, status="refunded")
    rows = [s for s in app.store.load_steps(app.list_runs()[0].id) if s.role == "model"]
    assert len(rows) == 3 and len(fake.requests) == 3


# -- approvals and deferred tools ----------------------------------------------------------


async def test_requires_approval_is_a_durable_wait_for_a_human(
    app: ms.App, fake: FakeOpenAIServer, tmp_path: Path
) -> None:
    ledger = EffectLedger(tmp_path / "ledger.db")
    agent = Agent(model_of(fake), name="approver")

    @agent.tool_plain(requires_approval=True)
    def close_account(account: str) -> str:
        ledger.apply(ms.current_step().idempotency_key, "close", account)
        return f"closed {account}"

    flow = durable(app, agent)
    fake.script([fake.tool_call("close_account", {"account": "a-1"}, id="call_close")])
    handle = app.submit(flow, "close a-1")
    await drain(app)
    run = app.get_run(handle.run_id)
    assert run.status == "waiting"  # the run left its worker
    (request,) = app.requests(handle.run_id)
    assert request.id == "approval:call_close"
    assert request.preview == {"tool": "close_account", "arguments": {"account": "a-1"}}
    assert ledger.report().keys == 0
    app.answer(handle.run_id, request.id, decision="edit", arguments={"account": "a-2"})
    fake.script([fake.text("closed")])
    await drain(app)
    assert (await handle.result()).output == "closed"
    assert ledger.report().keys == 1
    key = next(iter(ledger.keys()))
    assert ledger.calls_by_key() == {key: 1}
    assert len(fake.requests) == 2


async def test_a_rejection_reaches_the_model_and_irreversible_tools_ask_first(
    app: ms.App, fake: FakeOpenAIServer
) -> None:
    agent = Agent(model_of(fake), name="careful")
    ran: list[int] = []

    @agent.tool_plain
    def wire_money(amount: int) -> str:
        ran.append(amount)
        return "sent"

    flow = durable(app, agent, effects={"wire_money": "irreversible"})
    fake.script([fake.tool_call("wire_money", {"amount": 900}, id="call_w")])
    handle = app.submit(flow, "pay")
    await drain(app)
    (request,) = app.requests(handle.run_id)
    assert request.id == "approval:call_w"
    app.answer(handle.run_id, request.id, decision="reject", reason="too much")
    fake.script([fake.text("not sent")])
    await drain(app)
    assert (await handle.result()).output == "not sent"
    assert ran == []
    assert "too much" in json.dumps(fake.requests[1].body)


async def test_call_deferred_is_a_question_whose_answer_is_the_result(
    app: ms.App, fake: FakeOpenAIServer
) -> None:
    agent = Agent(model_of(fake), name="external")

    @agent.tool_plain
    def run_job(job: str) -> str:
        raise CallDeferred(metadata={"queue": "batch"})

    flow = durable(app, agent)
    fake.script([fake.tool_call("run_job", {"job": "report"}, id="call_job")])
    handle = app.submit(flow, "run the report")
    await drain(app)
    (request,) = app.requests(handle.run_id)
    assert request.id == "question:call_job" and request.kind == "question"
    assert request.preview["metadata"] == {"queue": "batch"}
    app.answer(handle.run_id, request.id, answer='{"rows": 12}')
    fake.script([fake.text("12 rows")])
    await drain(app)
    assert (await handle.result()).output == "12 rows"
    assert '{\\"rows\\":12}' in json.dumps(fake.requests[1].body)


# -- agent delegation: a child run -----------------------------------------------------------


async def test_a_sub_agent_in_a_tool_is_a_child_run(app: ms.App, fake: FakeOpenAIServer) -> None:
    billing_agent = Agent(model_of(fake), name="billing")
    billing = durable(app, billing_agent)
    support_agent = Agent(model_of(fake), name="support")

    @support_agent.tool
    async def ask_billing(ctx: AgentContext[None], question: str) -> str:
        """Ask the billing team."""
        result = await billing_agent.run(question, usage=ctx.usage)
        return result.output

    support = durable(app, support_agent, delegates=["ask_billing"])

    def reply(request: Any) -> Any:
        first_user = next(m for m in request.body["messages"] if m["role"] == "user")
        if first_user["content"] == "Was order 7 paid?":
            return fake.text("yes, paid")
        if any(m["role"] == "tool" for m in request.body["messages"]):
            return fake.text("billing says: yes, paid")
        return fake.tool_call("ask_billing", {"question": "Was order 7 paid?"})

    fake.fallback = reply
    try:
        handle = app.submit(support, "Is order 7 paid?")
        await drain(app, rounds=3)
        result = await handle.result()
    finally:
        fake.fallback = None
    assert result.output == "billing says: yes, paid"
    children = [r for r in app.list_runs() if r.workflow == billing.name]
    assert len(children) == 1 and children[0].parent == handle.run_id
    assert (await app.result(children[0].id)).output == "yes, paid"
    assert [s.role for s in app.store.load_steps(handle.run_id)].count("child") == 1


async def test_a_durable_agent_run_inside_a_journaled_tool_says_what_to_do(
    app: ms.App, fake: FakeOpenAIServer
) -> None:
    billing_agent = Agent(model_of(fake), name="billing2")
    durable(app, billing_agent)
    support_agent = Agent(model_of(fake), name="support2")

    @support_agent.tool_plain
    async def ask_billing(question: str) -> str:
        return (await billing_agent.run(question)).output

    support = durable(app, support_agent)
    fake.script([fake.tool_call("ask_billing", {"question": "paid?"})])
    with pytest.raises(ms.RunFailed, match=r"delegates=\[\.\.\.\]"):
        await app.run(support, "paid?")


# -- deps ----------------------------------------------------------------------------------


@dataclass
class Tenant:
    name: str


@dataclass
class Client:
    """Not JSON: built on each worker."""

    token: object


async def test_deps_travel_with_the_input_or_are_built_per_process(
    app: ms.App, fake: FakeOpenAIServer
) -> None:
    seen: list[str] = []
    by_input = Agent(model_of(fake), name="by_input", deps_type=Tenant)

    @by_input.tool
    def whoami(ctx: AgentContext[Tenant]) -> str:
        seen.append(ctx.deps.name)
        return ctx.deps.name

    flow = durable(app, by_input)
    fake.script([fake.tool_call("whoami", {}), fake.text("acme")])
    result = await app.run(flow, "who?", deps=Tenant(name="acme"))
    assert result.output == "acme" and seen == ["acme"]
    assert json.loads(app.list_runs()[0].input)["kwargs"]["deps"] == {"name": "acme"}

    built: list[int] = []
    by_factory = Agent(model_of(fake), name="by_factory", deps_type=Client)

    @by_factory.tool
    def token(ctx: AgentContext[Client]) -> str:
        return str(ctx.deps.token)

    flow2 = durable(app, by_factory, deps=lambda: built.append(1) or Client(token="t0k"))
    fake.script([fake.tool_call("token", {}), fake.text("t0k"), fake.text("again")])
    assert (await app.run(flow2, "token?")).output == "t0k"
    assert (await app.run(flow2, "token?", key="2")).output == "again"
    assert built == [1]  # once per process
    with pytest.raises(ms.ConfigError, match="cannot take"):
        app.submit(flow2, "x", deps=Client(token=1))

    class Pool:
        pass

    bad = Agent(model_of(fake), name="bad_deps", deps_type=Pool)
    with pytest.raises(ms.ConfigError, match=r"cannot be journaled.*deps=<a function"):
        durable(app, bad)


# -- streams, handlers, toolsets -------------------------------------------------------------


async def test_event_handlers_and_live_token_streams_both_get_the_run(
    fapp: ms.App, clock: FakeClock, fake: FakeOpenAIServer
) -> None:
    events: list[Any] = []

    async def handler(ctx: AgentContext[None], stream: Any) -> None:
        async for event in stream:
            events.append(event)

    agent = Agent(model_of(fake), name="streamer")

    @agent.tool_plain
    def step_one(n: int) -> str:
        if n == 2 and not events_seen_crash:
            events_seen_crash.append(1)
            raise Crash
        return f"one {n}"

    events_seen_crash: list[int] = []
    extra = FunctionToolset()

    @extra.tool_plain
    def step_two() -> str:
        return "two"

    flow = durable(fapp, agent, event_stream_handler=handler, toolsets=[extra])
    fake.script(
        [
            fake.tool_call("step_one", {"n": 1}),
            fake.tool_call("step_two", {}),
            fake.tool_call("step_one", {"n": 2}),
            fake.text("Streams reach both."),
        ]
    )
    handle = fapp.submit(flow, "go")
    await settle(fapp, clock)
    assert (await handle.result()).output == "Streams reach both."
    calls = [e.part.tool_name for e in events if isinstance(e, FunctionToolCallEvent)]
    # each call once: the crash came before step_one(2)'s turn told its events, and
    # the recovery does not repeat the events of the steps the journal held
    assert calls == ["step_one", "step_two", "step_one"]
    results = [e for e in events if isinstance(e, FunctionToolResultEvent)]
    assert len(results) == 3
    text = "".join(
        e.part.content
        if isinstance(e, PartStartEvent) and isinstance(e.part, TextPart)
        else e.delta.content_delta
        if isinstance(e, PartDeltaEvent) and isinstance(e.delta, TextPartDelta)
        else ""
        for e in events
    )
    assert text == "Streams reach both."  # as it was streamed, delta by delta
    assert all(r.body.get("stream") for r in fake.requests)
    # the text went to the run's live token stream as it formed
    pieces = [e.text for e in fapp.follow_tokens(handle.run_id).poll() if e.text]
    assert "Streams reach both." in "".join(pieces)
    assert [s[0] for s in steps(fapp, handle.run_id) if s[1] == "tool"] == [
        "tool:step_one",
        "tool:step_two",
        "tool:step_one",
    ]


# -- budgets ----------------------------------------------------------------------------------


async def test_limits_stop_or_ask_before_a_model_request(
    app: ms.App, fake: FakeOpenAIServer
) -> None:
    agent = Agent(model_of(fake), name="budgeted")

    @agent.tool_plain
    def work(n: int) -> str:
        return "ok"

    flow = durable(app, agent, limits=ms.Limits(max_steps=2))
    fake.script([fake.tool_call("work", {"n": 1}), fake.tool_call("work", {"n": 2})])
    handle = app.submit(flow, "work")
    await drain(app)
    (request,) = app.requests(handle.run_id)
    assert request.id == "budget:max_steps"
    app.answer(handle.run_id, request.id, decision="edit", arguments={"limit": 3})
    fake.script([fake.text("worked")])
    await drain(app)
    assert (await handle.result()).output == "worked"

    stopping = durable(
        app, agent, name="budgeted_stop", limits=ms.Limits(max_steps=1, on_exceeded="stop")
    )
    fake.script([fake.tool_call("work", {"n": 1})])
    with pytest.raises(ms.RunFailed, match="max_steps reached"):
        await app.run(stopping, "work")

    # Pydantic AI's own limits are passed on (its default: 50 requests a run)
    capped = durable(app, agent, name="pai_capped", usage_limits=UsageLimits(request_limit=1))
    fake.script([fake.tool_call("work", {"n": 1})])
    with pytest.raises(ms.RunFailed, match="request_limit of 1"):
        await app.run(capped, "work")


# -- configuration, MCP, the extra ---------------------------------------------------------


def test_bad_configuration_is_a_clear_error(app: ms.App, fake: FakeOpenAIServer) -> None:
    agent = Agent(model_of(fake), name="conf")
    with pytest.raises(ms.ConfigError, match="effect 'delete'"):
        durable(app, agent, effects={"x": "delete"})
    with pytest.raises(ms.ConfigError, match="delegates=\\['x'\\]"):
        durable(app, agent, delegates="x")
    with pytest.raises(ms.ConfigError, match="no name"):
        durable(app, Agent(model_of(fake)))
    with pytest.raises(ms.ConfigError, match=r"pydantic_ai\.Agent"):
        durable(app, object())  # type: ignore[arg-type]


async def test_mcp_calls_carry_their_step_idempotency_key(tmp_path: Path) -> None:
    sent: list[tuple[str, dict[str, Any], Any]] = []

    async def call_tool(name: str, args: dict[str, Any], *, metadata: Any = None) -> str:
        sent.append((name, args, metadata))
        return "ok"

    app = ms.App(f"sqlite:///{tmp_path / 'mcp.db'}")

    @app.workflow
    async def flow(ctx: ms.RunContext) -> str:
        async def step() -> str:
            return await forward_idempotency_key(None, call_tool, "rm", {"path": "/x"})  # type: ignore[arg-type]

        return await ctx.step(step, name="tool:rm", role="tool")

    handle = app.submit(flow)
    await drain(app)
    await handle.result()
    meta = sent[0][2]
    assert meta == {"mainspring/idempotency_key": f"{handle.run_id}:0:0", "mainspring/attempt": 1}
    await forward_idempotency_key(None, call_tool, "rm", {})  # type: ignore[arg-type]
    assert sent[1][2] is None  # outside a run: unchanged
    app.close()


def test_a_missing_extra_names_the_pip_install() -> None:
    code = (
        "import sys; sys.modules['pydantic_ai'] = None\n"
        "try:\n    import mainspring.integrations.pydantic_ai\n"
        "except ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert "pip install 'mainspring[pydantic-ai]'" in out.stdout
