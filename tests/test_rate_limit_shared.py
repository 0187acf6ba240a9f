"""Agents against enforcing fake providers whose limits nobody declared: an account
shared with an outside consumer, and Anthropic's ITPM/OTPM with cache reads, learned
from the headers alone. Real clock, short "minutes", one in-process worker."""

from __future__ import annotations

import asyncio
import json
import re
import zlib
from typing import Any

from _helpers import drain

import mainspring as ms
from mainspring.limits import RateLimits
from mainspring.models import AnthropicModel, ModelSettings, OpenAIModel, Usage
from mainspring.testing import FakeAnthropicServer, FakeOpenAIServer, FakeReply, RecordedRequest

RUNS, TURNS = 8, 3
TASK = "Work through the batch of records: " + "alpha bravo charlie delta " * 60


def _key(request: RecordedRequest) -> tuple[str, int]:
    """Which run and which turn a request is (a retry has the same key)."""
    body: Any = request.body
    messages = body["messages"]
    text = json.dumps(messages)
    task = re.search(r"records: [a-z ]*#(\d+)", text)
    assert task is not None, text[:300]
    done = sum(
        1
        for m in messages
        if m["role"] == "tool"
        or (isinstance(m.get("content"), list) and m["content"][0].get("type") == "tool_result")
    )
    return task.group(1), done


def _reply(server: type[FakeOpenAIServer] | type[FakeAnthropicServer], usage: Any = None) -> Any:
    def answer(request: RecordedRequest) -> FakeReply:
        _, done = _key(request)
        seed = zlib.crc32(json.dumps(request.body).encode())
        text = "noted " * (20 + seed % 60)
        reply_usage = usage(request) if usage is not None else None
        if done < TURNS - 1:
            return server.tool_call("note", {"n": done}, text=text, usage=reply_usage)
        return server.tool_call("finish", {"answer": "done"}, text=text, usage=reply_usage)

    return answer


async def _run_all(app: ms.App, agent: Any) -> list[ms.RunRecord]:
    handles = [app.submit(agent, f"{TASK} #{i}") for i in range(RUNS)]
    for _ in range(600):
        await drain(app)
        runs = [app.get_run(h.run_id) for h in handles]
        if all(r.status in ("succeeded", "failed", "cancelled") for r in runs):
            return runs
        await asyncio.sleep(0.05)
    raise AssertionError("the runs did not finish")


def _app(tmp_path: Any, period: float) -> ms.App:
    return ms.App(
        f"sqlite:///{tmp_path / 'shared.db'}",
        poll_interval_s=0.01,
        inline_wait_s=0.2,
        # Nothing declared: only the length of the fakes' "minute".
        rate_limits=RateLimits(period_s=period, headroom=0.05),
    )


async def test_an_account_shared_with_an_outside_consumer(tmp_path: Any) -> None:
    """Another client takes 30 % of the refill at random moments: every run
    succeeds, 429s stay few, and every refused request waits at least what the
    refusal's headers asked before it goes again."""
    period, tpm = 1.0, 12_000
    with FakeOpenAIServer(
        fallback=_reply(FakeOpenAIServer), tpm=tpm, period_s=period, outside_share=0.3
    ) as server:
        app = _app(tmp_path, period)

        @app.tool
        def note(n: int) -> str:
            """Record step n."""
            return f"step {n} recorded"

        model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="sk-test")
        agent = app.agent(
            "shared",
            model=model,
            instructions="Call note for each step, then finish.",
            tools=[note],
            settings=ModelSettings(max_tokens=200),
        )
        try:
            runs = await _run_all(app, agent)
        finally:
            await model.aclose()
            app.close()
        assert [r.status for r in runs] == ["succeeded"] * RUNS
        assert len(server.served_usage) == RUNS * TURNS
        assert server.outside_used["tpm"] > 0
        # Bounded: paced, not hammering (5 to 7 refusals in 24 calls measured; the old
        # limiter, blind to the other client, drew a storm and failed runs).
        assert len(server.refusals) <= RUNS * TURNS
        requests = list(server.requests)
        for at, retry_after, index in server.refusals:
            key = _key(requests[index])
            retry = next(r for r in requests[index + 1 :] if _key(r) == key)
            assert retry.at >= at + retry_after - 0.01, (
                at,
                retry_after,
                retry.at,
                index,
                [(r.at, _key(r)) for r in requests[index - 3 : index + 6]],
                key,
            )


async def test_anthropic_itpm_and_otpm_with_cache_reads_learned_from_headers(
    tmp_path: Any,
) -> None:
    """Anthropic counts cache reads toward no input limit: the limiter learns ITPM and
    OTPM from the headers of a probe, then paces both, with no 429 after it."""
    period, itpm, otpm = 1.0, 12_000, 3_000

    def usage(request: RecordedRequest) -> Usage:
        prompt = FakeAnthropicServer().estimate_input_tokens(request.body)
        cached = prompt * 3 // 4  # most of the prompt is a cached prefix
        return Usage(input_tokens=prompt, cache_read_tokens=cached, output_tokens=150)

    with FakeAnthropicServer(
        fallback=_reply(FakeAnthropicServer, usage), itpm=itpm, otpm=otpm, period_s=period
    ) as server:
        app = _app(tmp_path, period)

        @app.tool
        def note(n: int) -> str:
            """Record step n."""
            return f"step {n} recorded"

        model = AnthropicModel(
            "claude-sonnet-4-5", base_url=server.base_url, api_key="k", max_tokens=200
        )
        agent = app.agent(
            "cached",
            model=model,
            instructions="Call note for each step, then finish.",
            tools=[note],
        )
        try:
            runs = await _run_all(app, agent)
            limits = app.rate_limits
            assert limits is not None
            limiter = limits.limiter(app.store, app.clock, "anthropic", "claude-sonnet-4-5")
            learned = limiter.table.limits(limiter.rate)
        finally:
            await model.aclose()
            app.close()
        assert [r.status for r in runs] == ["succeeded"] * RUNS
        assert (learned["itpm"], learned["otpm"]) == (itpm, otpm)
        first = server.served_usage[0][0]
        assert [t for t, _, _ in server.refusals if t > first] == []
        # Three quarters of every prompt were cache reads, which no input limit counts:
        # the limiter settled each call by its uncached part only.
        served_in = sum(i for _, i, _ in server.served_usage)
        assert served_in > 2 * itpm  # far more prompt than one ITPM bucket, no 429


async def test_a_limit_lowered_mid_run_is_followed(tmp_path: Any) -> None:
    """The account's tier drops to half mid-run: the next replies' headers say so, the
    limiter paces at the new limit, and every run succeeds."""
    period, tpm = 1.0, 16_000
    answer = _reply(FakeOpenAIServer)
    lowered: list[float] = []

    def reply(request: RecordedRequest) -> FakeReply:
        if len(server.requests) == RUNS * TURNS // 3 and not lowered:
            assert server.buckets is not None
            server.buckets.set_limit("tpm", tpm / 2)  # a tier change
            lowered.append(server.now())
        result: FakeReply = answer(request)
        return result

    with FakeOpenAIServer(fallback=reply, tpm=tpm, period_s=period) as server:
        app = _app(tmp_path, period)

        @app.tool
        def note(n: int) -> str:
            """Record step n."""
            return f"step {n} recorded"

        model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="sk-test")
        agent = app.agent(
            "lowered",
            model=model,
            instructions="Call note for each step, then finish.",
            tools=[note],
            settings=ModelSettings(max_tokens=200),
        )
        try:
            runs = await _run_all(app, agent)
            limits = app.rate_limits
            assert limits is not None
            limiter = limits.limiter(app.store, app.clock, "openai", "gpt-4.1-mini")
            learned = limiter.table.limits(limiter.rate)
        finally:
            await model.aclose()
            app.close()
        assert [r.status for r in runs] == ["succeeded"] * RUNS
        assert lowered and learned["tpm"] == tpm / 2
        # Requests booked at the old pace may meet the lower limit; after that the
        # limiter follows it (measured: 0 or 1 refusal).
        assert len([t for t, _, _ in server.refusals if t > lowered[0]]) <= RUNS
