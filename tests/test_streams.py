"""Live token streams: a model step's text reaches SSE clients and ``app.stream``
while the call is in flight, batched in the store, never journaled token by token;
a reconnect resumes the text exactly; a crash mid-stream ends that stream with an
``interrupted`` marker and the retried call's stream follows."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from _helpers import Crash, drain, uvicorn_serving

import mainspring as ms
from mainspring.models import ScriptedModel, ToolSpec, UserMessage
from mainspring.testing import FakeAnthropicServer, FakeOpenAIServer

TEXT = "The quick brown fox jumps over the lazy dog, and then it streams home."


def _answer_workflow(app: ms.App, model: ms.models.Model) -> Any:
    @app.workflow(name="answer")
    async def answer(ctx: ms.RunContext, question: str) -> str:
        reply = await app.call_model(ctx, model, [UserMessage(content=question)])
        return reply.text or ""

    return answer


# -- the store -------------------------------------------------------------------------------


def test_the_store_keeps_batches_in_order_and_prunes_them(db_url: str) -> None:
    app = ms.App(db_url)
    try:
        store = app.store
        store.append_tokens("r1", 0, 2, 1, 0, "Hel", 10.0)
        store.append_tokens("r2", 0, 0, 1, 0, "other", 10.0)
        store.append_tokens("r1", 0, 2, 1, 1, "lo", 20.0, end="done")
        rows = store.tokens_after("r1")
        assert [(r.idx, r.text, r.end) for r in rows] == [(0, "Hel", None), (1, "lo", "done")]
        assert [r.text for r in store.tokens_after("r1", rows[0].id)] == ["lo"]
        with pytest.raises(ValueError, match="'done' or 'failed'"):
            store.append_tokens("r1", 0, 2, 1, 2, "", 20.0, end="finished")
        assert store.prune_tokens(15.0) == 2
        assert [r.text for r in store.tokens_after("r1")] == ["lo"]
    finally:
        app.close()


# -- the Python API, live ---------------------------------------------------------------------


async def test_async_for_sees_the_text_while_the_call_is_in_flight(db_url: str) -> None:
    half, resume = asyncio.Event(), asyncio.Event()

    async def pause(index: int, piece: str) -> None:
        if index == 6:
            half.set()
            await resume.wait()

    app = ms.App(db_url, poll_interval_s=0.01)
    model = ScriptedModel([TEXT], chunk_size=5, on_chunk=pause)
    answer = _answer_workflow(app, model)
    try:
        handle = app.submit(answer, "go")
        worker = asyncio.create_task(drain(app))
        seen: list[ms.TokenEvent] = []

        async def follow() -> None:
            async for event in app.stream(handle.run_id, poll_s=0.02):
                seen.append(event)

        follower = asyncio.create_task(follow())
        await asyncio.wait_for(half.wait(), 30)
        # Mid-call: the first six pieces reach the reader before the reply exists.
        await _until(lambda: "".join(e.text for e in seen) == TEXT[:30])
        assert app.get_run(handle.run_id).status == "running"
        resume.set()
        await asyncio.wait_for(worker, 30)
        await asyncio.wait_for(follower, 30)
        assert "".join(e.text for e in seen) == TEXT
        assert seen[-1].end == "done" and all(e.end is None for e in seen[:-1])
        assert await handle.result() == TEXT
        # The journal keeps the reply once; the pieces live only in the stream table.
        [step] = app.steps(handle.run_id)
        assert step.role == "model" and json.loads(step.output or "{}")
        assert TEXT in (step.output or "") and (step.output or "").count(TEXT) == 1
        batches = app.store.tokens_after(handle.run_id)
        assert 1 < len(batches) < len(TEXT) // 5 + 2  # batched, never one row per piece
    finally:
        app.close()


async def test_a_crash_mid_stream_marks_it_interrupted_and_the_retry_streams_anew(
    db_url: str,
) -> None:
    clock = ms.FakeClock()
    crashed: list[int] = []

    async def crash_once(index: int, piece: str) -> None:
        if index == 2 and not crashed:
            crashed.append(index)
            await asyncio.sleep(0.3)  # the writer flushed what came: a crash leaves it
            raise Crash

    app = ms.App(db_url, clock=clock, poll_interval_s=0.01)
    model = ScriptedModel([TEXT, TEXT], chunk_size=5, on_chunk=crash_once)
    answer = _answer_workflow(app, model)
    try:
        handle = app.submit(answer, "go")
        await drain(app)
        assert app.get_run(handle.run_id).status == "running"  # died holding its lease
        clock.advance(app.lease_s + 1)
        await drain(app)
        assert await handle.result() == TEXT
        events = [e async for e in app.stream(handle.run_id, poll_s=0.01)]
        first = [e for e in events if e.attempt == 1]
        second = [e for e in events if e.attempt == 2]
        assert "".join(e.text for e in first) == TEXT[:10]
        assert first[-1].end == "interrupted"
        assert "".join(e.text for e in second) == TEXT and second[-1].end == "done"
        assert events.index(first[-1]) < events.index(second[0])  # the retry follows
    finally:
        app.close()


async def _until(check: Any, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.02)


# -- SSE over real HTTP --------------------------------------------------------------------------


@pytest.fixture
def served(tmp_path: Any, db_url: str) -> Iterator[tuple[str, str, str]]:
    """The HTTP API of an App on ``db_url`` under uvicorn on 127.0.0.1 (its own thread
    and App, as a server process would be): (base url, admin key, db url)."""
    app = ms.App(db_url)
    key = app.create_key("ops", ["admin"])[1]
    try:
        with uvicorn_serving(app) as base:
            yield base, key, db_url
    finally:
        app.close()


async def _sse(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    current: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if line == "":
            if "event" in current:
                current["data"] = json.loads(current["data"])
                yield current
            current = {}
        elif not line.startswith(":") and ":" in line:
            field, _, value = line.partition(":")
            current[field] = value.removeprefix(" ")


async def test_an_sse_client_reconnects_mid_stream_and_reassembles_the_exact_text(
    served: tuple[str, str, str],
) -> None:
    base, key, db_url = served
    half, resume = asyncio.Event(), asyncio.Event()

    async def pause(index: int, piece: str) -> None:
        if index == 5:
            half.set()
            await resume.wait()

    app = ms.App(db_url, poll_interval_s=0.01)  # the worker's, apart from the server's
    answer = _answer_workflow(app, ScriptedModel([TEXT], chunk_size=5, on_chunk=pause))
    headers = {"Authorization": f"Bearer {key}"}
    try:
        handle = app.submit(answer, "go")
        worker = asyncio.create_task(drain(app))
        await asyncio.wait_for(half.wait(), 30)
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
            before: list[dict[str, Any]] = []
            async with client.stream("GET", f"/runs/{handle.run_id}/events") as response:
                assert response.status_code == 200
                async for event in _sse(response):
                    if event["event"] == "tokens":
                        before.append(event)
                        if "".join(e["data"].get("text", "") for e in before) == TEXT[:25]:
                            break  # the client drops mid-stream
            last_id = before[-1]["id"]
            resume.set()
            after: list[dict[str, Any]] = []
            reconnect = {"Last-Event-ID": last_id}
            async with client.stream(
                "GET", f"/runs/{handle.run_id}/events", headers=reconnect
            ) as response:
                async for event in _sse(response):
                    after.append(event)
                    if event["event"] == "end":
                        break
        await asyncio.wait_for(worker, 30)
        tokens = before + [e for e in after if e["event"] == "tokens"]
        text = "".join(e["data"].get("text", "") for e in tokens)
        assert text == TEXT  # nothing repeated, nothing lost
        assert tokens[-1]["data"] == {
            "type": "tokens",
            "session": 0,
            "seq": 0,
            "attempt": 1,
            "end": "done",
        }
        steps = [e["data"] for e in after if e["event"] == "step"]
        done = [s for s in steps if s["status"] == "completed"]
        assert done and done[-1]["output"]["text"] == TEXT
        # The last tokens come before the step that holds the reply.
        assert after.index(next(e for e in after if e["data"].get("end") == "done")) < after.index(
            next(e for e in after if e["event"] == "step" and e["data"]["status"] == "completed")
        )
    finally:
        app.close()


# -- the provider adapters --------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_streamed_reply_is_the_reply_of_a_plain_request(provider: str) -> None:
    pytest.importorskip(provider)
    server_cls = FakeOpenAIServer if provider == "openai" else FakeAnthropicServer
    model_cls = ms.models.OpenAIModel if provider == "openai" else ms.models.AnthropicModel
    tools = [ToolSpec(name="add", description="Add.", parameters={"type": "object"})]
    replies: dict[bool, list[ms.models.ModelResponse]] = {}
    pieces: list[str] = []
    for stream in (False, True):
        with server_cls() as server:
            server.script(
                [
                    server.text(TEXT),
                    server.tool_call("add", {"a": 1, "b": [2, 3]}, text="Adding."),
                    server.tool_calls(("add", {"a": 1}), ("add", {"b": 2})),
                ]
            )
            model = model_cls("m", base_url=server.base_url, api_key="k", stream=stream)
            got = []
            for _ in range(3):
                messages = [UserMessage(content="hi")]
                if stream:
                    got.append(await model.stream(messages, tools=tools, on_text=pieces.append))
                else:
                    got.append(await model.request(messages, tools=tools))
            await model.aclose()
            if stream:
                assert all(b.get("stream") is True for b in server.bodies)
        assert all(r.rate_limit for r in got)  # the headers of the streamed reply too
        # (Anthropic's reset stamps are the time of the reply: not compared.)
        replies[stream] = [dataclasses.replace(r, latency_s=0.0, rate_limit={}) for r in got]
    assert replies[True] == replies[False]
    assert replies[True][1].tool_calls[0].arguments == json.dumps({"a": 1, "b": [2, 3]})
    assert "".join(pieces) == TEXT + "Adding." and len(pieces) > 3  # in pieces, live


# -- the dashboard ------------------------------------------------------------------------------


def test_the_run_page_of_a_running_run_has_a_live_answer_region(
    served: tuple[str, str, str],
) -> None:
    base, key, db_url = served
    app = ms.App(db_url)
    answer = _answer_workflow(app, ScriptedModel([TEXT], chunk_size=5))
    try:
        queued = app.submit(answer, "go").run_id
        with httpx.Client(base_url=base, headers={"Origin": base}, timeout=30) as browser:
            login = browser.post("/ui/login", data={"key": key})
            assert login.status_code in (200, 303), login.text
            page = browser.get(f"/ui/runs/{queued}")
            assert page.status_code == 200, page.text
            html = page.text
        # A region that assistive technology reads as it changes, fed by tokens events
        # as text (textContent, never HTML).
        assert '<pre id="answer" aria-live="polite"></pre>' in html
        assert 'events.addEventListener("tokens"' in html
        assert (
            "answer.textContent += t.text" in html
            and "innerHTML" not in html.split('addEventListener("tokens"')[1]
        )
    finally:
        app.close()


# -- an agent over the wire ----------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_an_agent_streams_its_turns_over_the_wire_and_journals_only_replies(
    app: ms.App, provider: str
) -> None:
    pytest.importorskip(provider)
    server_cls = FakeOpenAIServer if provider == "openai" else FakeAnthropicServer
    model_cls = ms.models.OpenAIModel if provider == "openai" else ms.models.AnthropicModel

    @app.tool
    def weather(city: str) -> str:
        """Today's weather.

        Args:
            city: the city.
        """
        return f"clear in {city}"

    with server_cls() as server:
        server.script(
            [
                server.tool_call("weather", {"city": "Lyon"}, text="Let me look."),
                server.text(TEXT),
            ]
        )
        model = model_cls("m", base_url=server.base_url, api_key="k", stream=True)
        agent = app.agent("w", model=model, instructions="Answer.", tools=[weather])
        result = await app.run(agent, "Weather in Lyon?")
        await model.aclose()
        assert all(b.get("stream") is True for b in server.bodies)
    assert (result.status, result.answer) == ("done", TEXT)
    run_id = app.list_runs()[0].id
    events = [e async for e in app.stream(run_id, poll_s=0.01)]
    streams = {(e.session, e.seq) for e in events}
    assert len(streams) == 2  # one per model turn
    assert "".join(e.text for e in events) == "Let me look." + TEXT
    assert [e.end for e in events if e.end] == ["done", "done"]
    models = [s for s in app.steps(run_id) if s.role == "model"]
    assert [(s.session, s.seq) for s in models] == sorted(streams)
    assert TEXT in (models[-1].output or "") and '"weather"' in (models[0].output or "")


def test_a_reader_resuming_between_two_attempts_still_marks_the_first_interrupted(
    db_url: str,
) -> None:
    app = ms.App(db_url)
    try:
        store = app.store
        store.append_tokens("r", 0, 4, 1, 0, "The qu", 1.0)  # attempt 1, then its worker died
        [seen] = app.follow_tokens("r").poll()
        assert (seen.text, seen.end) == ("The qu", None)
        store.append_tokens("r", 0, 4, 2, 0, "The quick", 2.0)  # the retry streams anew
        store.append_tokens("r", 0, 4, 2, 1, "", 3.0, end="done")
        # A reader that reconnects after the first batch knows attempt 1 was still open.
        resumed = app.follow_tokens("r", after=seen.cursor).poll()
        assert [(e.attempt, e.text, e.end) for e in resumed] == [
            (1, "", "interrupted"),
            (2, "The quick", None),
            (2, "", "done"),
        ]
        assert resumed[0].to_json() == {
            "type": "tokens",
            "session": 0,
            "seq": 4,
            "attempt": 1,
            "end": "interrupted",
        }
        # A stream a failed attempt ended says so itself; one left open when the run
        # ended is closed by the reader.
        store.append_tokens("r", 0, 5, 1, 0, "Hal", 4.0, end="failed")
        store.append_tokens("r", 0, 6, 1, 0, "Open", 5.0)
        follower = app.follow_tokens("r", after=resumed[-1].cursor)
        tail = follower.poll() + follower.close_open()
        assert [(e.seq, e.text, e.end) for e in tail] == [
            (5, "Hal", None),
            (5, "", "interrupted"),
            (6, "Open", None),
            (6, "", "interrupted"),
        ]
    finally:
        app.close()


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_provider_stream_that_breaks_off_is_retried_and_streams_anew(
    app: ms.App, provider: str
) -> None:
    pytest.importorskip(provider)
    server_cls = FakeOpenAIServer if provider == "openai" else FakeAnthropicServer
    model_cls = ms.models.OpenAIModel if provider == "openai" else ms.models.AnthropicModel
    with server_cls() as server:
        server.script([server.text(TEXT), server.text(TEXT)])
        server.stream_cut_after = 6  # the first reply's connection drops mid-text
        model = model_cls("m", base_url=server.base_url, api_key="k", stream=True)
        retry = ms.RetryPolicy(max_attempts=3, initial_s=0.01, max_s=0.01)
        agent = app.agent("w", model=model, instructions="Answer.", model_retry=retry)
        result = await app.run(agent, "Go")
        await model.aclose()
    assert (result.status, result.answer) == ("done", TEXT)
    run_id = app.list_runs()[0].id
    events = [e async for e in app.stream(run_id, poll_s=0.01)]
    first = [e for e in events if e.attempt == 1]
    assert first and first[-1].end == "interrupted"
    assert TEXT.startswith("".join(e.text for e in first)) and len(first) > 1
    second = [e for e in events if e.attempt == 2]
    assert "".join(e.text for e in second) == TEXT and second[-1].end == "done"
    [model_step] = [s for s in app.steps(run_id) if s.role == "model"]
    assert (model_step.status, model_step.attempt) == ("completed", 2)
    # The drop was a transient error of attempt 1 (the SDK says "connection error" or
    # the adapter "the stream broke off"), retried as such.
    assert "TransientError" in (model_step.error or "")
