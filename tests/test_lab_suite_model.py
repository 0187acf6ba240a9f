"""The horizon suite's provider speaks OpenAI's wire to the official SDK: it plays the
policy as tool calls, and its faults are what the SDK and mainspring's OpenAIModel see
of a real provider's (a 429 with retry-after, a 5xx, a reply past the client timeout)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import openai
import pytest

from mainspring import ConfigError, RateLimited, TransientError
from mainspring.lab import (
    TASKS,
    KillRates,
    PolicyRates,
    ProviderFaults,
    SuiteModelServer,
    SuiteWorld,
)
from mainspring.models import OpenAIModel, UserMessage

_CLEAN = PolicyRates(malformed=0, wrong_tool=0, repeat=0, forget=0)
_NO_FAULTS = ProviderFaults(server_error=0, rate_limited=0, timeout=0)


def _world(tmp_path: Path, provider: ProviderFaults, seed: int = 0) -> SuiteWorld:
    world = SuiteWorld(tmp_path / "world.db")
    world.faults.configure(seed, KillRates(), provider, policy=asdict(_CLEAN))
    world.add_run("migrate", "b1", 3)
    return world


async def _ask(model: OpenAIModel) -> None:
    async with model:  # closes its client on this loop
        await model.request([UserMessage(content="migrate batch b1")])


def _tools(task: str) -> list[dict[str, Any]]:
    tools = [
        {"type": "function", "function": {"name": t.name, "parameters": t.parameters}}
        for t in TASKS[task].tools
    ]
    answer = {"type": "object", "properties": {"answer": {"type": "string"}}}
    return [*tools, {"type": "function", "function": {"name": "finish", "parameters": answer}}]


def test_the_official_sdk_gets_the_policy_as_tool_calls(tmp_path: Path) -> None:
    world = _world(tmp_path, _NO_FAULTS)
    with SuiteModelServer(world.path) as server:
        client = openai.OpenAI(
            base_url=server.base_url, api_key="sk-suite", timeout=server.client_timeout_s
        )
        messages: list[Any] = [{"role": "user", "content": "migrate batch b1"}]
        made = []
        for _turn in range(20):
            reply = client.chat.completions.create(
                model="horizon", messages=messages, tools=_tools("migrate")
            )
            call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
            assert reply.choices[0].finish_reason == "tool_calls"
            made.append(call.function.name)  # type: ignore[union-attr]
            if call.function.name == "finish":  # type: ignore[union-attr]
                break
            arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
            result = world.call("b1", call.function.name, arguments, call.id)  # type: ignore[union-attr]
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}
            )
    # With nothing to go on it asks the world; then it follows what the world says.
    assert made[:3] == ["progress", "validate", "write"]
    assert made[-1] == "finish"
    assert world.check("b1") == []
    calls, tokens = world.model_calls("b1")
    assert calls == len(made) and tokens > 0
    assert world.faults.provider_faults() == {"server_error": 0, "rate_limited": 0, "timeout": 0}
    world.close()


def test_a_429_carries_retry_after_and_rate_headers_and_is_not_paid(tmp_path: Path) -> None:
    world = _world(tmp_path, ProviderFaults(server_error=0, rate_limited=1, timeout=0))
    with SuiteModelServer(world.path) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-suite", max_retries=0)
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(
                model="horizon", messages=[{"role": "user", "content": "migrate batch b1"}]
            )
        headers = caught.value.response.headers
        assert headers["retry-after"] == "1"
        assert headers["retry-after-ms"] == "1000"
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert caught.value.code == "rate_limit_exceeded"
        # mainspring's adapter reads the same headers.
        model = OpenAIModel("horizon", base_url=server.base_url, api_key="sk-suite")
        with pytest.raises(RateLimited) as limited:
            asyncio.run(_ask(model))
        assert limited.value.retry_after == 1.0
    assert world.model_calls("b1") == (0, 0)
    assert world.faults.provider_faults("b1")["rate_limited"] == 2
    world.close()


def test_a_server_error_is_a_5xx_in_openais_error_json(tmp_path: Path) -> None:
    world = _world(tmp_path, ProviderFaults(server_error=1, rate_limited=0, timeout=0))
    with SuiteModelServer(world.path) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-suite", max_retries=0)
        statuses = set()
        for _ in range(6):
            with pytest.raises(openai.InternalServerError) as caught:
                client.chat.completions.create(
                    model="horizon", messages=[{"role": "user", "content": "migrate batch b1"}]
                )
            statuses.add(caught.value.status_code)
            assert caught.value.body["type"] == "server_error"  # type: ignore[index]
    assert statuses == {500, 503}
    assert world.model_calls("b1") == (0, 0)
    world.close()


def test_a_timeout_fault_outlasts_a_client_with_the_suite_timeout(tmp_path: Path) -> None:
    faults = ProviderFaults(server_error=0, rate_limited=0, timeout=1, timeout_s=0.5)
    world = _world(tmp_path, faults)
    with SuiteModelServer(world.path) as server:
        assert server.client_timeout_s == 0.5
        client = openai.OpenAI(
            base_url=server.base_url,
            api_key="sk-suite",
            timeout=server.client_timeout_s,
            max_retries=0,
        )
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(
                model="horizon", messages=[{"role": "user", "content": "migrate batch b1"}]
            )
        model = OpenAIModel("horizon", base_url=server.base_url, api_key="sk-suite", timeout_s=0.5)
        with pytest.raises(TransientError):
            asyncio.run(_ask(model))
    assert world.model_calls("b1") == (0, 0)
    world.close()


def test_the_same_seed_draws_the_same_provider_faults(tmp_path: Path) -> None:
    seen = []
    for seed, where in ((5, "a"), (5, "b"), (6, "c")):
        (tmp_path / where).mkdir()
        faults = ProviderFaults(server_error=0.2, rate_limited=0.2, timeout=0)
        world = _world(tmp_path / where, faults, seed=seed)
        with SuiteModelServer(world.path) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="sk-suite", max_retries=0)
            for _ in range(30):
                with contextlib.suppress(openai.APIStatusError):
                    client.chat.completions.create(
                        model="horizon",
                        messages=[{"role": "user", "content": "migrate batch b1"}],
                    )
        seen.append(world.faults.provider_fault_events("b1"))
        assert seen[-1] == [
            (n, k) for n in range(30) if (k := faults.draw(seed, "b1", n)) is not None
        ]
        world.close()
    assert seen[0] == seen[1] != seen[2]
    assert seen[0]  # some requests did fail


def test_a_request_that_names_no_run_is_refused_and_an_unconfigured_world_too(
    tmp_path: Path,
) -> None:
    world = _world(tmp_path, _NO_FAULTS)
    with SuiteModelServer(world.path) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-suite", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="names the run"):
            client.chat.completions.create(
                model="horizon", messages=[{"role": "user", "content": "hello"}]
            )
    world.close()
    with pytest.raises(ConfigError, match="not configured"):
        SuiteModelServer(tmp_path / "other.db")
