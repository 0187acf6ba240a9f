"""The operator's reading of metrics and spans: a 429 is back-pressure in both, never a
failed step; costs and totals sit where Phoenix and Langfuse read them; errors carry
their public names; content capture follows the standard GenAI variable."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from _helpers import drain
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.models import OpenAIModel, Usage
from mainspring.observability import capture_from_environment
from mainspring.observability._livespans import lost_window_s
from mainspring.observability._names import public_error_type
from mainspring.testing import FakeClock, FakeOpenAIServer, ScriptedModel

NOW = 1_767_225_600.0
MODEL = "openai:gpt-4.1-mini"


def _memory_provider() -> tuple[Any, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _values(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
    }


async def test_a_429_is_rate_limiting_in_metrics_and_spans_never_a_failed_step(
    tmp_path: Path,
) -> None:
    from opentelemetry.trace import StatusCode

    clock = FakeClock(NOW)
    provider, exporter = _memory_provider()
    with FakeOpenAIServer(rpm=1, tpm=1_000_000, period_s=60, clock=clock.now) as server:
        usage = Usage(input_tokens=1000, output_tokens=200)
        server.script([server.tool_call("finish", {"answer": "ok"}, usage=usage)] * 3)
        model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="sk-test")
        app = ms.App(
            f"sqlite:///{tmp_path / 'r.db'}",
            clock=clock,
            poll_interval_s=0.01,
            inline_wait_s=0.0,
            rate_limits=False,  # no limiter: the provider's own 429s are what is counted
        )
        app.observe.enable_tracing(provider)
        agent = app.agent("triage", model=model, instructions="x")
        ids = [app.submit(agent, f"q{i}").run_id for i in range(3)]
        for _ in range(20):
            await drain(app)
            if all(app.get_run(r).status == "succeeded" for r in ids):
                break
            clock.advance(61)
        refused = server.too_many_requests
        assert refused >= 2  # the provider did refuse
        app.telemetry.flush()
        values = _values(app.observe.metrics().render()[0])
        step = "mainspring_steps_total"
        assert values[(step, (("kind", "model"), ("status", "rate_limited")))] == refused
        assert values[(step, (("kind", "model"), ("status", "failed")))] == 0
        assert values[(step, (("kind", "model"), ("status", "completed")))] == 3
        tries = "mainspring_step_attempts_total"
        assert values[(tries, (("kind", "model"), ("outcome", "rate_limited")))] == refused
        assert values[(tries, (("kind", "model"), ("outcome", "error")))] == 0
        limited = ("mainspring_rate_limited_total", (("kind", "model"), ("model", MODEL)))
        assert values[limited] == refused
        # the store-wide gauge agrees: no failed model step in the store either
        gauge = "mainspring_store_steps"
        assert values[(gauge, (("kind", "model"), ("status", "rate_limited")))] == refused
        assert (gauge, (("kind", "model"), ("status", "failed"))) not in values
        spans = exporter.get_finished_spans()
        chats = [s for s in spans if s.name == "chat gpt-4.1-mini"]
        held = [s for s in chats if s.attributes["mainspring.step.status"] == "rate_limited"]
        assert len(held) == refused
        for s in held:
            assert s.status.status_code == StatusCode.UNSET  # neither OK nor an error
            assert "error.type" not in s.attributes
            assert [e.name for e in s.events] == ["rate_limited"]
            assert s.parent.span_id != 0 and not s.name.startswith("turn")
        assert not any(s.status.status_code == StatusCode.ERROR for s in spans)
        # Cost where Phoenix (llm.cost.*) and Langfuse (gen_ai.usage.cost,
        # cost_details) read it: $0.40/$1.60 per million tokens.
        (ok, *_) = [s for s in chats if s.attributes["mainspring.step.status"] == "completed"]
        assert ok.attributes["llm.cost.prompt"] == pytest.approx(1000 * 0.40 / 1e6)
        assert ok.attributes["llm.cost.completion"] == pytest.approx(200 * 1.60 / 1e6)
        assert ok.attributes["llm.cost.total"] == pytest.approx(0.00072)
        assert ok.attributes["gen_ai.usage.cost"] == pytest.approx(0.00072)
        details = json.loads(ok.attributes["langfuse.observation.cost_details"])
        assert details["total"] == pytest.approx(0.00072)
        # the run's totals on its root, read from the journal when it finished
        roots = [s for s in spans if s.name == "invoke_agent triage"]
        assert len(roots) == 3
        for root in roots:
            assert root.attributes["mainspring.run.cost_usd"] == pytest.approx(0.00072)
            assert root.attributes["mainspring.run.tokens_in"] == 1000
            assert root.attributes["mainspring.run.model_calls"] >= 1
            assert "llm.token_count.prompt" not in root.attributes  # Phoenix sums children
        assert sum(r.attributes["mainspring.run.rate_limited"] for r in roots) == refused
        app.close()
        await model.aclose()  # its HTTP client's connections to the server


async def test_failed_runs_carry_public_error_names_and_no_span_runs_backwards(
    tmp_path: Path,
) -> None:
    from opentelemetry.trace import StatusCode

    provider, exporter = _memory_provider()
    app = ms.App(
        f"sqlite:///{tmp_path / 'e.db'}",
        poll_interval_s=0.01,
        default_retry=ms.RetryPolicy.never(),
    )
    app.observe.enable_tracing(provider)

    @app.workflow
    async def kid(ctx: ms.RunContext) -> int:
        return await ctx.step(lambda: 1, name="one")

    @app.workflow
    async def broken(ctx: ms.RunContext) -> None:
        await ctx.child(kid)

        def card() -> None:
            raise ValueError("card declined")

        await ctx.step(card, name="charge")

    run_id = app.submit(broken).run_id
    await drain(app)
    assert app.get_run(run_id).status == "failed"
    app.telemetry.flush()
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "workflow broken"]
    assert root.status.status_code == StatusCode.ERROR
    assert root.attributes["error.type"] == "mainspring.StepFailed"  # not mainspring._errors.
    (event,) = [e for e in root.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "mainspring.StepFailed"
    (charge,) = [s for s in spans if s.name == "step charge"]
    assert charge.attributes["error.type"] == "ValueError"
    assert any(s.name == "step child:kid" for s in spans)
    assert all(s.end_time >= s.start_time for s in spans)  # child starts included
    app.close()


@pytest.mark.parametrize(
    ("qualified", "public"),
    [
        ("mainspring._errors.StepFailed", "mainspring.StepFailed"),
        ("mainspring.agent._call.SlotLapsed", "mainspring.agent.SlotLapsed"),
        ("builtins.ValueError", "ValueError"),
        ("ValueError", "ValueError"),
        ("billing.errors.CardDeclined", "billing.errors.CardDeclined"),
        (None, "Error"),
    ],
)
def test_public_error_type_names(qualified: str | None, public: str) -> None:
    assert public_error_type(qualified) == public


def test_every_error_of_the_tree_is_public_under_its_public_name() -> None:
    from mainspring import _errors

    for name in _errors.__all__:
        cls = getattr(_errors, name)
        public = public_error_type(f"{cls.__module__}.{cls.__qualname__}")
        assert public == f"mainspring.{name}" and getattr(ms, name) is cls


async def test_content_capture_follows_the_standard_genai_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    var = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
    assert capture_from_environment({var: "true"}) is True
    assert capture_from_environment({var: "SPAN_AND_EVENT"}) is True
    assert capture_from_environment({var: "false"}) is False
    assert capture_from_environment({}) is False
    with caplog.at_level(logging.WARNING, logger="mainspring.observability"):
        assert capture_from_environment({var: "perhaps"}) is False
    assert any(var in r.message and "'perhaps'" in r.message for r in caplog.records)

    def run_with(env: str | None, **kwargs: Any) -> dict[str, Any]:
        if env is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, env)
        provider, exporter = _memory_provider()
        app = ms.App(f"sqlite:///{tmp_path / f'c{len(list(tmp_path.iterdir()))}.db'}")
        model = ScriptedModel([ScriptedModel.call("finish", {"answer": "done"})])
        agent = app.agent("support", model=model, instructions="x")
        app.observe.enable_tracing(provider, **kwargs)
        return {"app": app, "agent": agent, "exporter": exporter}

    for env, kwargs, captured in (
        ("true", {}, True),
        (None, {}, False),
        ("true", {"capture_content": False}, False),  # code wins over the variable
        ("false", {"capture_content": True}, True),
    ):
        made = run_with(env, **kwargs)
        app = made["app"]
        await app.run(made["agent"], "my key is sk-proj-abcdefghijklmnop1234")
        app.telemetry.flush()
        (root,) = [
            s for s in made["exporter"].get_finished_spans() if s.name == "invoke_agent support"
        ]
        assert ("input.value" in root.attributes) is captured, (env, kwargs)
        if captured:  # redaction holds whoever turned capture on
            assert root.attributes["input.value"].endswith("[REDACTED]")
        app.close()


def test_the_worker_flag_refuses_content_without_tracing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    (tmp_path / "flagapp.py").write_text(f"import mainspring as ms\napp = ms.App({url!r})\n")
    sys.path.insert(0, str(tmp_path))
    try:
        result = CliRunner().invoke(
            cli, ["worker", "flagapp:app", "--no-otel", "--capture-content", "--until-idle"]
        )
    finally:
        sys.path.remove(str(tmp_path))
    assert result.exit_code == 2
    said = " ".join(result.output.replace("│", " ").split())  # rich wraps it in a box
    assert "--no-otel exports none" in said, result.output


def test_the_takeover_window_follows_the_batch_delay() -> None:
    assert lost_window_s({}) == 7.0  # 5 s batches by default, and 2 s to send them
    assert lost_window_s({"OTEL_BSP_SCHEDULE_DELAY": "500"}) == 2.5
    assert lost_window_s({"OTEL_BSP_SCHEDULE_DELAY": "soon"}) == 7.0


async def test_live_turns_hold_their_tool_calls_across_a_wait_and_another_process(
    tmp_path: Path,
) -> None:
    """Each tool span is under the turn of the model call that asked for it, exported
    live; a tool that runs after an approval, in another App (process), too: the
    replayed model call tells the turn (StepInfo.turn), not this process's memory."""
    from mainspring.observability._spans import span_id_of

    url = f"sqlite:///{tmp_path / 't.db'}"
    call = ScriptedModel.call
    script = [
        call("lookup", {"ticket": 7}),
        call("refund", {"cents": 900}, id="c1"),
        call("finish", {"answer": "done"}),
    ]
    provider, exporter = _memory_provider()

    def build(replies: list[Any]) -> tuple[ms.App, Any]:
        app = ms.App(url, poll_interval_s=0.01)
        app.observe.enable_tracing(provider)

        @app.tool
        def lookup(ticket: int) -> str:
            """Read a ticket."""
            return "printer on fire"

        @app.tool(effect="irreversible")
        def refund(cents: int) -> str:
            """Refund."""
            return f"refunded {cents}"

        agent = app.agent(
            "billing", model=ScriptedModel(replies), instructions="x", tools=[lookup, refund]
        )
        return app, agent

    first, agent = build(script)
    run_id = first.submit(agent, "ticket 7").run_id
    await drain(first)
    assert first.get_run(run_id).status == "waiting"  # the refund waits for a person
    first.answer(run_id, "approval:c1", decision="approve", by="ana")
    first.telemetry.flush()
    first.close()
    # another process resumes it (its model asked only what comes after the journal):
    # no memory of the turn but the journal's
    second, _ = build(script[2:])
    await drain(second)
    assert second.get_run(run_id).status == "succeeded"
    second.telemetry.flush()
    rows = second.observe.steps(run_id)
    models = [r.seq for r in rows if r.role == "model"]
    tools = {r.name: r.seq for r in rows if r.role == "tool"}
    spans = [s for s in exporter.get_finished_spans() if s.attributes.get("session.id") == run_id]
    by_name = {s.name: s for s in spans}
    for tool, turn_seq in (("lookup", models[0]), ("refund", models[1])):
        span = by_name[f"execute_tool {tool}"]
        assert span.parent.span_id == span_id_of(run_id, f"turn:0:{turn_seq}"), tool
        assert tools[f"tool:{tool}"] > turn_seq
    turns = sorted(s.name for s in spans if s.name.startswith("turn "))
    assert turns == [f"turn 0:{seq}" for seq in models]  # each turn exported, once
    chats = [s for s in spans if s.name == "chat scripted"]
    assert {s.parent.span_id for s in chats} == {
        span_id_of(run_id, f"turn:0:{seq}") for seq in models
    }
    second.close()
