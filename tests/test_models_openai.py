"""OpenAIModel through the official openai SDK against FakeOpenAIServer (127.0.0.1 only)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

pytest.importorskip("openai")

import openai

import mainspring as ms
from mainspring.models import (
    AssistantMessage,
    Message,
    ModelSettings,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from mainspring.models.openai import OpenAIModel
from mainspring.testing import FakeOpenAIServer, FakeReply, RecordedRequest

KEY = "sk-test"
ADD = ToolSpec(
    name="add",
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
HELLO: list[Message] = [
    SystemMessage(content="You add numbers."),
    UserMessage(content="What is 1 + 2?"),
]

# One server, one loop and one model for the module: an SDK client costs ~0.1 s to make.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def shared_server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(api_key=KEY) as fake:
        yield fake


@pytest.fixture
def server(shared_server: FakeOpenAIServer) -> FakeOpenAIServer:
    return shared_server.reset()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def model(shared_server: FakeOpenAIServer) -> AsyncIterator[OpenAIModel]:
    async with OpenAIModel(
        "gpt-4.1-mini", base_url=shared_server.base_url, api_key=KEY, timeout_s=5
    ) as adapter:
        yield adapter


async def test_text_reply_usage_headers_and_wire_shape(
    server: FakeOpenAIServer, model: OpenAIModel
) -> None:
    server.script([server.text("3", usage=Usage(input_tokens=120, output_tokens=7))])
    reply = await model.request(HELLO, tools=[ADD])

    assert reply.text == "3"
    assert reply.tool_calls == ()
    assert reply.finish_reason == "stop"
    assert reply.usage == Usage(input_tokens=120, output_tokens=7)
    assert reply.model == "gpt-4.1-mini"
    assert reply.latency_s > 0
    assert reply.rate_limit["x-ratelimit-limit-tokens"] == "2000000"
    assert reply.rate_limit["x-ratelimit-remaining-requests"] == "9999"
    assert reply.rate_limit["x-ratelimit-reset-tokens"] == "30ms"

    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["x-stainless-retry-count"] == "0"
    assert request.body["model"] == "gpt-4.1-mini"
    assert request.body["messages"] == [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 1 + 2?"},
    ]
    assert request.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": ADD.description,
                "parameters": ADD.parameters,
            },
        }
    ]


async def test_usage_is_estimated_and_cached_tokens_read(
    server: FakeOpenAIServer, model: OpenAIModel
) -> None:
    server.script(
        [
            server.text("a fairly long answer " * 10),
            server.text("x", usage=Usage(input_tokens=500, output_tokens=1, cache_read_tokens=400)),
        ]
    )
    estimated = await model.request(HELLO)
    assert estimated.usage.input_tokens > 0
    assert estimated.usage.output_tokens == 53  # 210 bytes / 4, rounded up
    cached = await model.request(HELLO)
    assert cached.usage == Usage(input_tokens=500, output_tokens=1, cache_read_tokens=400)


async def test_single_tool_call(server: FakeOpenAIServer, model: OpenAIModel) -> None:
    server.script([server.tool_call("add", {"a": 1, "b": 2}, id="call_abc")])
    reply = await model.request(HELLO, tools=[ADD])
    assert reply.finish_reason == "tool_calls"
    assert reply.tool_calls == (ToolCall(id="call_abc", name="add", arguments='{"a": 1, "b": 2}'),)
    assert reply.text is None


async def test_parallel_tool_calls_keep_order_and_raw_arguments(
    server: FakeOpenAIServer, model: OpenAIModel
) -> None:
    server.script(
        [server.tool_calls(("add", {"a": 1, "b": 2}), ("add", '{"a": 3, "b": '), text="Both.")]
    )
    reply = await model.request(HELLO, tools=[ADD])
    assert reply.text == "Both."
    assert [c.id for c in reply.tool_calls] == ["call_1_0", "call_1_1"]
    # Malformed arguments arrive verbatim: parsing and repair are the agent's job.
    assert [c.arguments for c in reply.tool_calls] == ['{"a": 1, "b": 2}', '{"a": 3, "b": ']


async def test_tool_results_round_trip_in_wire_shape(
    server: FakeOpenAIServer, model: OpenAIModel
) -> None:
    server.script([server.text("4 and 6")])
    history = [
        *HELLO,
        AssistantMessage(
            text=None,
            tool_calls=(
                ToolCall(id="c1", name="add", arguments='{"a": 1, "b": 3}'),
                ToolCall(id="c2", name="add", arguments='{"a": 2, "b": "x"}'),
            ),
        ),
        ToolResultMessage(tool_call_id="c1", name="add", content="4"),
        ToolResultMessage(tool_call_id="c2", name="add", content="b is not an int", is_error=True),
        AssistantMessage(text="Let me think."),
    ]
    reply = await model.request(history, tools=[ADD])
    assert reply.text == "4 and 6"
    assert server.requests[0].body["messages"][2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 3}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": "x"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: b is not an int"},
        {"role": "assistant", "content": "Let me think."},
    ]


async def test_settings_reach_the_wire(server: FakeOpenAIServer, model: OpenAIModel) -> None:
    server.script([server.text("ok")])
    settings = ModelSettings(
        temperature=0.2, top_p=0.9, max_tokens=50, stop=("END",), extra={"seed": 7}
    )
    await model.request(HELLO, settings=settings)
    body = server.requests[0].body
    # A compatible endpoint (base_url given) gets max_tokens, which they all know.
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.2, 0.9, 50)
    assert body["stop"] == ["END"]
    assert body["seed"] == 7


async def test_refusal(server: FakeOpenAIServer, model: OpenAIModel) -> None:
    server.script([server.refusal("I can't help with that.")])
    reply = await model.request(HELLO)
    assert reply.finish_reason == "refusal"
    assert reply.text == "I can't help with that."


@pytest.mark.parametrize(
    ("reply", "error", "retry_after"),
    [
        (FakeOpenAIServer.rate_limited(retry_after=2.5), ms.RateLimited, 2.5),
        (
            FakeOpenAIServer.error(429, "slow down", headers={"retry-after-ms": "1500"}),
            ms.RateLimited,
            1.5,
        ),
        (
            FakeOpenAIServer.rate_limited(
                retry_after=None,
                dimension="tokens",
                headers={"x-ratelimit-reset-tokens": "6m0s", "x-ratelimit-reset-requests": "1s"},
            ),
            ms.RateLimited,
            360.0,
        ),
        (FakeOpenAIServer.quota_exhausted(), ms.QuotaExhausted, None),
        (FakeOpenAIServer.server_error(500), ms.TransientError, None),
        (FakeOpenAIServer.server_error(502), ms.TransientError, None),
        (FakeOpenAIServer.server_error(503), ms.TransientError, None),
        (FakeOpenAIServer.server_error(504), ms.TransientError, None),
        (FakeOpenAIServer.overloaded(), ms.Overloaded, None),
        (FakeOpenAIServer.overloaded(retry_after=7), ms.Overloaded, 7),
        (FakeOpenAIServer.error(403, "Project does not have access"), ms.PermissionDenied, None),
        (FakeOpenAIServer.context_overflow(), ms.ContextOverflow, None),
        (
            # vLLM says it in words, with no code.
            FakeOpenAIServer.error(
                400, "This model's maximum context length is 4096 tokens. However, you requested"
            ),
            ms.ContextOverflow,
            None,
        ),
        (FakeOpenAIServer.error(400, "Invalid value for 'temperature'"), ms.ConfigError, None),
        (
            FakeOpenAIServer.error(404, "The model `gpt-9` does not exist", code="model_not_found"),
            ms.ConfigError,
            None,
        ),
        (FakeOpenAIServer.error(422, "Unprocessable"), ms.ConfigError, None),
    ],
)
async def test_errors_map_into_the_tree(
    server: FakeOpenAIServer,
    model: OpenAIModel,
    reply: FakeReply,
    error: type[ms.MainspringError],
    retry_after: float | None,
) -> None:
    server.script([reply])
    with pytest.raises(error) as caught:
        await model.request(HELLO)
    assert type(caught.value) is error
    assert caught.value.retryable == issubclass(error, ms.TransientError)
    assert getattr(caught.value, "retry_after", None) == retry_after
    assert isinstance(caught.value.__cause__, openai.APIStatusError)
    # The SDK did not retry behind the runtime's back.
    assert len(server.requests) == 1


async def test_error_message_names_the_model_and_the_provider_message(
    server: FakeOpenAIServer, model: OpenAIModel
) -> None:
    server.script([server.error(400, "Invalid value for 'temperature': must be <= 2")])
    with pytest.raises(ms.ConfigError) as caught:
        await model.request(HELLO)
    assert "gpt-4.1-mini" in str(caught.value)
    assert "HTTP 400" in str(caught.value)
    assert "must be <= 2" in str(caught.value)


async def test_wrong_api_key_is_permission_denied(server: FakeOpenAIServer) -> None:
    async with OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="sk-wrong") as bad:
        with pytest.raises(ms.PermissionDenied, match="invalid_api_key"):
            await bad.request(HELLO)


async def test_a_hung_server_is_a_transient_timeout(server: FakeOpenAIServer) -> None:
    server.script([server.text("too late", delay_s=3)])
    async with OpenAIModel(
        "gpt-4.1-mini", base_url=server.base_url, api_key=KEY, timeout_s=0.2
    ) as slow:
        with pytest.raises(ms.TransientError, match=r"timed out after 0\.2s") as caught:
            await slow.request(HELLO)
    assert caught.value.retryable
    assert len(server.requests) == 1


async def test_connection_refused_is_transient() -> None:
    with FakeOpenAIServer() as gone:
        url = gone.base_url
    async with OpenAIModel("m", base_url=url, api_key=KEY, timeout_s=2) as model:
        with pytest.raises(ms.TransientError, match="connection failed"):
            await model.request(HELLO)


async def test_a_given_client_gets_its_retries_turned_off(server: FakeOpenAIServer) -> None:
    client = openai.AsyncOpenAI(api_key=KEY, base_url=server.base_url, max_retries=5)
    server.script([server.server_error(503)])
    model = OpenAIModel("gpt-4.1-mini", client=client)
    with pytest.raises(ms.TransientError):
        await model.request(HELLO)
    assert len(server.requests) == 1
    await client.close()


async def test_the_official_endpoint_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    model = OpenAIModel("gpt-4.1-mini")
    with pytest.raises(ms.PermissionDenied, match="OPENAI_API_KEY"):
        await model.request(HELLO)


async def test_one_model_serves_several_event_loops(server: FakeOpenAIServer) -> None:
    # One Model object outlives loops (module-level agents, asyncio.run in scripts).
    model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key=KEY)
    server.script([server.text("one"), server.text("two"), server.text("three")])

    async def ask() -> str | None:
        try:
            return (await model.request(HELLO)).text
        finally:
            await model.aclose()

    assert await asyncio.to_thread(asyncio.run, ask()) == "one"
    assert await asyncio.to_thread(asyncio.run, ask()) == "two"
    assert await ask() == "three"


async def test_the_script_running_dry_is_a_clear_config_error(
    server: FakeOpenAIServer, model: OpenAIModel
) -> None:
    with pytest.raises(ms.ConfigError, match="nothing scripted for request #1"):
        await model.request(HELLO)


async def test_script_items_can_be_functions_of_the_request(
    server: FakeOpenAIServer, model: OpenAIModel
) -> None:
    def echo_last(request: RecordedRequest) -> FakeReply:
        return server.text(f"you said: {request.body['messages'][-1]['content']}")

    server.script([echo_last])
    assert server.pending == 1
    assert (await model.request(HELLO)).text == "you said: What is 1 + 2?"
    assert server.pending == 0


async def test_a_fallback_answers_when_the_script_is_empty() -> None:
    with FakeOpenAIServer(fallback=FakeOpenAIServer.text("always")) as fake:
        async with OpenAIModel("m", base_url=fake.base_url, api_key=KEY) as model:
            texts = [(await model.request(HELLO)).text for _ in range(3)]
    assert texts == ["always"] * 3
    assert len(fake.bodies) == 3


async def test_unknown_routes_are_404_in_the_provider_shape(server: FakeOpenAIServer) -> None:
    def get() -> tuple[int, object]:
        try:
            urllib.request.urlopen(f"{server.base_url}/models", timeout=5)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())
        raise AssertionError("expected a 404")

    status, body = await asyncio.to_thread(get)
    assert status == 404
    assert body == {
        "error": {
            "message": "no route GET /v1/models",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }


async def test_stopping_does_not_wait_for_a_hung_reply() -> None:
    fake = FakeOpenAIServer().start()
    arrived = threading.Event()

    def hang(request: RecordedRequest) -> FakeReply:
        arrived.set()
        return fake.text("never", delay_s=30)

    fake.script([hang])
    async with OpenAIModel("m", base_url=fake.base_url, api_key=KEY, timeout_s=10) as model:
        pending = asyncio.create_task(model.request(HELLO))
        assert await asyncio.to_thread(arrived.wait, 5)
        started = time.perf_counter()
        await asyncio.to_thread(fake.stop)
        assert time.perf_counter() - started < 2
        with pytest.raises(ms.MainspringError):
            await pending


async def test_a_failing_reply_function_is_reported(
    server: FakeOpenAIServer, model: OpenAIModel
) -> None:
    def broken(request: RecordedRequest) -> FakeReply:
        raise KeyError("oops")

    server.script([broken])
    with pytest.raises(ms.TransientError, match=r"the scripted reply raised KeyError\('oops'\)"):
        await model.request(HELLO)


async def test_openai_base_url_from_the_environment_needs_no_api_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeOpenAIServer() as local:  # checks no key
        local.script([local.text("hello")])
        monkeypatch.setenv("OPENAI_BASE_URL", local.base_url)
        async with OpenAIModel("llama3") as model:
            reply = await model.request([UserMessage(content="hi")])
        assert reply.text == "hello"
        assert local.requests[0].headers["authorization"] == "Bearer not-needed"
