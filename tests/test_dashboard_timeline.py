"""The run page's timeline as a view model: agent turns, hidden bookkeeping, waits and
retries, filters and paging, built from real agent runs (a scripted model) and from
hand-made traces for the shapes a real run rarely shows."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import mainspring as ms
from mainspring.dashboard._chart import usage_chart
from mainspring.dashboard._timeline import (
    PAGE_ROWS,
    PAGE_TURNS,
    Filters,
    build_timeline,
    duration,
    group_turns,
)
from mainspring.limits import Limits, Price, RateLimit
from mainspring.models import Message, ModelResponse, ToolSpec, Usage
from mainspring.observability import TraceEntry, step_role
from mainspring.testing import ScriptedModel

PRICES = {"scripted": Price(input=3.0, output=15.0)}


class WarpClock:
    """Real time plus an offset that tools and sleeps move forward at once: a run of
    minutes (model calls of seconds, a person answering after a while) recorded in a
    fraction of a second."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset

    async def sleep(self, seconds: float) -> None:
        self.offset += max(0.0, seconds)
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def agent_run(
    db: str,
    turns: int,
    *,
    refuse_at: int | None = None,
    approve_at: int | None = None,
    flaky_at: int | None = None,
) -> str:
    """A real agent run with a scripted model: turn ``i`` calls ``lookup`` and
    ``fetch`` (two tool calls), the last turn finishes. With rate limits (a booking
    before each call), a wall-time limit (a recorded ``now`` before each call) and
    prices, as a production agent has. ``refuse_at``: the provider refuses that turn's
    call once (429); ``approve_at``: that turn also calls ``send``, which a person
    approves 40 s later; ``flaky_at``: that turn's ``fetch`` fails once, then succeeds
    on its second attempt. Returns the run id."""
    clock = WarpClock()
    app = ms.App(
        db,
        clock=clock,
        lease_s=3600,
        inline_wait_s=5.0,
        rate_limits=[RateLimit(provider="scripted", model="scripted", rpm=1_000_000)],
    )
    failed_once: set[int] = set()

    @app.tool
    def lookup(item: int) -> dict[str, Any]:
        """Read an item."""
        clock.advance(0.15 + 0.05 * (item % 4))
        return {"item": item, "text": f"item {item} is fine"}

    @app.tool(retry=ms.RetryPolicy(max_attempts=3, initial_s=0.5, jitter=False))
    def fetch(item: int) -> str:
        """Fetch an item's page."""
        clock.advance(0.4 + 0.1 * (item % 3))
        if item == flaky_at and item not in failed_once:
            failed_once.add(item)
            raise ConnectionError(f"reset while fetching {item}")
        return f"page {item}"

    @app.tool(requires_approval=True)
    def send(item: int) -> str:
        """Send a report about an item."""
        clock.advance(0.2)
        return f"sent {item}"

    key = f"checker-{uuid.uuid4().hex[:8]}"
    refused: set[int] = set()
    answered = [0]  # requests answered (the history is compacted: not a turn counter)

    def play(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ModelResponse | Exception:
        turn = answered[0]
        clock.advance(1.2 + 0.4 * (turn % 5))  # the model thinks
        if turn == refuse_at and turn not in refused:
            refused.add(turn)
            return ms.RateLimited("slow down", retry_after=2.0)
        answered[0] += 1
        usage = Usage(input_tokens=800 + 120 * turn, output_tokens=60 + 5 * (turn % 7))
        if turn >= turns - 1:
            done = ScriptedModel.call("finish", {"answer": f"checked {turns - 1} items"})
            return ModelResponse(text=None, tool_calls=done.tool_calls, usage=usage)
        calls: list[tuple[str, dict[str, Any]]] = [
            ("lookup", {"item": turn}),
            ("fetch", {"item": turn}),
        ]
        if turn == approve_at:
            calls.append(("send", {"item": turn}))
        reply = ScriptedModel.calls(*calls, text=f"checking item {turn}")
        return ModelResponse(text=reply.text, tool_calls=reply.tool_calls, usage=usage)

    agent = app.agent(
        "checker",
        model=ScriptedModel(play, remote=True),  # books as a provider's model does
        instructions="Check the items.",
        tools=[lookup, fetch, send],
        limits=Limits(max_steps=turns + 5, max_wall_s=86_400),
        prices=PRICES,
        rate_account=key,  # runs of one store do not share a bucket (their clocks differ)
    )

    async def go() -> None:
        try:
            await app.run(agent, "check the items", key=key)
        except ms.RunWaiting as waiting:
            [request] = waiting.requests
            clock.advance(40.0)  # a person reads it and approves
            app.answer(waiting.run_id, request, decision="approve", by="ana")
            await app.run(agent, "check the items", key=key)

    asyncio.run(go())
    run_id = app.submit(agent, "check the items", key=key).run_id  # the same run: its key
    app.close()
    return run_id


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ms.RunTrace]:
    db = f"sqlite:///{tmp_path_factory.mktemp('timeline') / 'runs.db'}"
    run_id = agent_run(db, 52, refuse_at=7, approve_at=20, flaky_at=12)
    app = ms.App(db)
    trace = app.observe.trace(run_id)
    app.close()
    return db, trace


def _entry(seq: int, kind: str, name: str, **fields: Any) -> TraceEntry:
    start = float(fields.pop("start", seq))
    took = fields.pop("took", 0.5)
    return TraceEntry(
        session=1,
        seq=seq,
        kind=kind,  # type: ignore[arg-type]
        name=name,
        status=fields.pop("status", "completed"),
        attempt=fields.pop("attempt", 1),
        started_at=start,
        finished_at=None if took is None else start + took,
        latency_s=took,
        **fields,
    )


def test_roles_come_from_one_function() -> None:
    """The role of a journal row: its kind, and for a ``ctx.step`` the role it
    declared (never its name)."""
    assert [
        step_role(kind, role)
        for kind, role in [
            ("step", "model"),
            ("model", "step"),  # a trace kind says it all
            ("step", "tool"),
            ("tool", "step"),
            ("step", "rate"),
            ("step", "wait"),
            ("sleep", "step"),
            ("signal", "step"),
            ("now", "step"),
            ("uuid", "step"),
            ("random", "step"),
            ("step", "step"),
            ("step", "a-role-of-a-later-version"),
        ]
    ] == [
        "model", "model", "tool", "tool", "rate", "wait", "wait", "wait",
        "internal", "internal", "internal", "step", "step",
    ]  # fmt: skip
    assert step_role("step") == "step"


def test_an_agent_run_is_grouped_by_turn(traced: tuple[str, ms.RunTrace]) -> None:
    _, trace = traced
    entries = trace.entries
    assert 240 <= len(entries) <= 290  # the ~260-step run the issue describes
    tl = build_timeline(entries, now=time.time())
    assert tl.agent
    # 52 model calls, one of them refused once and sent again in the same turn.
    assert sum(e.role == "model" for e in entries) == 53
    assert [t.number for t in tl.turns][-1] == 52
    by_number = {t.number: t for t in tl.turns}
    first = by_number[1]
    assert [r.role for r in first.rows] == ["internal", "internal", "rate", "model", "tool", "tool"]
    assert first.model == "scripted:scripted"
    assert (first.tokens_in, first.tokens_out) == (800, 60)
    assert first.cost_usd == pytest.approx((800 * 3.0 + 60 * 15.0) / 1e6)
    assert first.tools == 2 and first.status == "completed"
    assert first.latency_s >= first.model_s > 1.0
    # Every model call's tokens and cost are in its turn; the totals add up.
    assert sum(t.tokens_in for t in tl.turns) == trace.tokens_in
    assert sum(t.cost_usd for t in tl.turns) == pytest.approx(trace.cost_usd)
    # The refused call: a 429, a rate-limit wait, the call again, all in turn 8.
    refused = by_number[8]
    models = [r for r in refused.rows if r.role == "model"]
    assert [(r.entry.status, r.entry.rate_limited) for r in models] == [
        ("failed", True),
        ("completed", False),
    ]
    assert refused.retries == 1 and refused.status == "completed"
    assert refused.waited_s >= 1.5  # the slot the limiter booked after the refusal
    assert any(r.role == "wait" and r.waited_s > 0 for r in refused.rows)
    # The approval: a wait for the signal inside the turn whose call needed it.
    approved = by_number[21]
    waits = [r for r in approved.rows if r.role == "wait" and r.entry.kind == "signal"]
    assert len(waits) == 1 and waits[0].took_s is not None and waits[0].took_s >= 40
    assert [r.label for r in approved.rows if r.role == "tool"] == ["lookup", "fetch", "send"]
    assert approved.waited_s >= 40
    # The flaky fetch: one row, its second attempt, the first one's error kept.
    flaky = [r for r in by_number[13].rows if r.role == "tool" and r.label == "fetch"]
    assert [(r.entry.attempt, r.entry.error_class, r.error) for r in flaky] == [
        (2, "ConnectionError", True)
    ]
    assert flaky[0].retry_s > 0.4  # the failed attempt and its back-off, before the last
    assert by_number[13].retries == 1


def test_bookkeeping_is_hidden_unless_asked(traced: tuple[str, ms.RunTrace]) -> None:
    _, trace = traced
    default = build_timeline(trace.entries, now=time.time())
    shown = [r for g in default.groups for r in g.rows]
    assert {r.role for r in shown} <= {"model", "tool", "wait", "step"}
    internal = sum(e.role in ("rate", "internal") for e in trace.entries)
    waited = sum(e.role == "rate" and e.rate_wait_s > 0 for e in trace.entries)
    assert internal > 100  # what made the flat table unreadable
    assert default.hidden == internal - waited  # a booking that made the run wait is a wait
    every = build_timeline(trace.entries, Filters(internal=True), now=time.time())
    assert every.hidden == 0
    assert sum(len(t.rows) for t in every.turns) == len(trace.entries)
    assert every.matched == len(trace.entries)


def test_filters_and_paging(traced: tuple[str, ms.RunTrace]) -> None:
    _, trace = traced
    now = time.time()
    # A run opens at its live end: the last page, its newest turns.
    opened = build_timeline(trace.entries, now=now)
    assert opened.pages == 3 and opened.page == 3  # 53 turns (0 to 52), 25 a page
    assert [g.turn.number for g in opened.groups if g.turn] == [51, 52]
    assert opened.filters.query(page=1) == "?page=1"
    assert opened.filters.query(errors=True) == "?errors=1"  # a new filter: its live end
    page1 = build_timeline(trace.entries, Filters(page=1), now=now)
    assert page1.pages == 3 and page1.page == 1
    assert [g.turn.number for g in page1.groups if g.turn] == list(range(1, 26))
    last = build_timeline(trace.entries, Filters(page=99), now=now)
    assert last.page == 3 and [g.turn.number for g in last.groups if g.turn] == [51, 52]
    errors = build_timeline(trace.entries, Filters(errors=True), now=now)
    assert [(g.turn.number, [r.label for r in g.rows]) for g in errors.groups if g.turn] == [
        (8, ["scripted:scripted"]),
        (13, ["fetch"]),
    ]
    tools = build_timeline(trace.entries, Filters(kind="tool", first=10, last=12), now=now)
    assert [g.turn.number for g in tools.groups if g.turn] == [10, 11, 12]
    assert {r.role for g in tools.groups for r in g.rows} == {"tool"}
    assert tools.matched == 6
    waits = build_timeline(trace.entries, Filters(kind="wait"), now=now)
    assert [g.turn.number for g in waits.groups if g.turn] == [8, 21]
    # The axis of a page spans the turns on it.
    assert page1.axis.start == pytest.approx(page1.groups[0].turn.start_s)  # type: ignore[union-attr]


def test_query_strings_round_trip() -> None:
    f = Filters.parse({"errors": "1", "kind": "tool", "first": "3", "last": "9", "page": "2"})
    assert f == Filters(errors=True, kind="tool", first=3, last=9, page=2)
    assert f.query(page=3) == "?errors=1&kind=tool&first=3&last=9&page=3"
    assert f.query(internal=True) == "?errors=1&kind=tool&first=3&last=9&internal=1"
    assert Filters().query() == "?"
    junk = Filters.parse({"kind": "<script>", "first": "-4", "page": "9223372036854775808"})
    assert junk == Filters()


def test_a_plain_workflow_is_a_plain_waterfall() -> None:
    entries = [_entry(i, "step", f"check-{i}", start=i * 0.5) for i in range(450)]
    entries.insert(3, _entry(1000, "now", "now", start=1.2, took=0.0))
    entries.insert(5, _entry(1001, "sleep", "sleep", start=2.0, took=30.0))
    assert group_turns(entries) == [None] * len(entries)
    tl = build_timeline(entries, Filters(page=1), now=0.0)
    assert not tl.agent and tl.turns == ()
    assert [g.turn for g in tl.groups] == [None]
    assert len(tl.groups[0].rows) == PAGE_ROWS and tl.pages == 3 and tl.hidden == 1
    sleep = next(r for r in tl.groups[0].rows if r.role == "wait")
    assert [s.cls for s in tl.axis.bars(sleep)] == ["wait"]
    page3 = build_timeline(entries, Filters(page=3), now=0.0)
    assert len(page3.groups[0].rows) == 451 - 2 * PAGE_ROWS


def test_waits_retries_and_running_steps_are_drawn_apart() -> None:
    entries = [
        _entry(1, "step", "rate:scripted:scripted:default", start=0.0, took=0.01, rate_wait_s=2.0,
               journal_role="rate"),
        _entry(2, "model", "model:openai:gpt-4.1@http://user:pass@proxy/v1", start=2.0, took=1.0,
               model="gpt-4.1", tokens_in=10, tokens_out=2, cost_usd=0.001),
        _entry(3, "tool", "tool:fetch", start=3.5, took=0.5, attempt=3, tool="fetch",
               error_class="TimeoutError", error_message="slow"),
        _entry(4, "signal", "approval:send", start=4.0, took=None),
    ]  # fmt: skip
    tl = build_timeline(entries, now=10.0)
    [group] = tl.groups
    assert group.turn is not None and group.turn.status == "running"
    booking, model, fetch, approval = group.rows
    assert booking.role == "wait" and [s.cls for s in tl.axis.bars(booking)] == ["run", "wait"]
    assert model.label == "openai:gpt-4.1"  # the logical model, never the URL
    assert [s.cls for s in tl.axis.bars(fetch)] == ["retry", "run"]
    assert fetch.retry_s == pytest.approx(0.5)  # from the model call's end to this attempt
    assert approval.running and approval.took_s == pytest.approx(6.0)
    assert [s.cls for s in tl.axis.bars(approval)] == ["wait"]
    assert group.turn.waited_s == pytest.approx(8.0)
    assert tl.axis.start == 0.0 and tl.axis.end == pytest.approx(10.0)
    left = {s.cls: s for s in tl.axis.bars(approval)}["wait"]
    assert (left.left, left.width) == (40.0, 60.0)


def test_durations_and_the_chart() -> None:
    assert [duration(s) for s in (-0.0001, 0.0, 0.0123, 2.414, 185, 7800)] == [
        "0 ms", "0 ms", "12 ms", "2.41 s", "3 m 05 s", "2 h 10 m",
    ]  # fmt: skip
    entries = [
        _entry(i, "model", "model:scripted:scripted", start=i, tokens_in=100, tokens_out=10,
               cost_usd=0.01)
        for i in range(1, 4)
    ]  # fmt: skip
    svg = usage_chart(build_timeline(entries, now=0.0).turns)
    assert svg.startswith("<svg") and 'class="tokens"' in svg and 'class="cost"' in svg
    assert "330" in svg and "$0.0300" in svg and svg.count("<circle") == 3
    assert usage_chart(()) == ""
    big = [_entry(1, "model", "model:scripted:scripted", tokens_in=3_600_000, tokens_out=51_575)]
    assert ">3.65M</text>" in usage_chart(build_timeline(big, now=0.0).turns)


def test_a_long_run_pages_without_drawing_every_row(tmp_path: Path) -> None:
    entries = []
    for turn in range(300):
        base = turn * 4.0
        entries += [
            _entry(turn * 4, "now", "now", start=base, took=0.0),
            _entry(turn * 4 + 1, "model", "model:scripted:scripted", start=base, took=1.0),
            _entry(turn * 4 + 2, "tool", "tool:a", start=base + 1, took=1.0, tool="a"),
            _entry(turn * 4 + 3, "tool", "tool:b", start=base + 2, took=1.0, tool="b"),
        ]
    started = time.perf_counter()
    tl = build_timeline(entries, Filters(page=5), now=0.0)
    assert time.perf_counter() - started < 0.5
    assert len(entries) == 1200 and tl.pages == 12 and tl.hidden == 300
    assert len(tl.groups) == PAGE_TURNS and tl.shown == 3 * PAGE_TURNS
    assert tl.groups[0].turn is not None and tl.groups[0].turn.number == 101


def test_wake_times_read_as_dates_not_unix_times() -> None:
    """A rate-limit wait journals its wake time and a sleep its deadline as Unix times:
    the timeline says them as a date and a UTC time."""
    at = 1_796_667_497.39  # 2026-12-07 18:18:17 UTC
    entries = [
        _entry(1, "step", "rate:wait:scripted:scripted", start=0.0, took=0.01,
               journal_role="wait", output_summary=str(at)),
        _entry(2, "sleep", "sleep", start=1.0, took=30.0, input_summary=f"until {at:.3f}"),
        _entry(3, "step", "count", start=31.0, took=0.1, output_summary="1796"),
    ]  # fmt: skip
    rows = build_timeline(entries, now=40.0).groups[0].rows
    assert [r.detail for r in rows] == [
        "until 2026-12-07 18:18:17 UTC",
        "until 2026-12-07 18:18:17 UTC",
        "1796",  # a number that is no time stays as it is
    ]
