"""The fake provider servers enforce RPM/TPM/ITPM/OTPM with refilled token buckets and
answer the providers' real 429s (driven by a test clock, never the wall clock)."""

from __future__ import annotations

import pytest

import mainspring as ms
from mainspring.models import AnthropicModel, OpenAIModel, Usage, UserMessage
from mainspring.testing import FakeAnthropicServer, FakeOpenAIServer
from mainspring.testing._fake_limits import format_duration


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


HELLO = [UserMessage(content="hello")]


async def test_openai_tpm_is_enforced_with_the_real_429() -> None:
    clock = Clock()
    usage = Usage(input_tokens=400, output_tokens=100)
    with FakeOpenAIServer(tpm=1000, rpm=100, period_s=60, clock=clock) as server:
        server.script([server.text(f"r{i}", usage=usage) for i in range(3)])
        model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="sk-test")
        first = await model.request(HELLO)
        assert first.rate_limit["x-ratelimit-limit-tokens"] == "1000"
        assert first.rate_limit["x-ratelimit-remaining-tokens"] == "500"
        await model.request(HELLO)
        with pytest.raises(ms.RateLimited) as err:
            await model.request(HELLO)
        assert err.value.retry_after == pytest.approx(24.0)  # 400 tokens at 1000/min
        assert err.value.headers["x-ratelimit-remaining-tokens"] == "0"
        assert err.value.headers["retry-after"] == "24"
        assert (
            "Rate limit reached for gpt-4.1-mini in organization org-fake on tokens per min "
            "(TPM): Limit 1000, Used 1000, Requested 400. Please try again in 24s."
        ) in str(err.value)
        assert server.too_many_requests == 1
        clock.t += 24
        third = await model.request(HELLO)  # the refused reply was kept for the retry
        assert third.text == "r2"
        assert [u[1:] for u in server.served_usage] == [(400, 100)] * 3
        await model.aclose()


async def test_openai_rpm_and_oversized_requests() -> None:
    clock = Clock()
    with FakeOpenAIServer(tpm=1000, rpm=2, period_s=60, clock=clock) as server:
        server.script([server.text("a", usage=Usage(input_tokens=1500))])
        model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="sk-test")
        with pytest.raises(ms.RateLimited, match=r"Request too large for gpt-4\.1-mini"):
            await model.request(HELLO)
        server.reset()
        server.script([server.text("a", usage=Usage(input_tokens=1)) for _ in range(3)])
        await model.request(HELLO)
        await model.request(HELLO)
        with pytest.raises(ms.RateLimited, match=r"requests per min \(RPM\): Limit 2"):
            await model.request(HELLO)
        await model.aclose()


async def test_anthropic_itpm_ignores_cache_reads_and_otpm_is_paid_after() -> None:
    clock = Clock()
    with FakeAnthropicServer(itpm=1000, otpm=300, period_s=60, clock=clock) as server:
        cached = Usage(input_tokens=900, cache_read_tokens=800, output_tokens=400)
        server.script([server.text("a", usage=cached), server.text("b", usage=cached)])
        model = AnthropicModel("claude-sonnet-5", base_url=server.base_url, api_key="k")
        reply = await model.request(HELLO)
        assert reply.rate_limit["anthropic-ratelimit-input-tokens-remaining"] == "900"
        assert reply.rate_limit["anthropic-ratelimit-output-tokens-remaining"] == "0"
        with pytest.raises(ms.RateLimited) as err:  # OTPM is 100 tokens in debt
            await model.request(HELLO)
        assert "of 300 output tokens per minute" in str(err.value)
        assert err.value.headers["retry-after"] == "20"
        assert err.value.retry_after == 20
        clock.t += 20.5
        assert (await model.request(HELLO)).text == "b"
        assert server.too_many_requests == 1
        await model.aclose()


def test_durations_are_written_like_openai() -> None:
    assert [format_duration(s) for s in (0.02, 1.5, 360, 61.25)] == [
        "20ms",
        "1.5s",
        "6m0s",
        "1m1.25s",
    ]


_DURATION = r"(\d+ms|\d+(\.\d+)?s|\d+m\d+(\.\d+)?s)"
_RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


async def test_limits_are_announced_only_in_the_openai_headers() -> None:
    """What a client that declares nothing learns from: OpenAI's six headers on every
    reply, durations as OpenAI writes them, and retry-after(-ms) on a 429 only."""
    import re

    clock = Clock()
    with FakeOpenAIServer(tpm=1000, rpm=10, period_s=60, clock=clock) as server:
        usage = Usage(input_tokens=600, output_tokens=0)
        server.script([server.text("a", usage=usage), server.text("b", usage=usage)])
        model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="sk-test")
        first = await model.request(HELLO)
        assert set(first.rate_limit) == {
            f"x-ratelimit-{what}-{dim}"
            for what in ("limit", "remaining", "reset")
            for dim in ("requests", "tokens")
        }
        assert first.rate_limit["x-ratelimit-limit-requests"] == "10"
        assert first.rate_limit["x-ratelimit-remaining-requests"] == "9"
        assert first.rate_limit["x-ratelimit-reset-tokens"] == "36s"  # 600 of 1000/min
        for dim in ("requests", "tokens"):
            assert re.fullmatch(_DURATION, first.rate_limit[f"x-ratelimit-reset-{dim}"])
        with pytest.raises(ms.RateLimited) as err:
            await model.request(HELLO)
        assert err.value.headers["retry-after-ms"] == "12000"
        assert err.value.headers["retry-after"] == "12"
        assert err.value.headers["x-ratelimit-remaining-tokens"] == "400"
        assert server.refusals == [(1000.0, pytest.approx(12.0), 1)]
        await model.aclose()


async def test_limits_are_announced_only_in_the_anthropic_headers() -> None:
    import re

    clock = Clock()
    with FakeAnthropicServer(
        rpm=50, itpm=1000, otpm=400, tpm=1400, period_s=60, clock=clock
    ) as server:
        server.script([server.text("a", usage=Usage(input_tokens=100, output_tokens=40))])
        model = AnthropicModel("claude-sonnet-5", base_url=server.base_url, api_key="k")
        reply = await model.request(HELLO)
        words = ("requests", "tokens", "input-tokens", "output-tokens")
        assert set(reply.rate_limit) == {
            f"anthropic-ratelimit-{w}-{what}"
            for w in words
            for what in ("limit", "remaining", "reset")
        }
        assert reply.rate_limit["anthropic-ratelimit-input-tokens-remaining"] == "900"
        assert reply.rate_limit["anthropic-ratelimit-output-tokens-remaining"] == "360"
        for w in words:
            assert re.fullmatch(_RFC3339, reply.rate_limit[f"anthropic-ratelimit-{w}-reset"])
        await model.aclose()


async def test_an_outside_consumer_drains_the_same_bucket() -> None:
    import asyncio

    with FakeOpenAIServer(tpm=10_000, period_s=5, outside_share=0.9, outside_seed=3) as server:
        for _ in range(200):
            if server.outside_used.get("tpm", 0) > 0:
                break
            await asyncio.sleep(0.02)
        assert server.outside_used["tpm"] > 0
        server.script([server.text("a", usage=Usage(input_tokens=1))])
        model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="sk-test")
        reply = await model.request(HELLO)
        # What the outside consumer took shows in the headers our client reads.
        assert int(reply.rate_limit["x-ratelimit-remaining-tokens"]) < 10_000 - 100
        await model.aclose()


def test_a_limit_lowered_mid_run_keeps_what_was_used() -> None:
    from mainspring.testing._fake_limits import TokenBuckets

    clock = Clock()
    buckets = TokenBuckets({"tpm": 1000}, period_s=60, clock=clock)
    assert buckets.admit({"tpm": 300}) is None
    buckets.set_limit("tpm", 500)
    assert buckets.state()["tpm"][:2] == (500, 200)
