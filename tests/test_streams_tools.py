"""Tool calls stream too: a turn whose output is a tool call (most agent turns) shows
its arguments as they form, through ``app.stream`` (``kind="tool_call"``), SSE
(``tool_call_delta`` events) and the dashboard, from the official openai and anthropic
SDKs against the fake servers and from ScriptedModel; text events stay as they were."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from _helpers import uvicorn_serving
from test_streams import _sse

import mainspring as ms
from mainspring.models import ModelResponse, ScriptedModel, ToolSpec, UserMessage
from mainspring.testing import FakeAnthropicServer, FakeOpenAIServer, assert_invariants

TEXT = "The quick brown fox jumps over the lazy dog, and then it streams home."


def _calls(events: Sequence[ms.TokenEvent]) -> dict[tuple[int, int, int], dict[str, Any]]:
    """Each streamed tool call, by (session, seq, index): its id, name, arguments, pieces."""
    calls: dict[tuple[int, int, int], dict[str, Any]] = {}
    for e in events:
        if e.kind == "tool_call":
            assert e.call_index is not None and e.text == "" and e.end is None
            call = calls.setdefault(
                (e.session, e.seq, e.call_index), {"id": e.call_id, "name": e.name, "pieces": []}
            )
            assert (call["id"], call["name"]) == (e.call_id, e.name)  # on every piece
            call["pieces"].append(e.arguments)
    for call in calls.values():
        call["arguments"] = "".join(call["pieces"])
    return calls


def _weather(app: ms.App) -> Any:
    @app.tool
    def weather(city: str, days: int = 1) -> str:
        """The weather.

        Args:
            city: the city.
            days: how many days.
        """
        return f"clear in {city} for {days} day(s)"

    return weather


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_tool_call_arguments_stream_through_the_official_sdks(
    app: ms.App, provider: str
) -> None:
    pytest.importorskip(provider)
    server_cls = FakeOpenAIServer if provider == "openai" else FakeAnthropicServer
    model_cls = ms.models.OpenAIModel if provider == "openai" else ms.models.AnthropicModel
    weather = _weather(app)
    with server_cls() as server:
        server.stream_gap_s = 0.03  # a provider's pace: the arguments span several batches
        server.script(
            [
                server.tool_call("weather", {"city": "Lyon", "days": 3}, text="Let me look."),
                server.tool_calls(("weather", {"city": "Paris"}), ("weather", {"city": "Nice"})),
                server.text(TEXT),
            ]
        )
        model = model_cls("m", base_url=server.base_url, api_key="k", stream=True)
        agent = app.agent("w", model=model, instructions="Answer.", tools=[weather])
        result = await app.run(agent, "Weather?")
        await model.aclose()
    assert (result.status, result.answer) == ("done", TEXT)
    run_id = app.list_runs()[0].id
    events = [e async for e in app.stream(run_id, poll_s=0.01)]
    # Text events are as before: the text of every turn, whole.
    assert "".join(e.text for e in events) == "Let me look." + TEXT
    models = [s for s in app.observe.steps(run_id) if s.role == "model"]
    streamed = _calls(events)
    journaled = {
        (s.session, s.seq, i): c
        for s in models
        for i, c in enumerate(json.loads(s.output or "{}")["tool_calls"])
    }
    assert streamed.keys() == journaled.keys() and len(streamed) == 3
    for key, call in streamed.items():
        assert (call["id"], call["name"]) == (journaled[key]["id"], "weather")
        assert json.loads(call["arguments"]) == json.loads(journaled[key]["arguments"])
        assert len(call["pieces"]) >= 2  # as it formed, not whole at the end
    assert [e.end for e in events if e.end] == ["done", "done", "done"]
    assert_invariants(app.store, run_ids=[run_id])


async def test_scripted_model_streams_its_tool_calls_in_pieces(app: ms.App) -> None:
    seen: list[tuple[int, str]] = []
    model = ScriptedModel(
        [
            ScriptedModel.calls(("weather", {"city": "Lyon"}), ("weather", {"city": "Oslo"})),
            ScriptedModel.call("finish", {"answer": "clear"}, text="Done."),
        ],
        chunk_size=4,
        on_chunk=lambda index, piece: seen.append((index, piece)),
    )
    agent = app.agent("w", model=model, instructions="Answer.", tools=[_weather(app)])
    result = await app.run(agent, "Weather?")
    assert result.answer == "clear"
    run_id = app.list_runs()[0].id
    events = [e async for e in app.stream(run_id, poll_s=0.01)]
    calls = _calls(events)
    assert [(k[2], c["name"], c["arguments"]) for k, c in sorted(calls.items())] == [
        (0, "weather", '{"city": "Lyon"}'),
        (1, "weather", '{"city": "Oslo"}'),
        (0, "finish", '{"answer": "clear"}'),
    ]
    assert [c["id"] for _, c in sorted(calls.items())] == ["call_0_0", "call_0_1", "call_1_0"]
    # The hook sees every piece, text and arguments, numbered across the turn.
    assert seen[:5] == [(0, '{"ci'), (1, 'ty":'), (2, ' "Ly'), (3, 'on"}'), (4, '{"ci')]
    assert [p for i, p in seen[8:]][:2] == ["Done", "."]
    assert "".join(e.text for e in events) == "Done."
    assert_invariants(app.store, run_ids=[run_id])


class _TextOnly(ms.models.Model):
    """A model of a user's, written before tool calls streamed: its ``stream`` takes
    no ``on_tool_call``."""

    provider = "mine"
    model_id = "text-only"
    name = "mine:text-only"
    streams = True

    def __init__(self) -> None:
        self.inner = ScriptedModel([ScriptedModel.call("weather", {"city": "Rome"}), "Sunny."])

    async def request(
        self, messages: Any, *, tools: Any = (), settings: Any = None
    ) -> ModelResponse:
        return await self.inner.request(messages, tools=tools, settings=settings)

    async def stream(
        self, messages: Any, *, tools: Any = (), settings: Any = None, on_text: Any
    ) -> ModelResponse:
        reply = await self.request(messages, tools=tools, settings=settings)
        for word in (reply.text or "").split(" "):
            on_text(word)
        return reply


async def test_a_model_whose_stream_predates_tool_calls_still_streams_its_text(
    app: ms.App,
) -> None:
    agent = app.agent("w", model=_TextOnly(), instructions="Answer.", tools=[_weather(app)])
    result = await app.run(agent, "Weather in Rome?")
    assert result.answer == "Sunny."
    events = [e async for e in app.stream(app.list_runs()[0].id, poll_s=0.01)]
    assert [e.kind for e in events] == ["text"] * len(events)
    assert "".join(e.text for e in events) == "Sunny."


async def test_the_default_stream_hands_out_each_tool_call_whole() -> None:
    """``Model.stream`` of a model that does not stream: the whole text, then each
    whole tool call."""
    scripted = ScriptedModel([ScriptedModel.call("f", {"a": 1}, text="Hi")])
    texts: list[str] = []
    deltas: list[ms.models.ToolCallDelta] = []
    reply = await ms.models.Model.stream(
        scripted,
        [UserMessage(content="go")],
        tools=[ToolSpec(name="f", description="F.", parameters={"type": "object"})],
        on_text=texts.append,
        on_tool_call=deltas.append,
    )
    assert texts == ["Hi"]
    assert deltas == [
        ms.models.ToolCallDelta(index=0, id="call_0_0", name="f", arguments='{"a": 1}')
    ]
    assert reply.tool_calls[0].arguments == '{"a": 1}'


# -- over SSE ------------------------------------------------------------------------------


async def test_sse_sends_tool_calls_as_tool_call_delta_events(db_url: str) -> None:
    app = ms.App(db_url, poll_interval_s=0.01)
    key = app.admin.create_key("ops", ["read"])[1]
    model = ScriptedModel(
        [ScriptedModel.call("weather", {"city": "Lyon", "days": 2}, text="Looking."), "Clear."],
        chunk_size=5,
    )
    agent = app.agent("w", model=model, instructions="Answer.", tools=[_weather(app)])
    try:
        await app.run(agent, "Weather?")
        run_id = app.list_runs()[0].id
        with uvicorn_serving(app) as base:
            headers = {"Authorization": f"Bearer {key}"}
            async with (
                httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client,
                client.stream("GET", f"/runs/{run_id}/events") as response,
            ):
                events = [e async for e in _sse(response) if e["event"] != "step"]
        deltas = [e for e in events if e["event"] == "tool_call_delta"]
        assert deltas[0]["data"] == {
            "type": "tool_call_delta",
            "session": 0,
            "seq": deltas[0]["data"]["seq"],
            "epoch": 1,
            "attempt": 1,
            "index": 0,
            "call_id": "call_0_0",
            "name": "weather",
            "arguments": deltas[0]["data"]["arguments"],
        }
        assert "".join(d["data"]["arguments"] for d in deltas) == '{"city": "Lyon", "days": 2}'
        # Text keeps its tokens events, unchanged: an old client sees only the text.
        text = [e["data"]["text"] for e in events if e["event"] == "tokens" and "text" in e["data"]]
        assert "".join(text) == "Looking.Clear."
        assert all("~t" in e["id"] for e in deltas)
    finally:
        app.close()
