"""Opt-in content capture on spans, in the conventions Phoenix (OpenInference) and
Langfuse (OpenTelemetry GenAI) read: a model call's messages and reply, a tool's
arguments and result, the run's task and answer; redacted and capped; nothing of it
when capture is off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import mainspring as ms
from mainspring.models import (
    AssistantMessage,
    ModelResponse,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from mainspring.observability import Redactor, export_trace
from mainspring.observability._content import MAX_MESSAGES, Capture
from mainspring.testing import ScriptedModel

SECRET = "sk-proj-" + "Q1w2E3r4T5y6U7i8O9p0ASDF"
CONTENT_KEYS = ("input.value", "output.value", "llm.input_messages", "gen_ai.input.messages",
                "gen_ai.output.messages", "gen_ai.tool.call", "gen_ai.system_instructions",
                "llm.output_messages")  # fmt: skip


def _memory() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def _agent_run(app: ms.App) -> str:
    @app.tool
    def login(user: str, password: str) -> dict[str, Any]:
        """Log in to the help desk."""
        return {"user": user, "session_token": SECRET, "ok": True}

    turns = [
        ScriptedModel.call("login", {"user": "ana", "password": SECRET}),
        ScriptedModel.call("finish", {"answer": "logged in"}),
    ]
    model = ScriptedModel(
        [
            ModelResponse(
                text="I will log in.",
                tool_calls=t.tool_calls,
                finish_reason="tool_calls",
                usage=Usage(input_tokens=50, output_tokens=7),
            )
            for t in turns
        ]
    )
    agent = app.agent("desk", model=model, instructions="You run the help desk.", tools=[login])
    await app.run(agent, f"Log in as ana, the password is {SECRET}")
    return app.list_runs()[0].id


async def test_model_tool_and_run_content_in_both_conventions(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'c.db'}", poll_interval_s=0.01)
    provider, exporter = _memory()
    app.observe.enable_tracing(provider, capture_content=True)
    run_id = await _agent_run(app)
    spans = exporter.get_finished_spans()
    assert SECRET not in str([dict(s.attributes or {}) for s in spans])  # redacted first

    chats = [s for s in spans if s.name == "chat scripted"]
    first, second = (dict(s.attributes or {}) for s in chats)
    assert first["openinference.span.kind"] == "LLM"
    assert first["llm.model_name"] == "scripted" and first["llm.provider"] == "scripted"
    assert first["gen_ai.system"] == first["gen_ai.provider.name"] == "scripted"
    assert first["llm.token_count.prompt"] == 50 and first["llm.token_count.total"] == 57
    # OpenInference: flattened, indexed messages; the system prompt first
    assert first["llm.input_messages.0.message.role"] == "system"
    assert "help desk" in first["llm.input_messages.0.message.content"]
    assert first["llm.input_messages.1.message.role"] == "user"
    assert "Log in as ana" in first["llm.input_messages.1.message.content"]
    assert "[REDACTED]" in first["llm.input_messages.1.message.content"]
    assert first["llm.output_messages.0.message.role"] == "assistant"
    assert first["llm.output_messages.0.message.content"] == "I will log in."
    call = "llm.output_messages.0.message.tool_calls.0.tool_call"
    assert first[f"{call}.function.name"] == "login"
    assert json.loads(first[f"{call}.function.arguments"])["password"] == "[REDACTED]"
    # GenAI: JSON messages with parts; system instructions apart
    system = json.loads(first["gen_ai.system_instructions"])
    assert system[0]["type"] == "text" and "help desk" in system[0]["content"]
    sent = json.loads(first["gen_ai.input.messages"])
    assert [m["role"] for m in sent] == ["user"]
    assert sent[0]["parts"][0]["type"] == "text"
    (out,) = json.loads(first["gen_ai.output.messages"])
    assert out["role"] == "assistant" and out["finish_reason"] == "tool_calls"
    tool_part = next(p for p in out["parts"] if p["type"] == "tool_call")
    assert tool_part["name"] == "login" and tool_part["arguments"]["password"] == "[REDACTED]"
    # the second call sent the tool's result back: a tool message answering the call
    back = json.loads(second["gen_ai.input.messages"])
    assert [m["role"] for m in back] == ["user", "assistant", "tool"]
    assert back[2]["parts"][0]["type"] == "tool_call_response"
    roles = [v for k, v in second.items() if k.endswith(".message.role")]
    assert roles[:4] == ["system", "user", "assistant", "tool"]

    (tool,) = [dict(s.attributes or {}) for s in spans if s.name == "execute_tool login"]
    assert tool["openinference.span.kind"] == "TOOL" and tool["tool.name"] == "login"
    assert json.loads(tool["gen_ai.tool.call.arguments"]) == {
        "user": "ana",
        "password": "[REDACTED]",
    }
    assert json.loads(tool["gen_ai.tool.call.result"])["session_token"] == "[REDACTED]"
    assert tool["input.mime_type"] == "application/json"

    (root,) = [dict(s.attributes or {}) for s in spans if s.name == "invoke_agent desk"]
    assert root["openinference.span.kind"] == "AGENT"
    assert root["session.id"] == root["gen_ai.conversation.id"] == run_id
    assert root["input.value"].startswith("Log in as ana, the password is [REDACTED]")
    assert root["output.value"] == "logged in"  # the answer, not the AgentResult

    # Back-filled from the journal: the same conventions from its redacted summaries.
    provider2, again = _memory()
    export_trace(app.observe.trace(run_id), tracer_provider=provider2, capture_content=True)
    back_spans = {s.name: dict(s.attributes or {}) for s in again.get_finished_spans()}
    assert "[REDACTED]" in back_spans["execute_tool login"]["gen_ai.tool.call.arguments"]
    assert back_spans["invoke_agent desk"]["output.value"] == "logged in"
    assert SECRET not in str(back_spans)
    app.close()


async def test_without_capture_spans_carry_no_content(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'n.db'}", poll_interval_s=0.01)
    provider, exporter = _memory()
    app.observe.enable_tracing(provider)
    run_id = await _agent_run(app)
    provider2, again = _memory()
    export_trace(app.observe.trace(run_id), tracer_provider=provider2)
    for s in [*exporter.get_finished_spans(), *again.get_finished_spans()]:
        attrs = dict(s.attributes or {})
        assert "openinference.span.kind" in attrs  # the conventions, without content
        leaked = [k for k in attrs if k.startswith(CONTENT_KEYS)]
        assert leaked == [], (s.name, leaked)
    app.close()


def test_a_long_conversation_keeps_its_system_prompt_and_last_messages() -> None:
    messages: list[Any] = [SystemMessage(content="be brief")]
    for i in range(30):
        messages.append(UserMessage(content=f"question {i} " + "x" * 50))
        calls = (ToolCall(id=f"c{i}", name="look", arguments=json.dumps({"n": i})),)
        messages.append(AssistantMessage(text=None, tool_calls=calls))
        messages.append(ToolResultMessage(tool_call_id=f"c{i}", name="look", content="{}"))
    capture = Capture(Redactor().redact_json, max_chars=20)
    attrs = capture.model(messages, None)
    kept = [k for k in attrs if k.endswith(".message.role")]
    assert len(kept) == 1 + MAX_MESSAGES
    assert attrs["llm.input_messages.0.message.content"] == "be brief"
    last = f"llm.input_messages.{MAX_MESSAGES}.message"
    assert attrs[f"{last}.role"] == "tool" and attrs[f"{last}.tool_call_id"] == "c29"
    assert len(json.loads(attrs["gen_ai.input.messages"])) == MAX_MESSAGES
    users = [k for k, v in attrs.items() if k.endswith(".message.role") and v == "user"]
    capped = attrs[users[0].replace(".role", ".content")]
    assert len(capped) == 20 and capped.endswith("…")
    assert "llm.output_messages.0.message.role" not in attrs  # no reply: a failed attempt
