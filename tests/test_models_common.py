"""Model specs, retry-after parsing and error mapping: no server, no event loop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime

import pytest

import mainspring as ms
from mainspring.models import Model, ScriptedModel, parse_model_spec, resolve_model
from mainspring.models._common import (
    LoopClients,
    parse_duration,
    rate_limit_headers,
    retry_after_from_headers,
)

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def test_specs_parse() -> None:
    assert parse_model_spec("openai:gpt-4.1-mini") == ("openai", "gpt-4.1-mini", None)
    assert parse_model_spec("anthropic:claude-sonnet-4-5") == (
        "anthropic",
        "claude-sonnet-4-5",
        None,
    )
    assert parse_model_spec("openai:llama3@http://127.0.0.1:11434/v1") == (
        "openai",
        "llama3",
        "http://127.0.0.1:11434/v1",
    )
    # A model id may hold "@" and ":" itself; the base URL starts at "@http".
    assert parse_model_spec("openai:qwen2.5:7b@2024@https://vllm.internal/v1") == (
        "openai",
        "qwen2.5:7b@2024",
        "https://vllm.internal/v1",
    )
    assert parse_model_spec(" OpenAI:gpt-4o ") == ("openai", "gpt-4o", None)


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("gpt-4.1-mini", "no provider prefix"),
        ("gemini:pro", "unknown provider 'gemini'"),
        ("openai:", "empty model id"),
        ("openai:@http://127.0.0.1:8000/v1", "empty model id"),
        ("openai:llama3@ftp://host/v1", "must start with http:// or https://"),
        ("openai:llama3@http://", "empty base URL"),
    ],
)
def test_bad_specs_are_clear_config_errors(spec: str, why: str) -> None:
    with pytest.raises(ms.ConfigError) as caught:
        resolve_model(spec)
    assert why in str(caught.value)
    assert repr(spec) in str(caught.value)
    assert "openai:MODEL@http://host:port/v1" in str(caught.value)


def test_a_model_resolves_to_itself_and_other_values_are_refused() -> None:
    model = ScriptedModel(["hi"])
    assert resolve_model(model) is model
    with pytest.raises(ms.ConfigError, match="a Model or a spec string"):
        resolve_model(42)  # type: ignore[arg-type]


def test_resolve_model_builds_the_adapters() -> None:
    pytest.importorskip("openai")
    pytest.importorskip("anthropic")
    from mainspring.models import AnthropicModel, OpenAIModel

    openai_model = resolve_model("openai:gpt-4.1-mini")
    assert isinstance(openai_model, OpenAIModel)
    assert (openai_model.name, openai_model.provider, openai_model.model_id) == (
        "openai:gpt-4.1-mini",
        "openai",
        "gpt-4.1-mini",
    )
    local = resolve_model("openai:llama3@http://127.0.0.1:11434/v1")
    assert isinstance(local, OpenAIModel)
    assert (local.model_id, local.base_url) == ("llama3", "http://127.0.0.1:11434/v1")
    assert local.name == "openai:llama3@http://127.0.0.1:11434/v1"
    claude = resolve_model("anthropic:claude-sonnet-4-5")
    assert isinstance(claude, AnthropicModel)
    assert (claude.name, claude.provider, claude.max_tokens) == (
        "anthropic:claude-sonnet-4-5",
        "anthropic",
        4096,
    )
    assert isinstance(claude, Model)


@pytest.mark.parametrize(("sdk", "extra"), [("openai", "openai"), ("anthropic", "anthropic")])
def test_a_missing_sdk_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, sdk: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, sdk, None)
    monkeypatch.delitem(sys.modules, f"mainspring.models.{sdk}", raising=False)
    with pytest.raises(ImportError, match=rf"pip install 'mainspring\[{extra}\]'"):
        resolve_model(f"{sdk}:some-model")


def test_importing_models_does_not_import_the_sdks() -> None:
    code = (
        "import sys, mainspring.models, mainspring.testing\n"
        "assert 'openai' not in sys.modules and 'anthropic' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_retry_after_headers() -> None:
    assert retry_after_from_headers({"retry-after": "2"}) == 2.0
    assert retry_after_from_headers({"Retry-After": "0.5"}) == 0.5
    assert retry_after_from_headers({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    http_date = "Thu, 01 Jan 2026 00:00:30 GMT"
    assert retry_after_from_headers({"retry-after": http_date}, now=NOW) == 30.0
    assert retry_after_from_headers({}) is None
    assert retry_after_from_headers({"retry-after": "soon"}) is None


def test_retry_after_from_rate_limit_resets() -> None:
    # OpenAI: the exhausted dimension's reset wins, even if another resets later.
    headers = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1.5s",
        "x-ratelimit-remaining-tokens": "1200",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    assert retry_after_from_headers(headers) == 1.5
    # Nothing says which is exhausted: the longest wait.
    assert retry_after_from_headers({"x-ratelimit-reset-tokens": "1m30s"}) == 90.0
    # Anthropic: RFC 3339 reset stamps.
    reset = datetime.fromtimestamp(NOW + 12, UTC).isoformat().replace("+00:00", "Z")
    headers = {
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": reset,
    }
    assert retry_after_from_headers(headers, now=NOW) == 12.0
    assert retry_after_from_headers(headers, now=NOW, resets=False) is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("7", 7.0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5 minutes", "1x"])
def test_parse_duration_refuses_what_is_not_one(text: str) -> None:
    assert parse_duration(text) is None


def test_rate_limit_headers_keeps_only_rate_limit_headers() -> None:
    headers = {
        "X-RateLimit-Remaining-Tokens": "5",
        "anthropic-ratelimit-requests-limit": "50",
        "Retry-After": "3",
        "content-type": "application/json",
        "x-request-id": "req_1",
    }
    assert rate_limit_headers(headers) == {
        "x-ratelimit-remaining-tokens": "5",
        "anthropic-ratelimit-requests-limit": "50",
        "retry-after": "3",
    }


def test_openai_status_mapping_edge_cases() -> None:
    pytest.importorskip("openai")
    from mainspring.models.openai import map_status_error

    assert isinstance(map_status_error(402, {"message": "pay"}, {}, model="m"), ms.QuotaExhausted)
    err = map_status_error(529, None, {"retry-after": "3"}, model="m")
    assert isinstance(err, ms.TransientError) and err.retry_after == 3.0
    # A 5xx does not borrow the rate-limit resets as its back-off.
    err = map_status_error(500, None, {"x-ratelimit-reset-tokens": "1s"}, model="m")
    assert isinstance(err, ms.TransientError) and err.retry_after is None
    assert isinstance(map_status_error(413, {"message": "big"}, {}, model="m"), ms.ContextOverflow)
    assert isinstance(map_status_error(408, None, {}, model="m"), ms.TransientError)
    # llama.cpp's words for a context overflow.
    err = map_status_error(
        400,
        {"error": {"type": "exceed_context_size_error", "message": "the request exceeds"}},
        {},
        model="m",
    )
    assert isinstance(err, ms.ContextOverflow)


def test_anthropic_status_mapping_edge_cases() -> None:
    pytest.importorskip("anthropic")
    from mainspring.models.anthropic import map_status_error

    def err(status: int, type_: str, message: str = "x") -> ms.MainspringError:
        body = {"type": "error", "error": {"type": type_, "message": message}}
        return map_status_error(status, body, {}, model="m")

    assert isinstance(err(402, "billing_error"), ms.QuotaExhausted)
    assert isinstance(err(403, "billing_error"), ms.QuotaExhausted)
    assert isinstance(err(403, "permission_error"), ms.PermissionDenied)
    assert isinstance(err(413, "request_too_large"), ms.ContextOverflow)
    assert isinstance(err(503, "api_error"), ms.TransientError)
    assert isinstance(err(504, "timeout_error"), ms.TransientError)
    assert isinstance(err(404, "not_found_error", "model: claude-9"), ms.ConfigError)
    assert "model: claude-9" in str(err(404, "not_found_error", "model: claude-9"))


def test_openai_itself_gets_max_completion_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openai")
    from mainspring.models import ModelSettings, UserMessage
    from mainspring.models.openai import OpenAIModel

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    settings = ModelSettings(max_tokens=100)
    messages = [UserMessage(content="hi")]
    # o-series models refuse max_tokens; compatible servers mostly know only max_tokens.
    official = OpenAIModel("o4-mini")._request_kwargs(messages, (), settings)
    assert official["max_completion_tokens"] == 100 and "max_tokens" not in official
    local = OpenAIModel("llama3", base_url="http://127.0.0.1:11434/v1")
    assert local._request_kwargs(messages, (), settings)["max_tokens"] == 100


def test_loop_clients_make_one_client_per_loop_and_forget_closed_loops() -> None:
    closed: list[object] = []

    async def close(client: object) -> None:
        closed.append(client)

    clients: LoopClients[object] = LoopClients(object, close)

    async def same_loop_twice() -> object:
        first = clients.get()
        assert clients.get() is first
        return first

    first = asyncio.run(same_loop_twice())
    second = asyncio.run(same_loop_twice())
    assert first is not second
    assert len(clients._clients) <= 1  # the first, closed loop's client was dropped

    async def get_and_close() -> object:
        client = clients.get()
        await clients.aclose()
        return client

    assert closed == [asyncio.run(get_and_close())]
