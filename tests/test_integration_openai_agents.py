"""An existing OpenAI Agents SDK agent (handoff, agent as tool, effectful tools,
approvals, streams, guardrails, output types, MCP) made durable with
``durable(app, agent)``, against FakeOpenAIServer's Responses API on 127.0.0.1."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

import openai
from _helpers import Crash, drain
from agents import (
    Agent,
    GuardrailFunctionOutput,
    RunConfig,
    function_tool,
    input_guardrail,
)
from agents.mcp import MCPServer
from mcp.types import CallToolResult, TextContent, Tool
from pydantic import BaseModel

import mainspring as ms
from mainspring.integrations.openai_agents import durable, effect
from mainspring.limits import Limits, RateLimit
from mainspring.testing import FakeOpenAIServer

MODEL = "gpt-4.1-mini"
NO_TRACING = RunConfig(tracing_disabled=True)  # the SDK's exporter would post to OpenAI


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as s:
        yield s


@pytest.fixture
def fake(server: FakeOpenAIServer) -> FakeOpenAIServer:
    return server.reset()


@pytest.fixture
def client(server: FakeOpenAIServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-test")


@pytest.fixture
def clock() -> ms.FakeClock:
    return ms.FakeClock()


@pytest.fixture
def fapp(db_url: str, clock: ms.FakeClock) -> ms.App:
    # No limiter, so that the journal positions (and the keys the tools see) below are
    # the integration's own; the limiter (on by default) is tested on its own below and
    # in the process test, which runs the default App.
    return ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0, rate_limits=False)


class Shop:
    """The agents of a support desk, and what their tools did."""

    def __init__(self, crash_charge: bool = False) -> None:
        self.effects: list[tuple[str, str, Any]] = []
        self.crash_charge = crash_charge

        @function_tool
        def lookup(order: int) -> str:
            """Look an order up."""
            self.effects.append(("lookup", ms.current_step().idempotency_key, order))
            return f"order {order}: paid 5 USD"

        @function_tool
        def charge(order: int, amount: int) -> str:
            """Charge an order."""
            self.effects.append(("charge", ms.current_step().idempotency_key, order))
            if self.crash_charge:
                self.crash_charge = False
                raise Crash  # the process dies mid-tool
            return f"charged {amount} for {order}"

        @function_tool(needs_approval=True)
        def refund(order: int) -> str:
            """Refund an order."""
            self.effects.append(("refund", ms.current_step().idempotency_key, order))
            return f"refunded {order}"

        self.auditor = Agent(name="auditor", instructions="audit", tools=[lookup], model=MODEL)
        audit = self.auditor.as_tool(tool_name="audit", tool_description="Audit an order.")
        self.billing = Agent(
            name="billing", instructions="billing", tools=[charge, refund, audit], model=MODEL
        )
        self.triage = Agent(
            name="triage", instructions="triage", handoffs=[self.billing], model=MODEL
        )

    def done(self, kind: str) -> list[Any]:
        return [e for e in self.effects if e[0] == kind]


def happy_path(fake: FakeOpenAIServer) -> None:
    fake.script(
        [
            fake.tool_call("transfer_to_billing", {}),  # triage hands off
            fake.tool_call("audit", {"input": "order 7"}),  # billing asks the auditor
            fake.tool_call("lookup", {"order": 7}),  # the auditor's own tool
            fake.text("order 7 is fine"),  # the auditor's answer
            fake.tool_call("charge", {"order": 7, "amount": 5}),
            fake.text("Charged order 7."),
        ]
    )


async def test_agent_with_handoff_agent_tool_and_tools_is_journaled(
    fapp: ms.App, fake: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    shop = Shop()
    support = durable(
        fapp, shop.triage, name="support", openai_client=client, run_config=NO_TRACING
    )
    happy_path(fake)
    handle = fapp.submit(support, "Charge order 7", key="t-7")
    await drain(fapp)
    assert await handle.result() == "Charged order 7."
    assert all(r.path == "/v1/responses" for r in fake.requests)
    steps = fapp.observe.steps(handle.run_id)
    assert [(s.role, s.name) for s in steps] == [
        ("model", f"model:openai:{MODEL}"),
        ("model", f"model:openai:{MODEL}"),
        ("model", f"model:openai:{MODEL}"),  # the nested auditor, in this run
        ("tool", "tool:lookup"),
        ("model", f"model:openai:{MODEL}"),  # the auditor's answer
        ("model", f"model:openai:{MODEL}"),
        ("tool", "tool:charge"),
        ("model", f"model:openai:{MODEL}"),
    ]
    # The tools saw their steps' idempotency keys.
    assert shop.done("charge") == [("charge", f"{handle.run_id}:0:6", 7)]
    assert shop.done("lookup") == [("lookup", f"{handle.run_id}:0:3", 7)]
    # Rate-limit headers of the SDK's client reached the journal; the trace has
    # tokens and the tool calls' inputs.
    first = json.loads(steps[0].output or "{}")
    assert first["rate_limit"]["x-ratelimit-limit-requests"] == "10000"
    trace = fapp.observe.trace(handle.run_id)
    models = [e for e in trace.entries if e.kind == "model"]
    assert len(models) == 6 and all(e.tokens_in > 0 and e.tokens_out > 0 for e in models)
    tools = [(e.tool, e.input_summary) for e in trace.entries if e.kind == "tool"]
    assert tools == [("lookup", '{"order": 7}'), ("charge", '{"order": 7, "amount": 5}')]


async def test_a_crash_replays_without_sending_a_completed_model_call(
    fapp: ms.App, clock: ms.FakeClock, fake: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    shop = Shop(crash_charge=True)
    support = durable(
        fapp, shop.triage, name="support", openai_client=client, run_config=NO_TRACING
    )
    happy_path(fake)
    handle = fapp.submit(support, "Charge order 7")
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "running"  # died holding its lease
    assert len(fake.requests) == 5
    clock.advance(fapp.lease_s + 1)
    await drain(fapp)
    assert await handle.result() == "Charged order 7."
    # Only the last model call is new; the charge ran again under the same key
    # (at least once), the auditor's lookup once.
    assert len(fake.requests) == 6
    key = f"{handle.run_id}:0:6"
    assert shop.done("charge") == [("charge", key, 7), ("charge", key, 7)]
    assert len(shop.done("lookup")) == 1


async def test_needs_approval_is_a_durable_mainspring_approval(
    fapp: ms.App, fake: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    shop = Shop()
    support = durable(
        fapp, shop.triage, name="support", openai_client=client, run_config=NO_TRACING
    )
    fake.script(
        [
            fake.tool_call("transfer_to_billing", {}),
            fake.tool_call("refund", {"order": 7}, id="call_refund"),
            fake.text("Refunded."),
        ]
    )
    handle = fapp.submit(support, "Refund order 7")
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "waiting"
    [request] = fapp.requests(handle.run_id)
    assert request.id == "approval:call_refund"
    assert request.preview == {"tool": "refund", "arguments": {"order": 7}}
    assert shop.done("refund") == []
    fapp.answer(handle.run_id, request.id, decision="approve", by="ana")
    await drain(fapp)
    assert await handle.result() == "Refunded."
    assert len(shop.done("refund")) == 1
    assert len(fake.requests) == 3  # the replay after the wait sent nothing again


async def test_a_rejection_reaches_the_model_and_the_tool_never_runs(
    fapp: ms.App, fake: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    shop = Shop()
    support = durable(
        fapp, shop.triage, name="support", openai_client=client, run_config=NO_TRACING
    )
    fake.script(
        [
            fake.tool_call("transfer_to_billing", {}),
            fake.tool_call("refund", {"order": 7}, id="call_refund"),
            fake.text("I could not refund it."),
        ]
    )
    handle = fapp.submit(support, "Refund order 7")
    await drain(fapp)
    fapp.answer(handle.run_id, "approval:call_refund", decision="reject", reason="not paid")
    await drain(fapp)
    assert await handle.result() == "I could not refund it."
    assert shop.done("refund") == []
    told = json.dumps(fake.requests[-1].body["input"])
    assert "Rejected by a human: not paid" in told


async def test_an_irreversible_tool_asks_and_runs_at_most_once(
    fapp: ms.App, fake: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    shop = Shop()
    support = durable(
        fapp,
        shop.billing,
        name="billing",
        openai_client=client,
        run_config=NO_TRACING,
        effects={"charge": "irreversible", "lookup": "read"},
    )
    fake.script(
        [
            fake.tool_call("charge", {"order": 7, "amount": 5}, id="call_charge"),
            fake.text("Charged."),
        ]
    )
    handle = fapp.submit(support, "Charge order 7")
    await drain(fapp)
    [request] = fapp.requests(handle.run_id)
    assert request.id == "approval:call_charge"
    # The reviewer edits the amount: the tool runs with the edited arguments.
    fapp.answer(handle.run_id, request.id, decision="edit", arguments={"order": 7, "amount": 4})
    await drain(fapp)
    assert await handle.result() == "Charged."
    assert len(shop.done("charge")) == 1
    [tool] = [s for s in fapp.observe.steps(handle.run_id) if s.role == "tool"]
    assert json.loads(tool.output or "null") == "charged 4 for 7"


def test_effect_declarations_are_checked() -> None:
    app = ms.App("sqlite:///:memory:")
    with pytest.raises(ms.ConfigError, match="effects\\['x'\\] must be one of"):
        durable(app, Agent(name="a"), effects={"x": "delete"})  # type: ignore[dict-item]
    with pytest.raises(ms.ConfigError, match="effect must be one of"):
        effect("delete")  # type: ignore[arg-type]
    with pytest.raises(ms.ConfigError, match=r"goes on an agents\.FunctionTool"):
        effect("read")(lambda: None)


async def test_streamed_text_reaches_the_live_token_stream(
    fapp: ms.App, fake: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    agent = Agent(name="poet", instructions="write", model=MODEL)
    poet = durable(fapp, agent, openai_client=client, run_config=NO_TRACING, stream=True)
    fake.script([fake.text("Roses are red, violets are blue.")])
    handle = fapp.submit(poet, "a poem")
    await drain(fapp)
    assert await handle.result() == "Roses are red, violets are blue."
    assert fake.requests[0].body["stream"] is True
    events = fapp.follow_tokens(handle.run_id).poll()
    texts = [e.text for e in events if e.text]
    assert "".join(texts) == "Roses are red, violets are blue."
    assert [e.end for e in events if e.end] == ["done"]


async def test_a_429_is_back_pressure_through_the_shared_limiter(
    db_url: str, fake: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    # The real clock: on PostgreSQL the limiter books on the database's clock.
    app = ms.App(
        db_url,
        poll_interval_s=0.01,
        rate_limits=[RateLimit(provider="openai", model=MODEL, rpm=600)],
    )
    agent = Agent(name="poet", instructions="write", model=MODEL)
    poet = durable(app, agent, openai_client=client, run_config=NO_TRACING)
    fake.script([fake.rate_limited(retry_after=1), fake.text("late but here")])
    handle = app.submit(poet, "a poem")
    for _ in range(100):
        await drain(app)
        if app.get_run(handle.run_id).status == "succeeded":
            break
        await asyncio.sleep(0.05)
    assert await handle.result() == "late but here"
    steps = app.observe.steps(handle.run_id)
    models = [s for s in steps if s.role == "model"]
    assert [s.status for s in models] == ["failed", "completed"]
    assert "RateLimited" in (models[0].error or "")
    assert all(s.attempt == 1 for s in models)  # the 429 spent no attempt
    assert [s.role for s in steps].count("rate") >= 2  # booked, and booked again
    assert len(fake.requests) == 2


async def test_budgets_hold_across_the_sdk_turns(
    fapp: ms.App, fake: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    shop = Shop()
    ask = durable(
        fapp,
        shop.triage,
        name="ask",
        openai_client=client,
        run_config=NO_TRACING,
        limits=Limits(max_steps=1),
    )
    stop = durable(
        fapp,
        shop.triage,
        name="stop",
        openai_client=client,
        run_config=NO_TRACING,
        limits=Limits(max_steps=1, on_exceeded="stop"),
    )
    fake.script([fake.tool_call("transfer_to_billing", {})] * 2 + [fake.text("ok")])
    stopped = fapp.submit(stop, "go")
    asked = fapp.submit(ask, "go")
    await drain(fapp)
    assert fapp.get_run(stopped.run_id).status == "failed"
    assert "max_steps reached: 1 of 1" in (fapp.get_run(stopped.run_id).error or "")
    [request] = fapp.requests(asked.run_id)
    assert request.id == "budget:max_steps"
    fapp.answer(asked.run_id, request.id, decision="edit", arguments={"limit": 5})
    await drain(fapp)
    assert await asked.result() == "ok"


class Verdict(BaseModel):
    order: int
    ok: bool


async def test_output_types_and_guardrails_keep_their_meaning(
    fapp: ms.App, fake: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    @input_guardrail
    async def no_swearing(ctx: Any, agent: Any, text: Any) -> GuardrailFunctionOutput:
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered="darn" in str(text))

    agent = Agent(
        name="judge",
        instructions="judge",
        model=MODEL,
        output_type=Verdict,
        input_guardrails=[no_swearing],
    )
    judge = durable(fapp, agent, openai_client=client, run_config=NO_TRACING)
    fake.script([fake.text('{"order": 7, "ok": true}')])
    good = fapp.submit(judge, "judge order 7")
    bad = fapp.submit(judge, "darn it")
    await drain(fapp)
    assert await good.result() == {"order": 7, "ok": True}
    failed = fapp.get_run(bad.run_id)
    assert failed.status == "failed" and "InputGuardrailTripwireTriggered" in (failed.error or "")


class Catalog(MCPServer):
    """A tiny in-process MCP server: one tool, ``price``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, Any] | None] = []

    @property
    def name(self) -> str:
        return "catalog"

    async def connect(self) -> None:
        pass

    async def cleanup(self) -> None:
        pass

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> list[Tool]:
        schema = {"type": "object", "properties": {"sku": {"type": "string"}}}
        return [Tool(name="price", description="Price of a SKU", inputSchema=schema)]

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None = None
    ) -> CallToolResult:
        self.calls.append(arguments)
        return CallToolResult(content=[TextContent(type="text", text="12 USD")])

    async def list_prompts(self) -> Any:
        raise NotImplementedError

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        raise NotImplementedError


async def test_mcp_tools_are_journaled_tool_steps(
    fapp: ms.App, clock: ms.FakeClock, fake: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    catalog = Catalog()
    agent = Agent(name="shopper", instructions="shop", model=MODEL, mcp_servers=[catalog])
    shopper = durable(fapp, agent, openai_client=client, run_config=NO_TRACING)
    fake.script([fake.tool_call("price", {"sku": "A1"}), fake.text("It costs 12 USD.")])
    handle = fapp.submit(shopper, "price of A1?")
    await drain(fapp)
    assert await handle.result() == "It costs 12 USD."
    assert catalog.calls == [{"sku": "A1"}]
    names = [(s.role, s.name) for s in fapp.observe.steps(handle.run_id)]
    assert ("tool", "tool:price") in names and ("step", "mcp:list:catalog") in names
    sent = [t["name"] for t in fake.requests[0].body["tools"]]
    assert sent == ["price"]


async def test_a_fork_replays_the_sdk_run_and_goes_on_live(
    fapp: ms.App, fake: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    shop = Shop()
    support = durable(
        fapp, shop.triage, name="support", openai_client=client, run_config=NO_TRACING
    )
    happy_path(fake)
    handle = fapp.submit(support, "Charge order 7")
    await drain(fapp)
    assert await handle.result() == "Charged order 7."
    # Keep everything up to the charge (seq 6); the last model call runs again live.
    fake.script([fake.text("Charged order 7, again.")])
    fork = fapp.fork(handle.run_id, from_step=6)
    await drain(fapp)
    assert await fork.result() == "Charged order 7, again."
    assert len(fake.requests) == 7  # one new call, nothing before it sent again
    assert len(shop.done("charge")) == 1


def test_a_missing_extra_names_the_pip_install() -> None:
    code = (
        "import sys; sys.modules['agents'] = None\n"
        "try:\n"
        "    import mainspring.integrations.openai_agents\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=os.getcwd()
    )
    assert "pip install 'mainspring[openai-agents]'" in out.stdout


def test_the_lab_runs_the_integrated_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_integration_openai_agents_processes import reply

    from mainspring.lab import LabProfile, run_workflow_lab

    monkeypatch.setenv("MAINSPRING_DATABASE_URL", f"sqlite:///{tmp_path / 'app.db'}")
    monkeypatch.setenv("MAINSPRING_TEST_LEDGER", str(tmp_path / "ledger.db"))
    with FakeOpenAIServer(fallback=reply) as server:
        monkeypatch.setenv("MAINSPRING_TEST_OPENAI_URL", server.base_url)
        import apps.openai_agents_app

        module = importlib.reload(apps.openai_agents_app)
        result = run_workflow_lab(
            module.support,
            LabProfile(model_error_rate=0.05, crash_rate=0.1),
            args=["desk 1: charge 3 orders"],
            policies=["mainspring"],
            trials=2,
            repeats=1,
            seed=3,
        )
    [cell] = result.cells
    assert (cell.successes, cell.trials, cell.duplicate_effects) == (2, 2, 0), result.failures
    assert cell.recoveries > 0 and cell.tokens > 0  # crashes were simulated and survived


async def test_a_copy_of_a_journaled_tool_is_journaled_once_under_its_own_name(
    fapp: ms.App, fake: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    shop = Shop()
    fake.script([fake.tool_call("lookup", {"order": 1}), fake.text("ok")])
    agent = Agent(name="a", instructions="look", tools=shop.auditor.tools, model=MODEL)
    looker = durable(fapp, agent, name="looker", openai_client=client, run_config=NO_TRACING)
    one = fapp.submit(looker, "look")
    await drain(fapp)  # wraps the auditor's lookup in place
    [lookup] = shop.auditor.tools
    copy = dataclasses.replace(lookup, name="find")  # the SDK copies tools too
    finder = durable(
        fapp,
        Agent(name="f", instructions="find", tools=[copy], model=MODEL),
        name="finder",
        openai_client=client,
        run_config=NO_TRACING,
    )
    fake.script([fake.tool_call("find", {"order": 2}), fake.text("found")])
    two = fapp.submit(finder, "find")
    await drain(fapp)
    assert (await one.result(), await two.result()) == ("ok", "found")
    assert [(s.role, s.name) for s in fapp.observe.steps(two.run_id) if s.role == "tool"] == [
        ("tool", "tool:find")
    ]
