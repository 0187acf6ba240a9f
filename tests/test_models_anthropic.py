"""AnthropicModel through the official anthropic SDK against FakeAnthropicServer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

pytest.importorskip("anthropic")

import anthropic

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
from mainspring.models.anthropic import AnthropicModel
from mainspring.testing import FakeAnthropicServer, FakeReply

KEY = "sk-ant-test"
WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather of a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
HELLO: list[Message] = [
    SystemMessage(content="You are terse."),
    UserMessage(content="Weather in Paris?"),
]

# One server, one loop and one model for the module: an SDK client costs ~0.1 s to make.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def shared_server() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer(api_key=KEY) as fake:
        yield fake


@pytest.fixture
def server(shared_server: FakeAnthropicServer) -> FakeAnthropicServer:
    return shared_server.reset()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def model(shared_server: FakeAnthropicServer) -> AsyncIterator[AnthropicModel]:
    async with AnthropicModel(
        "claude-sonnet-5", base_url=shared_server.base_url, api_key=KEY, timeout_s=5
    ) as adapter:
        yield adapter


async def test_text_reply_usage_headers_and_wire_shape(
    server: FakeAnthropicServer, model: AnthropicModel
) -> None:
    server.script([server.text("Sunny.", usage=Usage(input_tokens=80, output_tokens=3))])
    reply = await model.request(HELLO, tools=[WEATHER])

    assert reply.text == "Sunny."
    assert reply.tool_calls == ()
    assert reply.finish_reason == "stop"
    assert reply.usage == Usage(input_tokens=80, output_tokens=3)
    assert reply.model == "claude-sonnet-5"
    assert reply.latency_s > 0
    assert reply.rate_limit["anthropic-ratelimit-input-tokens-limit"] == "2000000"
    assert reply.rate_limit["anthropic-ratelimit-output-tokens-remaining"] == "399900"
    assert reply.rate_limit["anthropic-ratelimit-requests-reset"].endswith("Z")

    (request,) = server.requests
    assert request.path == "/v1/messages"
    assert request.headers.get("x-stainless-retry-count") == "0"
    assert "anthropic-version" in request.headers
    body = request.body
    assert body["model"] == "claude-sonnet-5"
    assert body["system"] == "You are terse."
    assert body["max_tokens"] == 4096
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}
    ]
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": WEATHER.description,
            "input_schema": WEATHER.parameters,
        }
    ]


async def test_usage_counts_cached_prompt_tokens_as_input(
    server: FakeAnthropicServer, model: AnthropicModel
) -> None:
    server.script(
        [
            FakeReply(
                body={
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-5",
                    "content": [{"type": "text", "text": "ok"}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 10,
                        "output_tokens": 2,
                        "cache_read_input_tokens": 300,
                        "cache_creation_input_tokens": 50,
                    },
                }
            )
        ]
    )
    reply = await model.request(HELLO)
    # Normalised to OpenAI's meaning: input_tokens is the whole prompt.
    assert reply.usage == Usage(
        input_tokens=360, output_tokens=2, cache_read_tokens=300, cache_write_tokens=50
    )


async def test_estimated_usage_and_cache_round_trip(
    server: FakeAnthropicServer, model: AnthropicModel
) -> None:
    cached = Usage(input_tokens=400, output_tokens=9, cache_read_tokens=300, cache_write_tokens=20)
    server.script([server.text("estimated"), server.text("cached", usage=cached)])
    estimated = await model.request(HELLO)
    assert estimated.usage.input_tokens > 0 and estimated.usage.output_tokens == 3
    # The wire carried Anthropic's split (input_tokens 80); the adapter adds the cache back.
    assert (await model.request(HELLO)).usage == cached


async def test_single_tool_use(server: FakeAnthropicServer, model: AnthropicModel) -> None:
    server.script([server.tool_call("get_weather", {"city": "Paris"}, id="toolu_01")])
    reply = await model.request(HELLO, tools=[WEATHER])
    assert reply.finish_reason == "tool_calls"
    assert reply.tool_calls == (
        ToolCall(id="toolu_01", name="get_weather", arguments='{"city": "Paris"}'),
    )
    assert reply.text is None


async def test_parallel_tool_use_with_text(
    server: FakeAnthropicServer, model: AnthropicModel
) -> None:
    server.script(
        [
            server.tool_calls(
                ("get_weather", {"city": "Paris"}),
                ("get_weather", {"city": "Oslo"}),
                text="Checking both.",
            )
        ]
    )
    reply = await model.request(HELLO, tools=[WEATHER])
    assert reply.text == "Checking both."
    assert [(c.id, c.arguments) for c in reply.tool_calls] == [
        ("toolu_1_0", '{"city": "Paris"}'),
        ("toolu_1_1", '{"city": "Oslo"}'),
    ]


async def test_tool_results_merge_into_one_user_message(
    server: FakeAnthropicServer, model: AnthropicModel
) -> None:
    server.script([server.text("Paris 21°C, Oslo unknown.")])
    history = [
        *HELLO,
        AssistantMessage(
            text="Checking both.",
            tool_calls=(
                ToolCall(id="t1", name="get_weather", arguments='{"city": "Paris"}'),
                ToolCall(id="t2", name="get_weather", arguments='{"city": '),  # botched
            ),
        ),
        ToolResultMessage(tool_call_id="t1", name="get_weather", content="21°C"),
        ToolResultMessage(tool_call_id="t2", name="get_weather", content="bad JSON", is_error=True),
        UserMessage(content="Also, be brief."),
        SystemMessage(content="Answer in English."),
    ]
    await model.request(history, tools=[WEATHER])
    body = server.requests[0].body
    assert body["system"] == "You are terse.\n\nAnswer in English."
    assert body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking both."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
                # The API wants an object even for a botched call; the result says why.
                {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "21°C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": "bad JSON",
                    "is_error": True,
                },
                {"type": "text", "text": "Also, be brief."},
            ],
        },
    ]


async def test_settings_reach_the_wire(server: FakeAnthropicServer, model: AnthropicModel) -> None:
    server.script([server.text("ok")])
    settings = ModelSettings(
        temperature=0.3, top_p=0.8, max_tokens=256, stop=("###",), extra={"top_k": 5}
    )
    await model.request(HELLO, settings=settings)
    body = server.requests[0].body
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.3, 0.8, 5)
    assert (body["max_tokens"], body["stop_sequences"]) == (256, ["###"])


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("refusal", "refusal"),
        ("pause_turn", "other"),
    ],
)
async def test_stop_reasons_normalise(
    server: FakeAnthropicServer, model: AnthropicModel, stop: str, finish: str
) -> None:
    server.script([server.text("...", stop_reason=stop)])
    assert (await model.request(HELLO)).finish_reason == finish


async def test_refusal(server: FakeAnthropicServer, model: AnthropicModel) -> None:
    server.script([server.refusal("I won't do that.")])
    reply = await model.request(HELLO)
    assert (reply.finish_reason, reply.text) == ("refusal", "I won't do that.")


@pytest.mark.parametrize(
    ("reply", "error", "retry_after"),
    [
        (FakeAnthropicServer.rate_limited(retry_after=7), ms.RateLimited, 7.0),
        (FakeAnthropicServer.overloaded(), ms.Overloaded, None),
        (FakeAnthropicServer.server_error(500), ms.TransientError, None),
        (FakeAnthropicServer.server_error(503), ms.TransientError, None),
        (FakeAnthropicServer.error(403, "not allowed"), ms.PermissionDenied, None),
        (FakeAnthropicServer.context_overflow(), ms.ContextOverflow, None),
        (FakeAnthropicServer.quota_exhausted(), ms.QuotaExhausted, None),
        (FakeAnthropicServer.error(402, "payment required"), ms.QuotaExhausted, None),
        (FakeAnthropicServer.error(400, "max_tokens: must be positive"), ms.ConfigError, None),
        (FakeAnthropicServer.error(404, "model: claude-9"), ms.ConfigError, None),
    ],
)
async def test_errors_map_into_the_tree(
    server: FakeAnthropicServer,
    model: AnthropicModel,
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
    assert isinstance(caught.value.__cause__, anthropic.APIStatusError)
    assert len(server.requests) == 1  # the SDK did not retry behind the runtime's back


async def test_error_message_carries_the_provider_message(
    server: FakeAnthropicServer, model: AnthropicModel
) -> None:
    server.script([server.overloaded()])
    with pytest.raises(ms.TransientError) as caught:
        await model.request(HELLO)
    assert str(caught.value).startswith("anthropic:claude-sonnet-5@http://127.0.0.1:")
    assert "HTTP 529 overloaded_error: 'Overloaded'" in str(caught.value)


async def test_wrong_api_key_is_permission_denied(server: FakeAnthropicServer) -> None:
    async with AnthropicModel("claude-sonnet-5", base_url=server.base_url, api_key="no") as bad:
        with pytest.raises(ms.PermissionDenied, match="authentication_error"):
            await bad.request(HELLO)


async def test_a_hung_server_is_a_transient_timeout(server: FakeAnthropicServer) -> None:
    server.script([server.text("too late", delay_s=3)])
    async with AnthropicModel(
        "claude-sonnet-5", base_url=server.base_url, api_key=KEY, timeout_s=0.2
    ) as slow:
        with pytest.raises(ms.TransientError, match=r"timed out after 0\.2s") as caught:
            await slow.request(HELLO)
    assert caught.value.retryable
    assert len(server.requests) == 1


async def test_a_given_client_gets_its_retries_turned_off(server: FakeAnthropicServer) -> None:
    client = anthropic.AsyncAnthropic(api_key=KEY, base_url=server.base_url, max_retries=4)
    server.script([server.overloaded()])
    model = AnthropicModel("claude-sonnet-5", client=client)
    with pytest.raises(ms.TransientError):
        await model.request(HELLO)
    assert len(server.requests) == 1
    await client.close()


async def test_bad_construction_is_a_config_error() -> None:
    with pytest.raises(ms.ConfigError, match="model id"):
        AnthropicModel(" ")
    with pytest.raises(ms.ConfigError, match="max_tokens"):
        AnthropicModel("claude-sonnet-5", max_tokens=0)


async def test_a_local_base_url_needs_no_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # As OpenAIModel does: a local server or a keyless gateway gets a placeholder key.
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with FakeAnthropicServer() as local:  # checks no key
        local.script([local.text("hello")])
        async with AnthropicModel("local-model", base_url=local.base_url) as model:
            reply = await model.request([UserMessage(content="hi")])
        assert reply.text == "hello"
        sent = local.requests[0].headers
        assert "not-needed" in (sent.get("x-api-key"), sent.get("authorization", "")[7:])
