"""Agents through the official SDKs, against fake provider servers on 127.0.0.1."""

from __future__ import annotations

import json

import mainspring as ms
from mainspring.models import AnthropicModel, OpenAIModel
from mainspring.testing import FakeAnthropicServer, FakeOpenAIServer


def _tools(app: ms.App) -> list[ms.Tool[object, object]]:
    @app.tool
    def weather(city: str) -> dict[str, object]:
        """Today's weather.

        Args:
            city: the city.
        """
        return {"city": city, "sky": "clear", "c": 21}

    return [weather]  # type: ignore[list-item]


async def test_agent_over_openai_wire(app: ms.App) -> None:
    with FakeOpenAIServer(api_key="sk-test") as server:
        server.script(
            [
                server.rate_limited(0.01),  # a 429: the step backs off and retries
                server.tool_call("weather", {"city": "Lyon"}),
                server.tool_call("finish", {"answer": "Clear, 21 C in Lyon."}),
            ]
        )
        model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="sk-test")
        agent = app.agent("w", model=model, instructions="Answer.", tools=_tools(app))
        result = await app.run(agent, "Weather in Lyon?")
        await model.aclose()
        assert (result.status, result.answer) == ("done", "Clear, 21 C in Lyon.")
        assert result.cost_usd > 0  # gpt-4.1-mini is in the price table
        bodies = [r.body for r in server.requests]
        assert bodies[1]["tools"][0]["function"]["name"] == "weather"
        tool_msg = bodies[2]["messages"][-1]
        assert tool_msg["role"] == "tool"
        assert json.loads(tool_msg["content"]) == {"city": "Lyon", "sky": "clear", "c": 21}
    steps = app.observe.steps(app.list_runs()[0].id)
    # Rate limits are on by default: a booked slot before each model call.
    assert steps[0].role == "rate"
    first_model_step = next(s for s in steps if s.role == "model")
    # The 429 is visible in the journal, as a refused step that spent no attempt.
    assert (first_model_step.status, first_model_step.attempt) == ("failed", 1)
    assert "RateLimited" in (first_model_step.error or "")


async def test_agent_over_anthropic_wire(app: ms.App) -> None:
    with FakeAnthropicServer(api_key="sk-ant") as server:
        server.script(
            [
                server.tool_call("weather", {"city": "Oslo"}),
                server.text("Cloudless in Oslo."),
            ]
        )
        model = AnthropicModel("claude-haiku-4-5", base_url=server.base_url, api_key="sk-ant")
        agent = app.agent("w", model=model, instructions="Answer.", tools=_tools(app))
        result = await app.run(agent, "Weather in Oslo?")
        await model.aclose()
        assert (result.status, result.answer) == ("done", "Cloudless in Oslo.")
        second = server.requests[1].body
        blocks = second["messages"][-1]["content"]
        assert blocks[0]["type"] == "tool_result"
