"""Fault injection for the agent loop: what the user relies on when the model or a tool
misbehaves (docs/agents.md, "What happens when things go wrong").

Each test checks the run's outcome, what the model was told in its next request
(``ScriptedModel.requests[i].messages``) and what the journal shows (``app.observe.steps``).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from _helpers import drain

import mainspring as ms
from mainspring.limits import Price
from mainspring.models import (
    AssistantMessage,
    Message,
    ModelResponse,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from mainspring.testing import FaultProfile, FaultyModel, ScriptedModel

call = ScriptedModel.call
MODEL_STEP = "model:scripted:scripted"
FAST_RETRY = ms.RetryPolicy(max_attempts=5, initial_s=0.001, max_s=0.01)
TWO_QUICK_ATTEMPTS = ms.RetryPolicy(max_attempts=2, initial_s=0.001, max_s=0.001)
CORPUS_PATH = Path(__file__).parent / "data" / "malformed_outputs.json"


# -- fixtures and helpers ------------------------------------------------------------------


@pytest.fixture
def sqlite_app(tmp_path: Path) -> Iterator[ms.App]:
    """An App on SQLite only, for the many small runs that don't depend on the backend."""
    application = ms.App(
        f"sqlite:///{tmp_path / 'faults.db'}", inline_wait_s=0.5, poll_interval_s=0.01
    )
    yield application
    application.close()


def _lookup(app: ms.App) -> ms.Tool[Any, Any]:
    @app.tool
    def lookup(ticket: int, note: str = "", tags: list[str] | None = None) -> dict[str, Any]:
        """Read a ticket (echoes its arguments).

        Args:
            ticket: the ticket number.
            note: a note to attach.
            tags: labels to attach.
        """
        return {"ticket": ticket, "note": note, "tags": tags}

    return lookup


def _run_id(app: ms.App) -> str:
    (run,) = app.list_runs()
    return run.id


def _steps(app: ms.App, name: str | None = None) -> list[ms.StepRecord]:
    steps = app.observe.steps(_run_id(app))
    return [s for s in steps if name is None or s.name == name]


def _error(step: ms.StepRecord) -> dict[str, Any]:
    return json.loads(step.error or "{}")  # type: ignore[no-any-return]


def _results(messages: Sequence[Message]) -> list[ToolResultMessage]:
    return [m for m in messages if isinstance(m, ToolResultMessage)]


def _result_for(messages: Sequence[Message], call_id: str) -> ToolResultMessage:
    found = [m for m in _results(messages) if m.tool_call_id == call_id]
    assert len(found) == 1, (call_id, messages)
    return found[0]


def _notes(messages: Sequence[Message]) -> list[str]:
    """The runtime's notes to the model (user messages after the task/state message)."""
    return [m.content for m in messages[2:] if isinstance(m, UserMessage)]


def _verbatim_call_ids(messages: Sequence[Message]) -> list[str]:
    return [c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls]


def _state_block(messages: Sequence[Message]) -> str:
    context = messages[1]
    assert isinstance(context, UserMessage)
    return context.content


def _usage(step: ms.StepRecord) -> tuple[int, int]:
    usage = json.loads(step.output or "{}")["usage"]
    return usage["input_tokens"], usage["output_tokens"]


# -- 1. a corpus of malformed tool-call arguments ------------------------------------------


def _corpus() -> list[Any]:
    cases = json.loads(CORPUS_PATH.read_text(encoding="utf-8"))["cases"]
    params = []
    for case in cases:
        assert case["expect"] in ("accept", "error"), case
        assert ("args" in case) == (case["expect"] == "accept"), case
        params.append(pytest.param(case, id=case["id"]))
    return params


def test_corpus_covers_the_required_kinds() -> None:
    cases = json.loads(CORPUS_PATH.read_text(encoding="utf-8"))["cases"]
    ids = {c["id"] for c in cases}
    assert len(ids) == len(cases) >= 15
    assert {"accept", "error"} == {c["expect"] for c in cases}
    for required in (
        "truncated-object",
        "trailing-comma",
        "single-quotes",
        "array-of-objects",
        "null",
        "json-encoded-twice",
        "markdown-fence-with-prose",
        "empty-string",
        "huge-garbage",
        "string-for-integer",
        "missing-required",
        "extra-field",
        "unicode-values",
    ):
        assert required in ids


@pytest.mark.parametrize("case", _corpus())
async def test_malformed_arguments_never_crash_the_agent(
    sqlite_app: ms.App, case: dict[str, Any]
) -> None:
    app = sqlite_app
    raw = case["raw"] * case.get("repeat", 1)
    model = ScriptedModel(
        [
            call("lookup", raw),
            call("lookup", {"ticket": 8}),
            call("finish", {"answer": "done"}),
        ]
    )
    agent = app.agent("corpus", model=model, instructions="x", tools=[_lookup(app)])
    started = time.monotonic()
    result = await app.run(agent, "Read ticket 7")
    assert time.monotonic() - started < 5  # hostile input stays cheap to reject

    assert (result.status, result.answer, result.turns) == ("done", "done", 3)
    told = _result_for(model.requests[1].messages, "call_0_0")
    tool_steps = _steps(app, "tool:lookup")
    if case["expect"] == "accept":
        assert not told.is_error, told.content
        assert json.loads(told.content) == case["args"]
        assert result.state["repairs"] == 0
        assert [json.loads(s.output or "null") for s in tool_steps] == [
            case["args"],
            {"ticket": 8, "note": "", "tags": None},
        ]
    else:
        assert told.is_error
        for needle in case["mentions"]:
            assert needle in told.content, (needle, told.content[:500])
        assert "Expected: lookup(ticket: integer" in told.content  # how to call it right
        assert len(told.content) < 2000  # the input is quoted, not echoed in full
        assert result.state["repairs"] == 1
        # The tool never ran on the bad arguments: only the repaired call is journaled.
        assert [json.loads(s.output or "null") for s in tool_steps] == [
            {"ticket": 8, "note": "", "tags": None}
        ]
    # The repaired (or next) call succeeded and the model was told so.
    assert not _result_for(model.requests[2].messages, "call_1_0").is_error
    assert all(s.status == "completed" for s in _steps(app))


@pytest.mark.parametrize(
    "bad_turn",
    [
        pytest.param(call("finish", '{"answer": ' + "[" * 5000), id="finish-arguments"),
        pytest.param(call("update_state", '{"facts": ' + "[" * 5000), id="update-state"),
        pytest.param(
            ModelResponse(
                text='{"tool": "lookup", "arguments": ' + "[" * 5000 + "}",
                finish_reason="length",
            ),
            id="text-reply",
        ),
    ],
)
async def test_deeply_nested_json_elsewhere_is_repaired(
    sqlite_app: ms.App, bad_turn: ModelResponse
) -> None:
    """A degenerate model repeating ``[`` until its token limit must not kill the run."""
    app = sqlite_app
    model = ScriptedModel([bad_turn, call("finish", {"answer": "ok"})])
    agent = app.agent("deep", model=model, instructions="x", tools=[_lookup(app)])
    result = await app.run(agent, "t")
    assert (result.status, result.answer, result.state["repairs"]) == ("done", "ok", 1)


async def test_lone_surrogate_in_the_answer_does_not_fail_a_finished_run(
    sqlite_app: ms.App,
) -> None:
    app = sqlite_app
    model = ScriptedModel(
        [call("finish", '{"answer": "all done \\ud83d"}'), call("finish", {"answer": "ok"})]
    )
    agent = app.agent("surrogate", model=model, instructions="x", tools=[_lookup(app)])
    result = await app.run(agent, "t")
    assert result.status == "done"


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(json.dumps(json.dumps({"answer": "42"})), id="encoded-twice"),
        pytest.param('Done!\n```json\n{"answer": "42"}\n```', id="fence-with-prose"),
    ],
)
async def test_finish_arguments_are_parsed_as_tolerantly_as_tools(
    sqlite_app: ms.App, raw: str
) -> None:
    app = sqlite_app
    model = ScriptedModel([call("finish", raw), call("finish", {"answer": "42"})])
    agent = app.agent("tolerant", model=model, instructions="x", tools=[_lookup(app)])
    result = await app.run(agent, "t")
    assert (result.answer, result.turns, result.state["repairs"]) == ("42", 1, 0)


@pytest.mark.parametrize(
    ("update", "bad_field"),
    [
        pytest.param(
            {"plan": [{"text": "read", "status": "bogus"}]},
            "status",
            id="unknown-plan-status",
        ),
        pytest.param(
            {"facts": "the printer is on fire"},
            "facts",
            id="string-for-facts",
        ),
        pytest.param({"plan": [{"status": "todo"}]}, "text", id="plan-item-without-text"),
    ],
)
async def test_invalid_update_state_is_handed_back(
    sqlite_app: ms.App, update: dict[str, Any], bad_field: str
) -> None:
    app = sqlite_app
    model = ScriptedModel([call("update_state", update), call("finish", {"answer": "ok"})])
    agent = app.agent("state", model=model, instructions="x", tools=[_lookup(app)])
    result = await app.run(agent, "t")
    assert (result.status, result.state["repairs"]) == ("done", 1)
    assert (result.state["plan"], result.state["facts"]) == ([], [])
    told = _result_for(model.requests[1].messages, "call_0_0")
    assert told.is_error
    assert bad_field in told.content


# -- 2. text replies ------------------------------------------------------------------------


async def test_fenced_json_action_with_prose_is_taken(app: ms.App) -> None:
    model = ScriptedModel(
        [
            "I'll check the ticket first.\n```json\n"
            '{"tool": "lookup", "arguments": {"ticket": 3, "tags": ["printer"]}}\n'
            "```\nThen I will reply.",
            call("finish", {"answer": "checked"}),
        ]
    )
    agent = app.agent("fenced", model=model, instructions="x", tools=[_lookup(app)])
    result = await app.run(agent, "t")
    assert (result.status, result.tool_calls, result.state["repairs"]) == ("done", 1, 0)
    after = model.requests[1].messages
    assistant = after[2]
    assert isinstance(assistant, AssistantMessage)
    (parsed,) = assistant.tool_calls  # the text's action is shown as a tool call
    assert (parsed.name, json.loads(parsed.arguments)) == (
        "lookup",
        {"ticket": 3, "tags": ["printer"]},
    )
    told = _result_for(after, parsed.id)
    assert json.loads(told.content) == {"ticket": 3, "note": "", "tags": ["printer"]}
    assert _notes(after) == []
    assert [s.name for s in _steps(app)] == [MODEL_STEP, "tool:lookup", MODEL_STEP]


@pytest.mark.parametrize(
    ("reply", "note"),
    [
        pytest.param(
            ModelResponse(text="I'm sorry, I can't help with that.", finish_reason="refusal"),
            "You refused. Call a tool, or call finish with the answer.",
            id="refusal",
        ),
        pytest.param(
            ModelResponse(text=None, finish_reason="stop"),
            "Your reply was empty. Call a tool, or call finish with the answer.",
            id="empty",
        ),
        pytest.param(
            ModelResponse(text="", finish_reason="stop"),
            "Your reply was empty. Call a tool, or call finish with the answer.",
            id="empty-string",
        ),
        pytest.param(
            ModelResponse(
                text='Let me look.\n```json\n{"tool": "lookup", "arguments": {"tick',
                finish_reason="length",
            ),
            "Your reply was cut off at the token limit. Call a tool, or call finish with "
            "the answer.",
            id="cut-at-token-limit",
        ),
        pytest.param(
            ModelResponse(text="The answer is", finish_reason="length"),
            "Your reply was cut off at the token limit. Call a tool, or call finish with "
            "the answer.",
            id="prose-cut-at-token-limit",
        ),
        pytest.param(
            ModelResponse(text="[removed]", finish_reason="content_filter"),
            "Your reply was filtered. Call a tool, or call finish with the answer.",
            id="content-filter",
        ),
    ],
)
async def test_unusable_text_reply_gets_a_repair_note(
    sqlite_app: ms.App, reply: ModelResponse, note: str
) -> None:
    app = sqlite_app
    model = ScriptedModel([reply, call("finish", {"answer": "ok"})])
    agent = app.agent("text", model=model, instructions="x", tools=[_lookup(app)])
    result = await app.run(agent, "t")
    assert (result.status, result.answer, result.turns) == ("done", "ok", 2)
    assert result.state["repairs"] == 1
    assert _notes(model.requests[1].messages) == [note]
    assert [s.name for s in _steps(app)] == [MODEL_STEP, MODEL_STEP]


async def test_repeated_unusable_replies_fail_after_max_repairs(sqlite_app: ms.App) -> None:
    app = sqlite_app
    refusal = ModelResponse(text="No.", finish_reason="refusal")
    model = ScriptedModel([ModelResponse(), refusal, ModelResponse(), refusal])
    agent = app.agent("stubborn", model=model, instructions="x", max_repairs=3)
    with pytest.raises(ms.RunFailed) as info:
        await app.run(agent, "t")
    assert info.value.error["type"] == "mainspring._errors.ModelOutputError"
    assert "4 turns in a row without a usable action" in info.value.error["message"]
    assert len(model.requests) == 4


async def test_the_final_error_quotes_the_last_repair_and_doctor_names_it(
    sqlite_app: ms.App,
) -> None:
    app = sqlite_app
    bad = call("lookup", {"ticket": "seven"})  # never a number, however often repaired
    model = ScriptedModel([bad, bad, bad])
    agent = app.agent("garbled", model=model, instructions="x", tools=[_lookup(app)], max_repairs=2)
    with pytest.raises(ms.RunFailed) as info:
        await app.run(agent, "t")
    message = info.value.error["message"]
    assert "the model could not produce a valid call" in message
    assert "last error: None" not in message
    # The repair the model was given last, and the call it was about.
    assert 'about the call lookup({"ticket": "seven"})' in message
    assert "ticket" in message.split("the last repair asked", 1)[1]
    diagnosis = app.observe.diagnose(_run_id(app))
    assert diagnosis.findings[0].kind == "invalid_calls"
    assert diagnosis.summary.startswith("the model could not produce a valid call")
    assert 'lookup({"ticket": "seven"})' in diagnosis.findings[0].evidence[0]


async def test_whitespace_only_reply_is_empty_not_an_answer(sqlite_app: ms.App) -> None:
    app = sqlite_app
    model = ScriptedModel([ModelResponse(text="  \n\t "), call("finish", {"answer": "ok"})])
    agent = app.agent("blank", model=model, instructions="x", tools=[_lookup(app)])
    result = await app.run(agent, "t")
    assert result.answer == "ok"
    assert _notes(model.requests[1].messages) == [
        "Your reply was empty. Call a tool, or call finish with the answer."
    ]


async def test_text_answer_holding_json_data_is_not_a_tool_call(sqlite_app: ms.App) -> None:
    app = sqlite_app
    answer = (
        "Here is the customer record:\n```json\n"
        '{"name": "Ana", "email": "ana@example.com", "tier": "gold"}\n```'
    )
    model = ScriptedModel([answer, call("finish", {"answer": answer})])
    agent = app.agent("data", model=model, instructions="x", tools=[_lookup(app)])
    result = await app.run(agent, "Find Ana's record")
    assert (result.status, result.answer) == ("done", answer)


# -- 3. tools that misbehave ----------------------------------------------------------------


async def test_tool_that_raises_is_an_error_result_and_the_run_goes_on(app: ms.App) -> None:
    attempts: list[int] = []

    @app.tool(retry=TWO_QUICK_ATTEMPTS)
    def explode(ticket: int, *, ctx: ms.ToolContext) -> str:
        attempts.append(ctx.attempt)
        raise ValueError(f"no ticket {ticket}")

    model = ScriptedModel(
        [
            call("explode", {"ticket": 42}),
            call("lookup", {"ticket": 7}),
            call("finish", {"answer": "worked around it"}),
        ]
    )
    agent = app.agent("raise", model=model, instructions="x", tools=[explode, _lookup(app)])
    result = await app.run(agent, "t")
    assert (result.status, result.answer) == ("done", "worked around it")
    assert attempts == [1, 2]  # retried by its policy, then handed to the model
    told = _result_for(model.requests[1].messages, "call_0_0")
    assert (told.is_error, told.content) == (True, "ValueError: no ticket 42")
    assert result.state["last_error"] == "explode: ValueError: no ticket 42"
    assert "Last error: explode: ValueError: no ticket 42" in _state_block(
        model.requests[1].messages
    )
    assert result.state["repairs"] == 0  # a tool failure is not the model's mistake
    (step,) = _steps(app, "tool:explode")
    assert (step.status, step.attempt) == ("failed", 2)
    assert _error(step)["type"] == "builtins.ValueError"
    assert _error(step)["message"] == "no ticket 42"


async def test_hung_tool_times_out_and_the_run_goes_on(sqlite_app: ms.App) -> None:
    app = sqlite_app
    release = threading.Event()
    entered: list[int] = []

    @app.tool(timeout_s=0.05, retry=TWO_QUICK_ATTEMPTS)
    def hang(ticket: int, *, ctx: ms.ToolContext) -> str:
        entered.append(ctx.attempt)
        release.wait(10)  # a sync tool blocked on I/O that never answers
        return "too late"

    model = ScriptedModel(
        [call("hang", {"ticket": 1}), call("finish", {"answer": "gave up on it"})]
    )
    agent = app.agent("hung", model=model, instructions="x", tools=[hang])
    started = time.monotonic()
    try:
        result = await app.run(agent, "t")
    finally:
        release.set()
    assert time.monotonic() - started < 3  # the hung tool did not hang the run
    assert (result.status, result.answer) == ("done", "gave up on it")
    assert entered == [1, 2]
    told = _result_for(model.requests[1].messages, "call_0_0")
    assert told.is_error
    assert told.content.startswith("StepTimeout: the tool ran past its time limit")
    assert "0.05s" in told.content
    assert result.state["last_error"].startswith("hang: StepTimeout")
    (step,) = _steps(app, "tool:hang")
    assert (step.status, step.attempt) == ("failed", 2)
    assert _error(step)["type"] == "mainspring._errors.StepTimeout"


async def test_async_tool_that_hangs_is_cancelled_at_its_timeout(sqlite_app: ms.App) -> None:
    app = sqlite_app
    cancelled: list[bool] = []

    @app.tool(timeout_s=0.05, retry=ms.RetryPolicy.never())
    async def wait_forever(ticket: int) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    model = ScriptedModel([call("wait_forever", {"ticket": 1}), call("finish", {"answer": "ok"})])
    agent = app.agent("async-hung", model=model, instructions="x", tools=[wait_forever])
    result = await app.run(agent, "t")
    assert result.status == "done"
    assert cancelled == [True]
    assert _result_for(model.requests[1].messages, "call_0_0").content.startswith("StepTimeout")


async def test_huge_result_is_truncated_for_the_model_but_journaled_in_full(app: ms.App) -> None:
    size = 10_000_000

    @app.tool
    def dump_logs(service: str) -> str:
        return "log line\n" * (size // 9) + "x" * (size % 9)

    model = ScriptedModel(
        [
            call("dump_logs", {"service": "printer"}),
            call("lookup", {"ticket": 1}),
            call("finish", {"answer": "read the logs"}),
        ]
    )
    agent = app.agent("huge", model=model, instructions="x", tools=[dump_logs, _lookup(app)])
    result = await app.run(agent, "t")
    assert result.status == "done"
    told = _result_for(model.requests[1].messages, "call_0_0")
    assert not told.is_error
    assert len(told.content) <= 4000  # the tool's max_result_chars
    assert told.content.startswith("log line\nlog line\n")
    marker = re.search(r"…\[truncated ([\d,]+) of 10,000,000 chars\]$", told.content)
    assert marker is not None, told.content[-200:]
    assert int(marker.group(1).replace(",", "")) == size - (len(told.content) - len(marker[0]))
    for request in model.requests[1:]:  # no request ever carried the 10 MB
        assert sum(len(getattr(m, "content", "") or "") for m in request.messages) < 20_000
    (step,) = _steps(app, "tool:dump_logs")
    full = json.loads(step.output or "null")
    assert len(full) == size
    assert full.endswith("x" * (size % 9))


async def test_output_validator_failure_is_an_error_result(sqlite_app: ms.App) -> None:
    app = sqlite_app
    calls: list[str] = []

    def non_negative(count: int) -> str | None:
        return None if count >= 0 else "a row count cannot be negative"

    @app.tool(validators=[non_negative])
    def count_rows(table: str) -> int:
        calls.append(table)
        return -1 if table == "tickets" else 12

    model = ScriptedModel(
        [
            call("count_rows", {"table": "tickets"}),
            call("count_rows", {"table": "users"}),
            call("finish", {"answer": "12 users"}),
        ]
    )
    agent = app.agent("validated", model=model, instructions="x", tools=[count_rows])
    result = await app.run(agent, "t")
    assert (result.status, result.answer) == ("done", "12 users")
    assert calls == ["tickets", "users"]  # a failed validator is not retried
    told = _result_for(model.requests[1].messages, "call_0_0")
    assert told.is_error
    assert told.content == (
        "ValidationFailed: count_rows: result failed validator 'non_negative': "
        "a row count cannot be negative"
    )
    assert result.state["last_error"] == told.content  # the tool named once
    assert _result_for(model.requests[2].messages, "call_1_0").content == "12"
    first, second = _steps(app, "tool:count_rows")
    assert (first.status, first.attempt, _error(first)["type"]) == (
        "failed",
        1,
        "mainspring._errors.ValidationFailed",
    )
    assert (second.status, second.output) == ("completed", "12")


# -- 4. parallel tool calls -------------------------------------------------------------------


async def test_parallel_calls_all_run_and_come_back_in_call_order(app: ms.App) -> None:
    running = 0
    peak = 0

    @app.tool
    async def slow_echo(n: int, delay_s: float) -> dict[str, int]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(delay_s)
        running -= 1
        return {"n": n}

    @app.tool(retry=ms.RetryPolicy.never())
    def broken(n: int) -> int:
        raise RuntimeError(f"broken {n}")

    model = ScriptedModel(
        [
            ScriptedModel.calls(
                ("slow_echo", {"n": 1, "delay_s": 0.2}),  # finishes last
                ("broken", {"n": 2}),
                ("slow_echo", {"n": 3, "delay_s": 0.0}),  # finishes first
                ("lookup", {"ticket": "three"}),  # invalid: never runs
                ("slow_echo", {"n": 5, "delay_s": 0.1}),
            ),
            call("finish", {"answer": "all back"}),
        ]
    )
    agent = app.agent(
        "parallel", model=model, instructions="x", tools=[slow_echo, broken, _lookup(app)]
    )
    started = time.monotonic()
    result = await app.run(agent, "t")
    assert time.monotonic() - started < 2.0
    assert (result.status, result.tool_calls) == ("done", 4)
    assert peak == 3  # the three slow_echo calls overlapped

    told = _results(model.requests[1].messages)
    assert [r.tool_call_id for r in told] == [f"call_0_{i}" for i in range(5)]
    assert [r.is_error for r in told] == [False, True, False, True, False]
    assert json.loads(told[0].content) == {"n": 1}
    assert told[1].content == "RuntimeError: broken 2"
    assert json.loads(told[2].content) == {"n": 3}
    assert "'ticket' must be an integer" in told[3].content
    assert json.loads(told[4].content) == {"n": 5}

    steps = _steps(app)
    assert [s.name for s in steps] == [
        MODEL_STEP,
        "tool:slow_echo",
        "tool:broken",
        "tool:slow_echo",
        "tool:slow_echo",
        MODEL_STEP,
    ]
    assert [s.seq for s in steps] == sorted({s.seq for s in steps})  # one step each
    assert [s.output for s in steps[1:5]] == ['{"n":1}', None, '{"n":3}', '{"n":5}']
    assert steps[2].status == "failed"


async def test_calls_sharing_an_id_each_get_their_own_result(sqlite_app: ms.App) -> None:
    app = sqlite_app
    twins = ModelResponse(
        tool_calls=(
            ToolCall(id="call_0", name="lookup", arguments='{"ticket": 1}'),
            ToolCall(id="call_0", name="lookup", arguments='{"ticket": 2}'),
        )
    )
    model = ScriptedModel([twins, call("finish", {"answer": "ok"})])
    agent = app.agent("twins", model=model, instructions="x", tools=[_lookup(app)])
    await app.run(agent, "t")
    told = _results(model.requests[1].messages)
    assert [json.loads(r.content)["ticket"] for r in told] == [1, 2]


# -- 5. model-level faults ----------------------------------------------------------------------


def _fault_plan(model: FaultyModel, good_calls: int) -> list[list[str | None]]:
    """The faults each model step meets, by seed: faults until a call passes."""
    plan: list[list[str | None]] = []
    index = 0
    for _ in range(good_calls):
        step: list[str | None] = []
        while (fault := model.fault_at(index)) is not None:
            step.append(fault)
            index += 1
        step.append(None)
        index += 1
        plan.append(step)
    return plan


async def test_transient_errors_and_rate_limits_are_retried(sqlite_app: ms.App) -> None:
    app = sqlite_app
    inner = ScriptedModel(
        [
            call("lookup", {"ticket": 1}),
            call("lookup", {"ticket": 2}),
            call("lookup", {"ticket": 3}),
            call("finish", {"answer": "three read"}),
        ]
    )
    profile = FaultProfile(transient_rate=0.3, rate_limit_rate=0.3, retry_after_s=0.001)
    model = FaultyModel(inner, profile, seed=1)
    plan = _fault_plan(model, 4)
    # The seed gives both kinds, and never more failures in a row than the policy allows.
    assert {"transient", "rate_limit"} <= {f for step in plan for f in step}
    assert max(len(step) for step in plan) <= FAST_RETRY.max_attempts

    agent = app.agent(
        "flaky", model=model, instructions="x", tools=[_lookup(app)], model_retry=FAST_RETRY
    )
    result = await app.run(agent, "t")
    assert (result.status, result.answer, result.turns) == ("done", "three read", 4)
    assert result.state["repairs"] == 0
    # A transient error spends an attempt of the model step; a 429 spends none: it
    # ends the step (failed, RateLimited), and the call waits and sends in a new one.
    expected: list[tuple[str, int]] = []
    for step in plan:
        attempt = 1
        for fault in step:
            if fault == "rate_limit":
                expected.append(("failed", attempt))
                attempt = 1
            elif fault is not None:
                attempt += 1
            else:
                expected.append(("completed", attempt))
    model_steps = _steps(app, MODEL_STEP)
    assert [(s.status, s.attempt) for s in model_steps] == expected
    assert any(s.attempt > 1 for s in model_steps)
    assert sum(model.injected.values()) == sum(len(step) - 1 for step in plan)
    # Each request the inner model saw is the one a clean run would have seen.
    assert len(inner.requests) == 4
    assert [len(_results(r.messages)) for r in inner.requests] == [0, 1, 2, 3]


async def test_rate_limit_retry_after_is_honoured(sqlite_app: ms.App) -> None:
    app = sqlite_app
    model = ScriptedModel(
        [ms.RateLimited("429: slow down", retry_after=0.3), call("finish", {"answer": "ok"})]
    )
    agent = app.agent("polite", model=model, instructions="x", model_retry=FAST_RETRY)
    started = time.monotonic()
    result = await app.run(agent, "t")
    assert time.monotonic() - started >= 0.3  # above the policy's max_s of 0.01
    assert result.status == "done"
    refused, sent = _steps(app, MODEL_STEP)  # the 429 spent no attempt: a new step
    assert (refused.status, refused.attempt, sent.status, sent.attempt) == (
        "failed",
        1,
        "completed",
        1,
    )
    assert _error(refused)["type"] == "mainspring._errors.RateLimited"
    (wait,) = _steps(app, "rate:wait:scripted:scripted")  # the wait it asked for, journaled
    assert wait.status == "completed"


async def test_transient_errors_past_the_retry_policy_fail_the_run(sqlite_app: ms.App) -> None:
    app = sqlite_app
    model = ScriptedModel([ms.TransientError(f"HTTP 503 #{i}") for i in range(5)])
    agent = app.agent("down", model=model, instructions="x", model_retry=FAST_RETRY)
    with pytest.raises(ms.RunFailed) as info:
        await app.run(agent, "t")
    assert info.value.error["type"] == "mainspring._errors.StepFailed"
    assert "after 5 attempt(s): TransientError: HTTP 503 #4" in info.value.error["message"]
    (step,) = _steps(app, MODEL_STEP)
    assert (step.status, step.attempt) == ("failed", 5)


async def test_faulty_replies_are_repaired_and_the_run_completes(sqlite_app: ms.App) -> None:
    app = sqlite_app
    inner = ScriptedModel(
        [
            call("lookup", {"ticket": 1}),
            call("update_state", {"facts": ["ticket 1 read"]}),
            call("lookup", {"ticket": 2}),
            call("finish", {"answer": "both read"}),
        ]
    )
    profile = FaultProfile(malformed_rate=0.25, refusal_rate=0.15, empty_rate=0.15)
    model = FaultyModel(inner, profile, seed=10)
    plan = _fault_plan(model, 4)
    faults = [f for step in plan for f in step]
    assert {"malformed", "refusal", "empty"} <= set(faults)  # the seed hits every kind
    assert max(len(step) - 1 for step in plan) <= 2  # faults in a row: within max_repairs

    agent = app.agent("chaos", model=model, instructions="x", tools=[_lookup(app)])
    result = await app.run(agent, "t")
    assert (result.status, result.answer) == ("done", "both read")
    assert model.history == faults
    assert result.state["facts"] == ["ticket 1 read"]
    assert result.state["repairs"] == len(faults) - 4
    assert len(_steps(app, MODEL_STEP)) == len(faults)  # each reply is a journaled step
    assert len(_steps(app, "tool:lookup")) == 2  # no malformed call ever ran a tool

    # The request after each faulty reply tells the model what was wrong. Requests that
    # met no fault went to the inner model, which recorded them.
    seen_by_inner = iter(inner.requests)
    requests: list[Sequence[Message] | None] = [
        None if f is not None else next(seen_by_inner).messages for f in faults
    ]
    for index, fault in enumerate(faults):
        if fault is None:
            continue
        after = next(m for m in requests[index + 1 :] if m is not None)
        if fault == "refusal":
            assert any(n.startswith("You refused.") for n in _notes(after)), after
        elif fault == "empty":
            assert any(n.startswith("Your reply was empty.") for n in _notes(after)), after
        else:
            told = _result_for(after, f"faulty_{index}")
            assert told.is_error
            assert told.content  # says what was wrong


async def test_context_overflow_once_compacts_and_the_run_goes_on(app: ms.App) -> None:
    model = ScriptedModel(
        [
            call("lookup", {"ticket": 1}),
            call("lookup", {"ticket": 2}),
            ms.ContextOverflow("prompt is too long: 210000 tokens > 200000 maximum"),
            call("lookup", {"ticket": 3}),
            call("finish", {"answer": "ok"}),
        ]
    )
    agent = app.agent("overflow", model=model, instructions="x", tools=[_lookup(app)])
    result = await app.run(agent, "t")
    assert (result.status, result.answer, result.turns) == ("done", "ok", 4)
    assert _verbatim_call_ids(model.requests[2].messages) == ["call_0_0", "call_1_0"]
    compacted = model.requests[3].messages
    assert len(compacted) == 2  # system + task/state/summary: no verbatim turns
    context = _state_block(compacted)
    assert "Earlier turns (summary):" in context
    assert 'turn 1: lookup({"ticket": 1})' in context
    assert 'turn 2: lookup({"ticket": 2})' in context
    assert "Turns so far: 2; tool calls: 2" in context
    steps = _steps(app, MODEL_STEP)
    assert [s.status for s in steps] == ["completed"] * 2 + ["failed"] + ["completed"] * 2
    assert _error(steps[2])["type"] == "mainspring._errors.ContextOverflow"


async def test_request_after_a_compaction_does_not_repeat_summarised_turns(
    sqlite_app: ms.App,
) -> None:
    app = sqlite_app
    model = ScriptedModel(
        [
            call("lookup", {"ticket": 1}),
            call("lookup", {"ticket": 2}),
            ms.ContextOverflow("prompt is too long"),
            call("lookup", {"ticket": 3}),
            call("finish", {"answer": "ok"}),
        ]
    )
    agent = app.agent("overflow", model=model, instructions="x", tools=[_lookup(app)])
    await app.run(agent, "t")
    after = model.requests[4].messages
    assert 'turn 1: lookup({"ticket": 1})' in _state_block(after)
    assert _verbatim_call_ids(after) == ["call_3_0"]


async def test_context_overflow_twice_in_a_row_fails_the_run(sqlite_app: ms.App) -> None:
    app = sqlite_app
    model = ScriptedModel(
        [
            call("lookup", {"ticket": 1}),
            ms.ContextOverflow("prompt is too long (1)"),
            ms.ContextOverflow("prompt is too long (2)"),
            call("finish", {"answer": "never"}),
        ]
    )
    agent = app.agent("overflow2", model=model, instructions="x", tools=[_lookup(app)])
    with pytest.raises(ms.RunFailed) as info:
        await app.run(agent, "t")
    assert info.value.error["type"] == "mainspring._errors.StepFailed"
    assert "ContextOverflow: prompt is too long (2)" in info.value.error["message"]
    assert len(model.requests) == 3
    assert len(model.requests[2].messages) == 2  # the retry was compacted
    steps = _steps(app, MODEL_STEP)
    assert [s.status for s in steps] == ["completed", "failed", "failed"]
    assert app.get_run(_run_id(app)).status == "failed"


@pytest.mark.parametrize("error", [ms.PermissionDenied, ms.QuotaExhausted])
@pytest.mark.parametrize("action", ["retry", "stop"])
async def test_auth_and_quota_errors_wait_for_a_human(
    app: ms.App, error: type[ms.MainspringError], action: str
) -> None:
    @app.tool(retry=ms.RetryPolicy.never())
    def explode(ticket: int) -> str:
        raise ValueError(f"no ticket {ticket}")

    model = ScriptedModel(
        [
            call("explode", {"ticket": 9}),
            error("401: invalid x-api-key"),
            call("finish", {"answer": "resumed"}),
        ]
    )
    agent = app.agent("auth", model=model, instructions="x", tools=[explode])
    handle = app.submit(agent, "t")
    await drain(app)
    run = app.get_run(handle.run_id)
    assert (run.status, run.wait_reason) == ("waiting", "signal:resume")
    assert len(model.requests) == 2  # it did not keep hammering a refused key

    app.answer(handle.run_id, "resume", decision="reject" if action == "stop" else "approve")
    await drain(app)
    if action == "stop":
        with pytest.raises(ms.RunFailed) as info:
            await handle.result()
        assert info.value.error["type"] == "mainspring._errors.StepFailed"
        assert f"{error.__name__}: 401: invalid x-api-key" in info.value.error["message"]
        assert len(model.requests) == 2
        return
    result = await handle.result()
    assert (result.status, result.answer) == ("done", "resumed")
    assert len(model.requests) == 3
    resumed = model.requests[2].messages
    # The replayed turn tells the model exactly what it was told before the wait.
    assert _result_for(resumed, "call_0_0") == _result_for(model.requests[1].messages, "call_0_0")
    assert f"Last error: {error.__name__}: " in _state_block(resumed)
    kinds = [s.kind for s in app.observe.steps(handle.run_id)]
    assert kinds.count("signal") == 1
    failed = [s for s in _steps(app, MODEL_STEP) if s.status == "failed"]
    assert [_error(s)["type"] for s in failed] == [f"mainspring._errors.{error.__name__}"]


# -- 6. a model that repeats itself -------------------------------------------------------------

NUDGE = "That is not making progress: change your approach"


async def test_same_call_three_times_is_nudged_then_stopped(sqlite_app: ms.App) -> None:
    app = sqlite_app
    model = ScriptedModel([call("lookup", {"ticket": 1})] * 10)
    agent = app.agent("loop", model=model, instructions="x", tools=[_lookup(app)])
    with pytest.raises(ms.RunFailed) as info:
        await app.run(agent, "t")
    assert info.value.error["type"] == "mainspring._errors.LoopDetected"
    assert "the same action and result 3 times in a row" in info.value.error["message"]
    assert [_notes(r.messages) for r in model.requests[1:3]] == [[], []]
    (nudge,) = _notes(model.requests[3].messages)
    assert "the same action and result 3 times in a row" in nudge
    assert NUDGE in nudge
    assert len(model.requests) == 6  # stopped at the second loop, not the first
    assert len(_steps(app, "tool:lookup")) == 6
    assert app.get_run(_run_id(app)).status == "failed"


async def test_same_call_with_changing_results_is_not_a_loop(sqlite_app: ms.App) -> None:
    app = sqlite_app
    polls = iter(["queued", "queued", "running", "running", "done"])

    @app.tool
    def job_status(job: str) -> str:
        return next(polls)

    model = ScriptedModel(
        [call("job_status", {"job": "j1"})] * 5 + [call("finish", {"answer": "job done"})]
    )
    agent = app.agent("poll", model=model, instructions="x", tools=[job_status])
    result = await app.run(agent, "t")
    assert (result.status, result.turns) == ("done", 6)
    assert all(_notes(r.messages) == [] for r in model.requests)


async def test_a_b_a_b_alternation_is_nudged(sqlite_app: ms.App) -> None:
    app = sqlite_app
    a, b = call("lookup", {"ticket": 1}), call("lookup", {"ticket": 2})
    model = ScriptedModel([a, b, a, b, call("finish", {"answer": "broke the cycle"})])
    agent = app.agent("abab", model=model, instructions="x", tools=[_lookup(app)])
    result = await app.run(agent, "t")
    assert (result.status, result.answer) == ("done", "broke the cycle")
    assert all(_notes(r.messages) == [] for r in model.requests[:4])
    (nudge,) = _notes(model.requests[4].messages)
    assert "alternating between the same two actions (A-B-A-B)" in nudge
    assert NUDGE in nudge


async def test_same_error_with_different_arguments_is_nudged(sqlite_app: ms.App) -> None:
    app = sqlite_app

    @app.tool(retry=ms.RetryPolicy.never())
    def fetch(url: str) -> str:
        raise ConnectionError("upstream unreachable")

    urls = ["https://a.example", "https://b.example", "https://c.example"]
    model = ScriptedModel(
        [*(call("fetch", {"url": u}) for u in urls), call("finish", {"answer": "offline"})]
    )
    agent = app.agent("errors", model=model, instructions="x", tools=[fetch])
    result = await app.run(agent, "t")
    assert (result.status, result.answer) == ("done", "offline")
    assert all(_notes(r.messages) == [] for r in model.requests[:3])
    (nudge,) = _notes(model.requests[3].messages)
    assert "the same error 3 times in a row: ConnectionError: upstream unreachable" in nudge
    assert [s.status for s in _steps(app, "tool:fetch")] == ["failed"] * 3


# -- 7. budgets ---------------------------------------------------------------------------------


async def test_max_tool_calls_stops_with_a_partial_result(sqlite_app: ms.App) -> None:
    app = sqlite_app
    model = ScriptedModel(
        [
            call("update_state", {"facts": ["started"]}),
            call("lookup", {"ticket": 1}),
            call("lookup", {"ticket": 2}),
            call("lookup", {"ticket": 3}),
            call("finish", {"answer": "never"}),
        ]
    )
    limits = ms.Limits(max_tool_calls=2, on_exceeded="stop")
    agent = app.agent("calls", model=model, instructions="x", tools=[_lookup(app)], limits=limits)
    result = await app.run(agent, "t")
    assert (result.status, result.answer) == ("partial", None)
    assert result.reason == "max_tool_calls reached (2 of 2)"
    assert (result.turns, result.tool_calls) == (3, 2)  # update_state is not a tool call
    assert result.state["facts"] == ["started"]  # what was achieved is kept
    assert [s.name for s in _steps(app)].count("tool:lookup") == 2
    assert len(model.requests) == 3
    assert app.get_run(_run_id(app)).status == "succeeded"


async def test_max_tool_calls_is_not_overshot_by_a_parallel_turn(sqlite_app: ms.App) -> None:
    app = sqlite_app
    charged: list[int] = []

    @app.tool(effect="write")
    def charge(cents: int) -> str:
        charged.append(cents)
        return "charged"

    model = ScriptedModel(
        [
            ScriptedModel.calls(*(("charge", {"cents": c}) for c in (100, 200, 300, 400))),
            call("finish", {"answer": "never"}),
        ]
    )
    limits = ms.Limits(max_tool_calls=2, on_exceeded="stop")
    agent = app.agent("overshoot", model=model, instructions="x", tools=[charge], limits=limits)
    result = await app.run(agent, "t")
    assert charged == [100, 200]
    assert (result.status, result.tool_calls) == ("partial", 2)


async def test_max_tokens_stops_with_a_partial_result(sqlite_app: ms.App) -> None:
    app = sqlite_app
    cap = 1500
    model = ScriptedModel([call("lookup", {"ticket": i}) for i in range(20)])
    limits = ms.Limits(max_tokens=cap, on_exceeded="stop")
    agent = app.agent("tokens", model=model, instructions="x", tools=[_lookup(app)], limits=limits)
    result = await app.run(agent, "t")
    used = [sum(_usage(s)) for s in _steps(app, MODEL_STEP)]
    assert len(used) == result.turns >= 2
    assert sum(used[:-1]) < cap <= sum(used)  # stopped at the first turn past the cap
    assert result.input_tokens + result.output_tokens == sum(used)
    assert (result.status, result.answer) == ("partial", None)
    assert result.reason == f"max_tokens reached ({sum(used)} of {cap})"


async def test_max_cost_stops_with_a_partial_result(sqlite_app: ms.App) -> None:
    app = sqlite_app
    price = Price(input=1000.0, output=4000.0)  # USD per million tokens
    model = ScriptedModel(
        [call("lookup", {"ticket": i}) for i in range(20)], model_id="pricey-model"
    )
    limits = ms.Limits(max_cost_usd=1.0, on_exceeded="stop")
    agent = app.agent(
        "cost",
        model=model,
        instructions="x",
        tools=[_lookup(app)],
        limits=limits,
        prices={"pricey-model": price},
    )
    result = await app.run(agent, "t")
    costs = [
        (i * price.input + o * price.output) / 1_000_000
        for i, o in map(_usage, _steps(app, "model:scripted:pricey-model"))
    ]
    assert len(costs) == result.turns >= 2
    assert sum(costs[:-1]) < 1.0 <= sum(costs)
    assert result.cost_usd == pytest.approx(sum(costs), abs=1e-6)
    assert (result.status, result.answer) == ("partial", None)
    assert result.reason is not None
    assert result.reason.startswith("max_cost_usd reached (")
    assert result.reason.endswith(" of 1)")


async def test_last_error_names_the_tool_once(sqlite_app: ms.App) -> None:
    app = sqlite_app

    @app.tool(validators=[lambda result: "empty result" if not result else None])
    def fetch(item: int) -> str:
        """Fetch an item."""
        return ""

    @app.tool
    def crash(item: int) -> str:
        """Always fails."""
        raise ValueError(f"no item {item}")

    seen: list[str] = []

    def check(answer: Any, state: Any) -> None:
        seen.append(state.last_error)

    for name, tool in (("fetch", fetch), ("crash", crash)):
        model = ScriptedModel([call(name, {"item": 3}), call("finish", {"answer": "x"})])
        agent = app.agent(name, model=model, instructions="x", tools=[tool], validators=[check])
        await app.run(agent, "t")
    assert seen == [
        "ValidationFailed: fetch: result failed validator '<lambda>': empty result",
        "crash: ValueError: no item 3",
    ]


async def test_max_in_a_row_bounds_consecutive_faults() -> None:
    """Every call would fault; with ``max_in_a_row=2`` every third passes, so a retry
    policy of three attempts always recovers."""
    inner = ScriptedModel([f"answer {i}" for i in range(4)])
    model = FaultyModel(inner, FaultProfile(transient_rate=1.0, max_in_a_row=2), seed=3)
    answers = []
    for _ in range(12):
        try:
            answers.append((await model.request([UserMessage(content="go")])).text)
        except ms.TransientError:
            answers.append(None)
    assert answers == [x for i in range(4) for x in (None, None, f"answer {i}")]
    assert model.history == ["transient", "transient", None] * 4
    assert model.injected["transient"] == 8
    with pytest.raises(ms.ConfigError, match="max_in_a_row"):
        FaultProfile(transient_rate=0.1, max_in_a_row=-1)
