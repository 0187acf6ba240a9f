"""Typed agent outputs (``output_type=``) and tool dependencies (``deps=``)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from typing import Any

import pytest
from _helpers import Crash, drain
from pydantic import BaseModel
from typing_extensions import TypedDict

import mainspring as ms
from mainspring.models import ToolResultMessage
from mainspring.testing import FakeClock, ScriptedModel
from mainspring.tools import OutputSchema

call = ScriptedModel.call


class Report(BaseModel):
    """A ticket's triage."""

    title: str
    severity: int
    tags: list[str] = []


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Pair(TypedDict):
    left: str
    right: int


def _errors_told(model: ScriptedModel, request: int) -> list[str]:
    return [
        m.content
        for m in model.requests[request].messages
        if isinstance(m, ToolResultMessage) and m.is_error
    ]


# -- typed outputs -----------------------------------------------------------------------


async def test_finish_takes_the_types_schema_and_the_result_is_typed(app: ms.App) -> None:
    model = ScriptedModel([call("finish", {"title": "Printer fire", "severity": 1})])
    agent = app.agent("triage", model=model, instructions="Triage.", output_type=Report)
    handle = app.submit(agent, "ticket 7")
    await drain(app)
    result = await handle.result()
    assert isinstance(result.output, Report)
    assert result.output == Report(title="Printer fire", severity=1)
    assert result.answer is result.output
    finish = next(t for t in model.requests[0].tools if t.name == "finish")
    assert finish.parameters["properties"].keys() == {"title", "severity", "tags"}
    assert finish.parameters["required"] == ["title", "severity"]
    assert "Report" in finish.description and "A ticket's triage." in finish.description
    # Stored as JSON: the record, the HTTP API and the CLI show the answer's fields.
    stored = json.loads(app.get_run(handle.run_id).output or "null")
    assert stored["answer"] == {"title": "Printer fire", "severity": 1, "tags": []}
    assert (await app.result(handle.run_id)).output == result.output


@pytest.mark.parametrize(
    ("output_type", "arguments", "expected"),
    [
        (list[str], {"answer": ["a", "b"]}, ["a", "b"]),
        (int, {"answer": "42"}, 42),
        (Point, {"x": 1, "y": 2}, Point(x=1, y=2)),
        (Pair, {"left": "l", "right": 3}, {"left": "l", "right": 3}),
        # the untyped finish's habit: the fields under "answer"
        (Report, {"answer": {"title": "t", "severity": 2}}, Report(title="t", severity=2)),
    ],
)
async def test_plain_types_dataclasses_and_typed_dicts(
    app: ms.App, output_type: Any, arguments: dict[str, Any], expected: Any
) -> None:
    model = ScriptedModel([call("finish", arguments)])
    agent = app.agent("typed", model=model, instructions="x", output_type=output_type)
    result = await app.run(agent, "t")
    assert result.output == expected
    assert type(result.output) is type(expected)


async def test_a_wrong_answer_is_repaired_naming_the_fields(app: ms.App) -> None:
    model = ScriptedModel(
        [
            call("finish", {"title": "Printer fire", "severity": "high", "tags": "hw"}),
            call("finish", {"title": "Printer fire", "severity": 1, "tags": ["hw"]}),
        ]
    )
    agent = app.agent("triage", model=model, instructions="x", output_type=Report)
    result = await app.run(agent, "ticket 7")
    assert result.output == Report(title="Printer fire", severity=1, tags=["hw"])
    assert result.state["repairs"] == 1
    [told] = _errors_told(model, 1)
    assert told.startswith("finish: the answer is not a valid Report: ")
    assert "argument 'severity' must be an integer (got 'high')" in told
    assert "argument 'tags' must be a list (JSON array) (got 'hw')" in told
    assert "title" not in told.splitlines()[0]  # only the wrong fields are named
    assert "Expected: finish(title: string, severity: integer" in told


async def test_a_text_answer_is_validated_too(app: ms.App) -> None:
    model = ScriptedModel(
        ['Done: {"title": "Printer fire"}', '```json\n{"title": "Fire", "severity": 2}\n```']
    )
    agent = app.agent("triage", model=model, instructions="x", output_type=Report)
    result = await app.run(agent, "t")
    assert result.output == Report(title="Fire", severity=2)
    note = model.requests[1].messages[-1].content  # type: ignore[union-attr]
    assert "argument 'severity' is required" in note


async def test_validators_see_the_typed_answer(app: ms.App) -> None:
    seen: list[Any] = []

    def severe_enough(answer: Report, state: Any) -> str | None:
        seen.append(answer)
        return "severity must be at most 3" if answer.severity > 3 else None

    model = ScriptedModel(
        [
            call("finish", {"title": "t", "severity": 9}),
            call("finish", {"title": "t", "severity": 3}),
        ]
    )
    agent = app.agent(
        "v", model=model, instructions="x", output_type=Report, validators=[severe_enough]
    )
    assert (await app.run(agent, "t")).output == Report(title="t", severity=3)
    assert [type(a) for a in seen] == [Report, Report]


async def test_the_repair_budget_ends_in_an_error_naming_type_and_fields(app: ms.App) -> None:
    model = ScriptedModel([call("finish", {"title": "t", "severity": "high"})] * 3)
    agent = app.agent("triage", model=model, instructions="x", output_type=Report, max_repairs=2)
    handle = app.submit(agent, "t")
    await drain(app)
    with pytest.raises(ms.RunFailed) as info:
        await handle.result()
    assert info.value.error["type"] == "mainspring._errors.ModelOutputError"
    message = info.value.error["message"]
    assert message.startswith(
        "agent 'triage': the model's final answer is not a valid Report after 3 turns in a row "
        "(max_repairs=2)"
    )
    assert "argument 'severity' must be an integer (got 'high')" in message
    assert app.get_run(handle.run_id).status == "failed"  # failed, kept, not lost
    assert len(app.observe.steps(handle.run_id)) == 3  # every answer is in the journal


async def test_the_typed_answer_survives_a_crash_and_a_new_app(db_url: str) -> None:
    clock = FakeClock()
    crashed = threading.Event()

    def build(model: ScriptedModel) -> tuple[ms.App, ms.Workflow[[str], Any]]:
        app = ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0)

        @app.tool(effect="write")
        def file_ticket(title: str) -> str:
            if not crashed.is_set():
                crashed.set()
                raise Crash  # the process dies mid-tool
            return "filed"

        agent = app.agent(
            "triage", model=model, instructions="x", tools=[file_ticket], output_type=Report
        )
        return app, agent

    script = [
        call("finish", {"title": "t", "severity": "high"}),  # repaired
        call("file_ticket", {"title": "t"}),
        call("finish", {"title": "t", "severity": 2, "tags": ["hw"]}),
    ]
    first_model = ScriptedModel(script, turn_from="history")
    first, agent = build(first_model)
    handle = first.submit(agent, "ticket 7")
    await drain(first)
    assert crashed.is_set() and first.get_run(handle.run_id).status == "running"
    first.close()

    clock.advance(first.lease_s + 1)
    second_model = ScriptedModel(script, turn_from="history")
    second, _ = build(second_model)
    await drain(second)
    result = await second.result(handle.run_id)
    assert isinstance(result.output, Report)
    assert result.output == Report(title="t", severity=2, tags=["hw"])
    assert result.state["repairs"] == 1  # the repaired turn replayed, not asked again
    assert len(second_model.requests) == 1
    second.close()

    # A third App, which runs nothing, reads it back as a Report too (rebuilt from JSON).
    third, _ = build(ScriptedModel([]))
    assert (await third.result(handle.run_id)).output == result.output
    third.close()


async def test_untyped_agents_keep_their_answer(app: ms.App) -> None:
    model = ScriptedModel([call("finish", {"answer": "replied"})])
    agent = app.agent("plain", model=model, instructions="x")
    result = await app.run(agent, "t")
    assert result.answer == result.output == "replied"


def test_an_output_type_without_a_schema_is_refused(app: ms.App) -> None:
    class Opaque:
        pass

    model = ScriptedModel([])
    with pytest.raises(ms.ConfigError, match=r"agent 'bad': output_type=.*Opaque.* no JSON schema"):
        app.agent("bad", model=model, instructions="x", output_type=Opaque)


def test_the_http_api_serves_the_typed_answer_as_json(tmp_path: Any) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mainspring.server import create_app

    app = ms.App(f"sqlite:///{tmp_path / 'api.db'}", poll_interval_s=0.01, inline_wait_s=0.0)
    model = ScriptedModel([call("finish", {"title": "Fire", "severity": 1})])
    agent = app.agent("triage", model=model, instructions="x", output_type=Report)
    run_id = app.submit(agent, "t").run_id
    asyncio.run(drain(app))
    key = app.admin.create_key("ops", ["admin"])[1]
    with TestClient(create_app(app, webhooks=False)) as client:
        got = client.get(f"/runs/{run_id}", headers={"Authorization": f"Bearer {key}"})
    assert got.status_code == 200, got.text
    assert got.json()["output"]["answer"] == {"title": "Fire", "severity": 1, "tags": []}
    app.close()


# -- deps ------------------------------------------------------------------------------------


class Client:
    """A stand-in API client holding a secret that must never reach the journal."""

    built = 0

    def __init__(self) -> None:
        type(self).built += 1
        self.token = "tok-SECRET-never-journaled"

    def lookup(self, ticket: int) -> str:
        return f"ticket {ticket}: printer on fire"


@pytest.fixture
def client_class() -> type[Client]:
    class Counted(Client):
        built = 0

    return Counted


async def test_deps_reach_tools_built_once_per_process_never_journaled(
    app: ms.App, client_class: type[Client]
) -> None:
    seen: list[tuple[str | None, int]] = []

    @app.tool
    def lookup(ticket: int, *, ctx: ms.ToolContext[Client]) -> str:
        seen.append((ctx.agent, id(ctx.deps)))
        return ctx.deps.lookup(ticket)

    @app.tool
    async def lookup_async(ticket: int, *, ctx: ms.ToolContext[Client]) -> str:
        seen.append((ctx.agent, id(ctx.deps)))
        return ctx.deps.lookup(ticket)

    def model() -> ScriptedModel:
        return ScriptedModel(
            [
                ScriptedModel.calls(("lookup", {"ticket": 7}), ("lookup_async", {"ticket": 8})),
                call("finish", {"answer": "ok"}),
            ],
            turn_from="history",  # two runs share each agent's model
        )

    agents = [
        app.agent(
            f"support{i}",
            model=model(),
            instructions="x",
            tools=[lookup, lookup_async],
            deps=client_class,
            deps_type=Client,
        )
        for i in range(2)
    ]
    assert client_class.built == 0  # built on first use, not at definition
    handles = [app.submit(agents[i % 2], f"task {i}") for i in range(4)]
    await drain(app, concurrency=4)
    for handle in handles:
        assert (await handle.result()).answer == "ok"
    assert client_class.built == 2  # one per agent in this process, shared by its runs
    assert len(seen) == 8 and len({d for _, d in seen}) == 2
    assert {a for a, _ in seen} == {"support0", "support1"}
    for handle in handles:
        outputs = [s.output or "" for s in app.observe.steps(handle.run_id)]
        assert "ticket 7: printer on fire" in outputs[1] + outputs[2]
        record = app.get_run(handle.run_id)
        journal = repr(app.observe.steps(handle.run_id)) + repr(record)  # every column of both
        assert "tok-SECRET" not in journal and "Counted" not in journal


async def test_deps_after_a_crash_are_built_again_in_the_new_process(
    db_url: str, client_class: type[Client]
) -> None:
    clock = FakeClock()
    crashed = threading.Event()
    tokens: list[str] = []

    def build() -> tuple[ms.App, ms.Workflow[[str], Any]]:
        app = ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0)

        @app.tool(effect="write")
        def file_ticket(ticket: int, *, ctx: ms.ToolContext[Client]) -> str:
            tokens.append(ctx.deps.token)
            if not crashed.is_set():
                crashed.set()
                raise Crash
            return "filed"

        model = ScriptedModel(
            [call("file_ticket", {"ticket": 7}), call("finish", {"answer": "ok"})],
            turn_from="history",
        )
        agent = app.agent(
            "support", model=model, instructions="x", tools=[file_ticket], deps=client_class
        )
        return app, agent

    first, agent = build()
    handle = first.submit(agent, "t")
    await drain(first)
    first.close()
    clock.advance(first.lease_s + 1)
    second, _ = build()
    await drain(second)
    assert (await second.result(handle.run_id)).answer == "ok"
    assert client_class.built == 2  # the crashed process's, then the new one's
    assert tokens == ["tok-SECRET-never-journaled"] * 2  # the retried attempt had deps
    second.close()


async def test_a_tool_asking_for_missing_deps_is_told_which_agent_and_tool(app: ms.App) -> None:
    @app.tool
    def lookup(ticket: int, *, ctx: ms.ToolContext) -> str:
        return str(ctx.deps)

    model = ScriptedModel([call("lookup", {"ticket": 7}), call("finish", {"answer": "gave up"})])
    agent = app.agent("nodeps", model=model, instructions="x", tools=[lookup])
    assert (await app.run(agent, "t")).answer == "gave up"
    [told] = _errors_told(model, 1)
    assert "tool 'lookup' asked for ctx.deps, but agent 'nodeps' has no deps" in told
    assert "deps=" in told


async def test_deps_of_the_wrong_type_and_bad_factories_are_named(app: ms.App) -> None:
    with pytest.raises(ms.ConfigError, match="agent 'a': deps must be a function"):
        app.agent("a", model=ScriptedModel([]), instructions="x", deps=Client())  # type: ignore[arg-type]
    with pytest.raises(ms.ConfigError, match=r"agent 'b': deps_type=.* needs deps="):
        app.agent("b", model=ScriptedModel([]), instructions="x", deps_type=Client)

    @app.tool
    def lookup(ticket: int, *, ctx: ms.ToolContext) -> str:
        return str(ctx.deps)

    model = ScriptedModel([call("lookup", {"ticket": 7}), call("finish", {"answer": "x"})])
    agent = app.agent(
        "c", model=model, instructions="x", tools=[lookup], deps=dict, deps_type=Client
    )
    await app.run(agent, "t")
    [told] = _errors_told(model, 1)
    assert "agent 'c': its deps factory built a dict, not the deps_type Client" in told


@pytest.mark.parametrize(
    ("output_type", "text", "expected"),
    [(str, "42", "42"), (int, "42", 42), (list[int], "[1, 2]", [1, 2]), (str, "plain", "plain")],
)
def test_a_text_answer_of_a_type_without_fields(output_type: Any, text: str, expected: Any) -> None:
    schema = OutputSchema.of(output_type, agent="a")
    assert schema.wrapped
    assert schema.from_text(text) == expected
    with pytest.raises(ms.ToolInputError, match="argument 'answer' is required"):
        schema.from_arguments('{"value": 1}')


async def test_a_failing_factory_builds_nothing_and_the_retry_builds_again(app: ms.App) -> None:
    attempts: list[int] = []

    def connect() -> dict[str, str]:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            raise ConnectionError("helpdesk unreachable")
        return {"status": "open"}

    @app.tool(retry=ms.RetryPolicy(max_attempts=2, initial_s=0.0, jitter=False))
    def status(ticket: int, *, ctx: ms.ToolContext[dict[str, str]]) -> str:
        return ctx.deps["status"]

    model = ScriptedModel([call("status", {"ticket": 7}), call("finish", {"answer": "open"})])
    agent = app.agent("s", model=model, instructions="x", tools=[status], deps=connect)
    handle = app.submit(agent, "t")
    await drain(app)
    assert (await handle.result()).answer == "open"
    assert attempts == [1, 2]
    tool_step = next(s for s in app.observe.steps(handle.run_id) if s.name == "tool:status")
    assert tool_step.output == '"open"' and tool_step.attempt == 2


async def test_a_tool_run_as_a_plain_step_has_no_deps(app: ms.App) -> None:
    @app.tool
    def lookup(ticket: int, *, ctx: ms.ToolContext) -> str:
        return str(ctx.deps)

    @app.workflow
    async def plain(ctx: ms.RunContext) -> str:
        return str(await lookup.run(ctx, {"ticket": 7}))

    handle = app.submit(plain)
    await drain(app)
    with pytest.raises(ms.RunFailed) as info:
        await handle.result()
    assert "tool 'lookup' asked for ctx.deps, but it was not called by an agent" in str(info.value)
