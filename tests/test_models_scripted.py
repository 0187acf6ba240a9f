"""ScriptedModel and FaultyModel: deterministic models for tests, the demo and the lab."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest

import mainspring as ms
from mainspring.models import (
    AssistantMessage,
    Message,
    ModelResponse,
    ModelSettings,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from mainspring.models.faulty import FAULT_KINDS
from mainspring.testing import FakeClock, FaultProfile, FaultyModel, ScriptedModel

ASK: list[Message] = [UserMessage(content="Close ticket 7.")]
LOOKUP = ToolSpec(name="lookup", description="Find a ticket.", parameters={"type": "object"})
CLOSE = ToolSpec(name="close", description="Close a ticket.", parameters={"type": "object"})


async def test_a_script_plays_in_order_with_numbered_call_ids() -> None:
    model = ScriptedModel(
        [
            ScriptedModel.call("lookup", {"id": 7}),
            ScriptedModel.calls(("close", {"id": 7}), ("lookup", {"id": 8}), text="Two at once."),
            "Done.",
        ]
    )
    assert (model.name, model.provider, model.model_id) == (
        "scripted:scripted",
        "scripted",
        "scripted",
    )
    first = await model.request(ASK, tools=[LOOKUP, CLOSE])
    assert first.finish_reason == "tool_calls"
    assert first.tool_calls == (ToolCall(id="call_0_0", name="lookup", arguments='{"id": 7}'),)
    second = await model.request(ASK)
    assert second.text == "Two at once."
    assert [(c.id, c.name) for c in second.tool_calls] == [
        ("call_1_0", "close"),
        ("call_1_1", "lookup"),
    ]
    third = await model.request(ASK)
    assert (third.text, third.tool_calls, third.finish_reason) == ("Done.", (), "stop")
    assert third.model == "scripted"
    assert model.remaining == 0


async def test_requests_are_recorded() -> None:
    model = ScriptedModel(["a"])
    settings = ModelSettings(temperature=0)
    await model.request(ASK, tools=[LOOKUP], settings=settings)
    (request,) = model.requests
    assert request.messages == tuple(ASK)
    assert request.tools == (LOOKUP,)
    assert request.settings == settings


async def test_usage_is_estimated_from_utf8_bytes() -> None:
    model = ScriptedModel(["é" * 10, ModelResponse(text="x", usage=Usage(input_tokens=9))])
    reply = await model.request([UserMessage(content="a" * 40)])
    assert reply.usage == Usage(input_tokens=10, output_tokens=5)  # 40 / 4; 20 bytes / 4
    # A scripted usage is kept as it is.
    assert (await model.request(ASK)).usage == Usage(input_tokens=9)


async def test_running_out_is_a_clear_config_error() -> None:
    model = ScriptedModel(["only"])
    await model.request(ASK)
    with pytest.raises(ms.ConfigError, match=r"ran out of script: it has 1 turns .* turn 1"):
        await model.request(ASK)


async def test_a_turn_can_raise_and_a_retry_gets_the_next_turn() -> None:
    model = ScriptedModel([ms.RateLimited("slow down", retry_after=2), "after the wait"])
    with pytest.raises(ms.RateLimited) as caught:
        await model.request(ASK)
    assert caught.value.retry_after == 2
    assert (await model.request(ASK)).text == "after the wait"


async def test_turns_can_be_functions_sync_or_async() -> None:
    def echo(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        return f"{len(messages)} messages, {len(tools)} tools"

    async def call_first_tool(
        messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelResponse:
        await asyncio.sleep(0)
        return ScriptedModel.call(tools[0].name, {"from": "async"})

    model = ScriptedModel([echo, call_first_tool])
    assert (await model.request(ASK, tools=[LOOKUP])).text == "1 messages, 1 tools"
    reply = await model.request(ASK, tools=[CLOSE])
    assert reply.tool_calls[0].name == "close"


async def test_one_function_can_play_every_turn() -> None:
    def policy(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ModelResponse | str:
        last = messages[-1]
        if isinstance(last, ToolResultMessage):
            return f"The ticket says {last.content}."
        return ScriptedModel.call("lookup", {"id": 7})

    model = ScriptedModel(policy)
    first = await model.request(ASK, tools=[LOOKUP])
    call = first.tool_calls[0]
    history = [
        *ASK,
        AssistantMessage(tool_calls=first.tool_calls),
        ToolResultMessage(tool_call_id=call.id, name=call.name, content="open"),
    ]
    assert (await model.request(history)).text == "The ticket says open."
    assert model.remaining is None


async def test_a_function_returning_junk_is_a_config_error() -> None:
    model = ScriptedModel(lambda messages, tools: 42)  # type: ignore[arg-type, return-value]
    with pytest.raises(ms.ConfigError, match="must return a ModelResponse"):
        await model.request(ASK)


async def test_history_mode_replays_the_same_turn_for_a_retry() -> None:
    model = ScriptedModel([ScriptedModel.call("lookup", {"id": 7}), "Closed."], turn_from="history")
    first = await model.request(ASK)
    retried = await model.request(ASK)  # same history: same turn
    assert first.tool_calls == retried.tool_calls
    history = [
        *ASK,
        AssistantMessage(tool_calls=first.tool_calls),
        ToolResultMessage(tool_call_id="call_0_0", name="lookup", content="open"),
    ]
    # A fresh model (a new process recovering the run) picks up where the history is.
    fresh = ScriptedModel([ScriptedModel.call("lookup", {"id": 7}), "Closed."], turn_from="history")
    assert (await fresh.request(history)).text == "Closed."


async def test_raw_arguments_are_kept_verbatim_for_repair_tests() -> None:
    model = ScriptedModel([ScriptedModel.call("lookup", '{"id": ')])
    assert (await model.request(ASK)).tool_calls[0].arguments == '{"id": '


def test_a_single_turn_instead_of_a_list_is_refused() -> None:
    with pytest.raises(ms.ConfigError, match="list of turns"):
        ScriptedModel("hello")


# -- FaultyModel ---------------------------------------------------------------------------


def echo_model() -> ScriptedModel:
    return ScriptedModel(lambda messages, tools: "fine")


def test_fault_profiles_are_validated() -> None:
    with pytest.raises(ms.ConfigError, match="transient_rate must be within"):
        FaultProfile(transient_rate=1.5)
    with pytest.raises(ms.ConfigError, match="add up to"):
        FaultProfile(transient_rate=0.6, empty_rate=0.6)
    with pytest.raises(ms.ConfigError, match="timeout_s must not be negative"):
        FaultProfile(timeout_s=-1)
    uniform = FaultProfile.uniform(0.3)
    assert uniform.total_rate == pytest.approx(0.3)
    assert set(uniform.rates()) == set(FAULT_KINDS)


def test_faults_are_deterministic_per_seed_and_index() -> None:
    profile = FaultProfile.uniform(0.5)
    a = FaultyModel(echo_model(), profile, seed=1)
    b = FaultyModel(echo_model(), profile, seed=1)
    c = FaultyModel(echo_model(), profile, seed=2)
    plan_a = [a.fault_at(i) for i in range(200)]
    assert plan_a == [b.fault_at(i) for i in range(200)]
    assert plan_a != [c.fault_at(i) for i in range(200)]
    # Roughly the profile's rates (200 draws; a loose band, but never flaky: seeded).
    assert 70 <= sum(f is not None for f in plan_a) <= 130
    assert set(plan_a) == {None, *FAULT_KINDS}


async def test_injected_faults_follow_the_plan_and_are_counted() -> None:
    profile = FaultProfile.uniform(0.9, timeout_s=0.001, retry_after_s=4)
    model = FaultyModel(echo_model(), profile, seed=3)
    plan = [model.fault_at(i) for i in range(60)]
    for expected in plan:
        if expected in ("transient", "timeout"):
            with pytest.raises(ms.TransientError) as caught:
                await model.request(ASK, tools=[LOOKUP])
            assert type(caught.value) is ms.TransientError
            assert "injected fault" in str(caught.value)
        elif expected == "rate_limit":
            with pytest.raises(ms.RateLimited) as limited:
                await model.request(ASK, tools=[LOOKUP])
            assert limited.value.retry_after == 4
        else:
            reply = await model.request(ASK, tools=[LOOKUP])
            if expected is None:
                assert reply.text == "fine"
            elif expected == "refusal":
                assert reply.finish_reason == "refusal" and reply.text
            elif expected == "empty":
                assert (reply.text, reply.tool_calls) == (None, ())
            else:  # malformed: broken JSON, not an object, or no tool name
                (call,) = reply.tool_calls
                try:
                    parsed = json.loads(call.arguments)
                except ValueError:
                    parsed = None
                assert not isinstance(parsed, dict) or call.name == ""
            if expected is not None:
                assert reply.usage.input_tokens > 0
    assert model.history == plan
    assert model.calls == 60
    assert sum(model.injected.values()) == sum(f is not None for f in plan)
    assert model.injected["transient"] == plan.count("transient")


async def test_a_fault_does_not_consume_the_inner_script() -> None:
    inner = ScriptedModel(["first", "second"])
    profile = FaultProfile(transient_rate=0.5)
    seed = next(s for s in range(100) if FaultyModel(inner, profile, s).fault_at(0))
    model = FaultyModel(inner, profile, seed=seed)
    texts: list[str | None] = []
    for _ in range(20):
        if len(texts) == 2:
            break
        try:
            texts.append((await model.request(ASK)).text)
        except ms.TransientError:
            continue
    assert texts == ["first", "second"]
    assert len(inner.requests) == 2
    assert model.injected["transient"] >= 1


async def test_malformed_output_without_tools_is_broken_json_text() -> None:
    model = FaultyModel(echo_model(), FaultProfile(malformed_rate=1.0), seed=0)
    reply = await model.request(ASK)
    assert reply.tool_calls == ()
    assert reply.text is not None
    with pytest.raises(json.JSONDecodeError, match="Expecting value"):
        json.loads(reply.text.removeprefix("```json\n"))


async def test_a_hang_sleeps_on_the_given_clock_then_times_out() -> None:
    clock = FakeClock()
    model = FaultyModel(
        echo_model(), FaultProfile(timeout_rate=1.0, timeout_s=30), seed=0, clock=clock
    )
    task = asyncio.create_task(model.request(ASK))
    await asyncio.sleep(0.01)
    assert not task.done()  # hung
    clock.advance(30)
    with pytest.raises(ms.TransientError, match=r"timed out after 30s"):
        await task


async def test_faulty_model_stands_in_for_its_inner_model() -> None:
    inner = ScriptedModel(["x"], model_id="gpt-fake")
    model = FaultyModel(inner, FaultProfile(), seed=0)
    assert (model.name, model.provider, model.model_id) == (
        "scripted:gpt-fake",
        "scripted",
        "gpt-fake",
    )
    assert (await model.request(ASK)).text == "x"
    await model.aclose()
