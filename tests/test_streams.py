"""Live token streams: a model step's text reaches SSE clients and ``app.stream``
while the call is in flight, batched in the store, never journaled token by token;
a reconnect resumes the text exactly; a crash mid-stream ends that stream with an
``interrupted`` marker and the retried call's stream follows; attempts are ordered by
(epoch, attempt), never by arrival. (Fencing with real processes and the PostgreSQL
race: test_streams_fencing.py; tool calls: test_streams_tools.py; redaction:
test_streams_redaction.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from _helpers import Crash, drain, uvicorn_serving

import mainspring as ms
from mainspring.models import ScriptedModel, ToolSpec, UserMessage
from mainspring.storage import TokenPiece
from mainspring.testing import FakeAnthropicServer, FakeOpenAIServer, assert_invariants

TEXT = "The quick brown fox jumps over the lazy dog, and then it streams home."


def _answer_workflow(app: ms.App, model: ms.models.Model) -> Any:
    @app.workflow(name="answer")
    async def answer(ctx: ms.RunContext, question: str) -> str:
        reply = await app.call_model(ctx, model, [UserMessage(content=question)])
        return reply.text or ""

    return answer


def running(store: ms.storage.Store, run_id: str, now: float = 1.0) -> int:
    """A run of its own, claimed: the epoch its stream rows are fenced by."""
    store.create_run(run_id=run_id, workflow="wf", input="{}", key=None, now=now)
    [run] = store.claim(
        worker="w", now=now, lease_s=15, limit=1, workflows=["wf"], max_recoveries=3
    )
    return int(run.epoch)


def put(
    store: ms.storage.Store,
    run_id: str,
    epoch: int,
    seq: int,
    attempt: int,
    idx: int,
    *pieces: Any,
    **kw: Any,
) -> None:
    """Append rows of one attempt: strings are text, (index, id, name, args) tool calls."""
    made = [
        TokenPiece(text=p)
        if isinstance(p, str)
        else TokenPiece(text=p[3], kind="tool_call", call_index=p[0], call_id=p[1], name=p[2])
        for p in pieces
    ]
    assert store.append_tokens(
        run_id,
        epoch=epoch,
        session=0,
        seq=seq,
        attempt=attempt,
        idx=idx,
        pieces=made,
        now=1.0,
        **kw,
    )


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
        # Mid-call: the first six pieces reach the reader before the reply exists (but
        # for the word they end in, which redaction holds back until it is whole).
        await _until(lambda: "".join(e.text for e in seen) == "The quick brown fox jumps ")
        assert app.get_run(handle.run_id).status == "running"
        resume.set()
        await asyncio.wait_for(worker, 30)
        await asyncio.wait_for(follower, 30)
        assert "".join(e.text for e in seen) == TEXT
        assert seen[-1].end == "done" and all(e.end is None for e in seen[:-1])
        assert await handle.result() == TEXT
        # The journal keeps the reply once; the pieces live only in the stream table.
        [step] = app.observe.steps(handle.run_id)
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
        assert (first[-1].end, first[-1].reason) == ("interrupted", "abandoned")
        assert "".join(e.text for e in second) == TEXT and second[-1].end == "done"
        assert events.index(first[-1]) < events.index(second[0])  # the retry follows
    finally:
        app.close()


def test_streams_written_before_schema_16_stay_readable_and_cursors_stay_valid(
    db_url: str, tmp_path: Any
) -> None:
    """Migration 16 gives the rows of an older database their id as their place: a
    reader's old cursor (``~t<id>``) resumes where it was, and new rows follow."""
    from mainspring.storage._migrations import MIGRATIONS

    sqlite = db_url.startswith("sqlite")
    if sqlite:
        ddl = {"float": "REAL", "autoid": "INTEGER PRIMARY KEY AUTOINCREMENT"}
        rowid = " WITHOUT ROWID"
    else:
        ddl = {
            "float": "DOUBLE PRECISION",
            "autoid": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        }
        rowid = ""
    statements = [
        statement
        for version in range(1, 15)  # the schema as it was before fenced streams
        for statement in MIGRATIONS[version].format(**ddl, without_rowid=rowid).split(";")
        if statement.strip()
    ]
    statements += [
        "CREATE TABLE ms_meta (key TEXT PRIMARY KEY, value TEXT)",
        "INSERT INTO ms_meta VALUES ('schema_version', '14')",
        "INSERT INTO ms_runs (id, workflow, status, input, epoch, created_at, updated_at)"
        " VALUES ('old', 'wf', 'running', '[]', 1, 1, 1)",
    ]
    statements += [
        "INSERT INTO ms_stream_chunks (run_id, session, seq, attempt, idx, text, end_reason,"
        f" created_at) VALUES ('old', 0, 2, 1, {i}, '{text}', NULL, 1)"
        for i, text in enumerate(["The quick ", "brown "])
    ]
    if sqlite:
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
        for statement in statements:
            conn.execute(statement)
        conn.close()
    else:
        psycopg = pytest.importorskip("psycopg")
        with psycopg.connect(db_url, autocommit=True) as pg_conn:
            for statement in statements:
                pg_conn.execute(statement)
    app = ms.App(db_url)  # migrates
    try:
        events = app.follow_tokens("old").poll()
        assert [(e.epoch, e.text) for e in events] == [(0, "The quick "), (0, "brown ")]
        put(app.store, "old", 1, 2, 2, 0, "The quick brown fox", end="done")  # its retry
        resumed = app.follow_tokens("old", after=events[0].cursor).poll()  # an old cursor
        assert [(e.attempt, e.text, e.end) for e in resumed] == [
            (1, "brown ", None),
            (1, "", "interrupted"),
            (2, "The quick brown fox", None),
            (2, "", "done"),
        ]
        assert int(resumed[-1].cursor) == int(events[-1].cursor) + 1  # places go on
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
    key = app.admin.create_key("ops", ["admin"])[1]
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
                        so_far = "".join(e["data"].get("text", "") for e in before)
                        if so_far == "The quick brown fox ":
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
            "epoch": 1,
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


async def test_a_failed_attempt_ends_interrupted_for_the_reason_failed_over_sse(
    served: tuple[str, str, str],
) -> None:
    """An attempt that failed (an HTTP 500) ends its stream ``interrupted`` with the
    reason ``failed`` (its text is void); the retry streams anew and ends ``done``."""
    pytest.importorskip("openai")
    base, key, db_url = served
    app = ms.App(db_url, poll_interval_s=0.01)
    try:
        with FakeOpenAIServer() as server:
            server.script([server.server_error(500), server.text(TEXT)])
            model = ms.models.OpenAIModel("m", base_url=server.base_url, api_key="k", stream=True)
            retry = ms.RetryPolicy(max_attempts=3, initial_s=0.01, max_s=0.01)
            agent = app.agent("w", model=model, instructions="Answer.", model_retry=retry)
            result = await app.run(agent, "Go")
            await model.aclose()
        assert result.answer == TEXT
        run_id = app.list_runs()[0].id
        headers = {"Authorization": f"Bearer {key}"}
        async with (
            httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client,
            client.stream("GET", f"/runs/{run_id}/events") as response,
        ):
            tokens = [e["data"] async for e in _sse(response) if e["event"] == "tokens"]
        assert [(t["attempt"], t.get("end"), t.get("reason")) for t in tokens if "end" in t] == [
            (1, "interrupted", "failed"),
            (2, "done", None),
        ]
        assert "".join(t.get("text", "") for t in tokens if t["attempt"] == 2) == TEXT
    finally:
        app.close()


async def test_two_model_calls_at_once_stream_side_by_side(db_url: str) -> None:
    """Two model calls of one run at once (asyncio.gather): both streams arrive whole,
    each in its own order, and each reader's text is its step's journaled reply."""
    texts = [TEXT, "Another answer, streamed beside the first one, piece by piece."]

    async def pace(index: int, piece: str) -> None:
        await asyncio.sleep(0.02)

    app = ms.App(db_url, poll_interval_s=0.01)
    models = [ScriptedModel([t], chunk_size=3, on_chunk=pace) for t in texts]

    @app.workflow(name="both")
    async def both(ctx: ms.RunContext) -> list[str]:
        replies = await asyncio.gather(
            *(app.call_model(ctx, m, [UserMessage(content="go")]) for m in models)
        )
        return [r.text or "" for r in replies]

    try:
        handle = app.submit(both)
        await drain(app)
        assert await handle.result() == texts
        rows = app.store.tokens_after(handle.run_id, limit=10_000)
        seqs = [r.seq for r in rows]
        assert seqs != sorted(seqs)  # the two streams' rows interleave
        events = [e async for e in app.stream(handle.run_id, poll_s=0.01)]
        steps = sorted(
            (s.seq, json.loads(s.output or "{}")["text"])
            for s in app.observe.steps(handle.run_id)
            if s.role == "model"
        )
        for seq, reply in steps:
            assert "".join(e.text for e in events if e.seq == seq) == reply
        assert sorted(reply for _, reply in steps) == sorted(texts)
        assert_invariants(app.store, run_ids=[handle.run_id])
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
        # Tool calls as they form, beside the text (text nodes only, too).
        assert '<div id="answer-calls"></div>' in html
        assert 'events.addEventListener("tool_call_delta"' in html
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
    models = [s for s in app.observe.steps(run_id) if s.role == "model"]
    assert [(s.session, s.seq) for s in models] == sorted(streams)
    assert TEXT in (models[-1].output or "") and '"weather"' in (models[0].output or "")


def test_a_reader_resuming_between_two_attempts_still_marks_the_first_interrupted(
    db_url: str,
) -> None:
    app = ms.App(db_url)
    try:
        store = app.store
        epoch = running(store, "r")
        put(store, "r", epoch, 4, 1, 0, "The qu")  # attempt 1, then its worker died
        [seen] = app.follow_tokens("r").poll()
        assert (seen.text, seen.end) == ("The qu", None)
        put(store, "r", epoch, 4, 2, 0, "The quick")  # the retry streams anew
        put(store, "r", epoch, 4, 2, 1, end="done")
        # A reader that reconnects after the first batch knows attempt 1 was still open.
        resumed = app.follow_tokens("r", after=seen.cursor).poll()
        assert [(e.attempt, e.text, e.end, e.reason) for e in resumed] == [
            (1, "", "interrupted", "abandoned"),
            (2, "The quick", None, None),
            (2, "", "done", None),
        ]
        assert resumed[0].to_json() == {
            "type": "tokens",
            "session": 0,
            "seq": 4,
            "epoch": epoch,
            "attempt": 1,
            "end": "interrupted",
            "reason": "abandoned",
        }
        # A stream a failed attempt ended says so itself; one left open when the run
        # ended is closed by the reader.
        put(store, "r", epoch, 5, 1, 0, "Hal", end="failed")
        put(store, "r", epoch, 6, 1, 0, "Open")
        follower = app.follow_tokens("r", after=resumed[-1].cursor)
        tail = follower.poll() + follower.close_open()
        assert [(e.seq, e.text, e.end, e.reason) for e in tail] == [
            (5, "Hal", None, None),
            (5, "", "interrupted", "failed"),
            (6, "Open", None, None),
            (6, "", "interrupted", "abandoned"),
        ]
    finally:
        app.close()


def unfenced(
    store: ms.storage.Store, run_id: str, epoch: int, seq: int, attempt: int, idx: int, text: str
) -> None:
    """A row as an unfenced writer (mainspring before schema 16) could leave it: at an
    epoch that has moved on."""
    with store._write() as cur:
        cur.execute("UPDATE ms_stream_heads SET pos = pos + 1 WHERE run_id = ?", (run_id,))
        cur.execute("SELECT pos FROM ms_stream_heads WHERE run_id = ?", (run_id,))
        [pos] = cur.fetchone()
        cur.execute(
            "INSERT INTO ms_stream_chunks (run_id, session, seq, epoch, attempt, idx, kind,"
            " text, created_at, pos) VALUES (?, 0, ?, ?, ?, ?, 'text', ?, 1.0, ?)",
            (run_id, seq, epoch, attempt, idx, text, pos),
        )


def test_a_stale_attempt_never_overrides_a_newer_one(db_url: str) -> None:
    """Rows of an older (epoch, attempt) that reach the table after a newer attempt
    began (a worker frozen past its lease, before streams were fenced) are never
    shown: the follower orders attempts by (epoch, attempt), not by arrival."""
    app = ms.App(db_url)
    try:
        store = app.store
        first = running(store, "r")
        put(store, "r", first, 3, 1, 0, "The qu")
        [taken] = store.claim(
            worker="w2", now=20.0, lease_s=15, limit=1, workflows=["wf"], max_recoveries=3
        )
        second = taken.epoch
        put(store, "r", second, 3, 2, 0, "The quick")
        unfenced(store, "r", first, 3, 1, 1, "ick brown fox")  # the frozen worker, back
        put(store, "r", second, 3, 2, 1, " brown fox", end="done")
        events = app.follow_tokens("r").poll()
        assert [(e.epoch, e.attempt, e.text, e.end, e.reason) for e in events] == [
            (first, 1, "The qu", None, None),
            (first, 1, "", "interrupted", "abandoned"),
            (second, 2, "The quick", None, None),
            (second, 2, " brown fox", None, None),
            (second, 2, "", "done", None),
        ]
        # A step that ran again after its stream was done: the done one is void too.
        put(store, "r", second, 3, 3, 0, "Again", end="done")
        events = app.follow_tokens("r", after=events[-1].cursor).poll()
        assert [(e.attempt, e.text, e.end, e.reason) for e in events] == [
            (2, "", "interrupted", "superseded"),
            (3, "Again", None, None),
            (3, "", "done", None),
        ]
    finally:
        app.close()


def test_every_cursor_resumes_exactly(db_url: str) -> None:
    """A reader that resumes after any event's cursor gets exactly the events that
    followed it: nothing repeated, nothing lost, the ends it synthesises included
    (an abandoned attempt seen only when the next begins, streams the run's end
    left open)."""
    app = ms.App(db_url)
    try:
        store = app.store
        epoch = running(store, "r")
        put(store, "r", epoch, 0, 1, 0, "Hel", (0, "c1", "look", '{"q":'))
        put(store, "r", epoch, 1, 1, 0, "Open")  # left open: its worker died
        put(store, "r", epoch, 0, 1, 2, "lo", (0, "c1", "look", '"x"}'), end="done")
        put(store, "r", epoch, 1, 2, 0, "Retried", end="done")  # abandoned, then done
        put(store, "r", epoch, 0, 2, 0, "Again", end="done")  # superseded
        put(store, "r", epoch, 2, 1, 0, "Boom", end="failed")
        put(store, "r", epoch, 3, 1, 0, "Never")  # open when the run ends
        put(store, "r", epoch, 4, 1, 0, "Nor")
        follower = app.follow_tokens("r")
        full = follower.poll() + follower.close_open()
        ends = [(e.seq, e.attempt, e.end, e.reason) for e in full if e.end]
        assert ends == [
            (0, 1, "done", None),
            (1, 1, "interrupted", "abandoned"),
            (1, 2, "done", None),
            (0, 1, "interrupted", "superseded"),
            (0, 2, "done", None),
            (2, 1, "interrupted", "failed"),
            (3, 1, "interrupted", "abandoned"),
            (4, 1, "interrupted", "abandoned"),
        ]
        assert len({e.cursor for e in full}) == len(full)  # every event its own place
        for i, event in enumerate(full):
            again = app.follow_tokens("r", after=event.cursor)
            assert again.poll() + again.close_open() == full[i + 1 :], f"after {event.cursor}"
        with pytest.raises(ValueError, match="not a token stream cursor"):
            app.follow_tokens("r", after="7~x")
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
    assert first and (first[-1].end, first[-1].reason) == ("interrupted", "failed")
    assert TEXT.startswith("".join(e.text for e in first)) and len(first) > 1
    second = [e for e in events if e.attempt == 2]
    assert "".join(e.text for e in second) == TEXT and second[-1].end == "done"
    [model_step] = [s for s in app.observe.steps(run_id) if s.role == "model"]
    assert (model_step.status, model_step.attempt) == ("completed", 2)
    # The drop was a transient error of attempt 1 (the SDK says "connection error" or
    # the adapter "the stream broke off"), retried as such.
    assert "TransientError" in (model_step.error or "")
