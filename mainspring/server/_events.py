"""Server-Sent Events of one run, resumable from ``Last-Event-ID``.

An event's id starts with a watermark ``session.seq``: every journal row up to it
had finished when the event was sent. A client that reconnects with that id gets
every row after the watermark in its current state again, so nothing is missed;
rows past the watermark may arrive twice (dedupe on ``session``, ``seq``,
``status``). For a run without parallel steps the watermark is its last finished
step, so a reconnect repeats nothing.

Live model output comes as ``tokens`` events (text, and the ends of streams) and
``tool_call_delta`` events (tool calls' arguments as they form; docs/streaming.md),
sent before the step events of the same poll. Once a run has any, every event id ends
in ``~t<cursor>``: the last stream event sent, so a reconnect resumes the output
exactly where it broke off (nothing repeated, nothing lost).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from .. import App, RunNotFound, TokenEvent, TokenFollower
from ..hitl import Request as HumanRequest
from ..storage import RunRecord, StepRecord
from ._views import decode, error_out

__all__ = ["event_stream", "parse_event_id", "parse_token_cursor", "runs_stream"]

_TOKEN_CURSOR = re.compile(r"~t(\d{1,15}(?:\.\d{1,6})?)$")

_KEEPALIVE_S = 15.0
_MAX_POSITION = 1 << 53
# How often a stream checks that its key was not revoked (a revoked key's stream ends
# within this many seconds plus one poll).
RECHECK_S = 2.0


def parse_event_id(value: str | None) -> tuple[int, int]:
    """The watermark in a ``Last-Event-ID``; the start for a missing or foreign one."""
    if value:
        head = value.split("~", 1)[0]
        try:
            session, seq = (int(part) for part in head.split(".", 1))
        except ValueError:
            return -1, -1
        # Past any real position (and past what the database's integers hold): foreign.
        if 0 <= session < _MAX_POSITION and -1 <= seq < _MAX_POSITION:
            return session, seq
    return -1, -1


def parse_token_cursor(value: str | None) -> str:
    """The token stream cursor in a ``Last-Event-ID`` ("0": from the start)."""
    found = _TOKEN_CURSOR.search(value or "")
    return found.group(1) if found else "0"


def _frame(event: str, event_id: str, data: dict[str, Any]) -> bytes:
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)
    return f"id: {event_id}\nevent: {event}\ndata: {payload}\n\n".encode()


def _step_data(s: StepRecord, *, full: bool) -> dict[str, Any]:
    return {
        "session": s.session,
        "seq": s.seq,
        "kind": s.kind,
        "name": s.name,
        "status": s.status,
        "attempt": s.attempt,
        "started_at": s.started_at,
        "finished_at": s.finished_at,
        "output": decode(s.output),
        "error": error_out(s.error, admin=full),
    }


async def event_stream(
    app: App,
    run_id: str,
    last_event_id: str | None,
    *,
    poll_s: float = 0.2,
    full: bool = False,
    still_allowed: Callable[[], bool] | None = None,
    max_s: float | None = None,
) -> AsyncIterator[bytes]:
    """The run's events; ``full`` keeps tracebacks (admins); ``still_allowed`` is
    asked every few seconds and ends the stream when it says no (a revoked key);
    after ``max_s`` seconds the stream ends and the client resumes with
    ``Last-Event-ID`` (no connection is held for ever)."""
    tokens = await asyncio.to_thread(
        app.follow_tokens, run_id, after=parse_token_cursor(last_event_id)
    )
    frames = _RunFrames(parse_event_id(last_event_id), tokens, full=full)
    seen_finished = False
    check = _Recheck(still_allowed, max_s)
    quiet = _Quiet(poll_s)
    yield b"retry: 1000\n\n"
    while True:
        if not await check.allowed():
            return  # the key was revoked: close, so the client's reconnect gets a 401
        try:
            run = await asyncio.to_thread(app.get_run, run_id)
        except RunNotFound:  # pruned while we followed it
            yield frames.end("gone")
            return
        steps = await asyncio.to_thread(app.store.steps_after, run_id, *frames.mark)
        # Read after the steps: the text of every step seen finished is all here.
        live = await asyncio.to_thread(tokens.poll)
        if run.finished:
            live += tokens.close_open()
        out = [*frames.tokens(live), *frames.steps(steps)]
        if run.status != frames.status:
            waiting = run.status == "waiting"
            pending = await asyncio.to_thread(app.requests, run_id) if waiting else None
            out.append(frames.run(run, pending))
        for frame in out:
            yield frame
        # A run cancelled in a wait or sleep keeps that row 'started' for good: after
        # one more poll (for rows still being written) the stream ends anyway.
        if run.finished and (not steps_pending(steps) or seen_finished):
            yield frames.end(run.status)
            return
        seen_finished = run.finished
        if quiet.keep_alive(emitted=bool(out)):
            yield b": keep-alive\n\n"
        await asyncio.sleep(poll_s)


class _RunFrames:
    """The frames of one run's stream and what they have told the client so far:
    the watermark ``mark``, the rows past it as last sent, the run's status."""

    def __init__(self, mark: tuple[int, int], tokens: TokenFollower, *, full: bool) -> None:
        self.mark = mark
        self.status: str | None = None
        self._tokens = tokens
        self._full = full
        self._sent: dict[tuple[int, int], str] = {}  # rows past the watermark, as last sent

    def _id(self, rest: str) -> str:
        cursor = self._tokens.cursor
        tail = f"~t{cursor}" if cursor != "0" else ""
        return f"{self.mark[0]}.{self.mark[1]}~{rest}{tail}"

    def tokens(self, live: list[TokenEvent]) -> list[bytes]:
        return [
            _frame(
                t.sse_event,
                f"{self.mark[0]}.{self.mark[1]}~tok.{t.session}.{t.seq}.{t.attempt}~t{t.cursor}",
                t.to_json(),
            )
            for t in live
        ]

    def steps(self, steps: list[StepRecord]) -> list[bytes]:
        """A ``step`` frame for each row whose status the client has not seen; the
        watermark moves over each finished row that follows it."""
        out = []
        for s in steps:
            key = (s.session, s.seq)
            changed = self._sent.get(key) != s.status
            if changed:
                self._sent[key] = s.status
            if s.status != "started" and _follows(self.mark, key):
                self.mark = key
                self._sent.pop(key, None)
            if changed:
                rest = f"{s.session}.{s.seq}.{s.status}"
                out.append(_frame("step", self._id(rest), _step_data(s, full=self._full)))
        return out

    def run(self, run: RunRecord, pending: list[HumanRequest] | None) -> bytes:
        """The ``status`` frame of a run whose status changed."""
        self.status = run.status
        data: dict[str, Any] = {"status": run.status, "wait_reason": run.wait_reason}
        if pending is not None:
            data["pending_requests"] = [p.to_json() for p in pending]
        if run.finished:
            data["output"] = decode(run.output)
            data["error"] = error_out(run.error, admin=self._full)
        return _frame("status", self._id(f"run.{run.status}"), data)

    def end(self, status: str) -> bytes:
        rest = "gone" if status == "gone" else "end"
        return _frame("end", self._id(rest), {"status": status})


class _Quiet:
    """Counts the polls that sent nothing; after ``_KEEPALIVE_S`` of them a comment
    keeps proxies from closing the idle connection."""

    def __init__(self, poll_s: float) -> None:
        self._poll_s = poll_s
        self._quiet = 0.0

    def keep_alive(self, *, emitted: bool) -> bool:
        if emitted:
            self._quiet = 0.0
            return False
        self._quiet += self._poll_s
        if self._quiet >= _KEEPALIVE_S:
            self._quiet = 0.0
            return True
        return False


class _Recheck:
    """Asks whether the stream's key still holds, at most every ``RECHECK_S``, and
    whether the stream has lived its ``max_s``."""

    def __init__(self, still_allowed: Callable[[], bool] | None, max_s: float | None) -> None:
        self._ask = still_allowed
        self._next = 0.0
        now = asyncio.get_running_loop().time()
        self._end = None if max_s is None else now + max_s

    async def allowed(self) -> bool:
        now = asyncio.get_running_loop().time()
        if self._end is not None and now >= self._end:
            return False
        if self._ask is None:
            return True
        if now < self._next:
            return True
        self._next = now + RECHECK_S
        return await asyncio.to_thread(self._ask)


def _follows(mark: tuple[int, int], key: tuple[int, int]) -> bool:
    """Is ``key`` the journal row right after ``mark``? (Rows are numbered from 0 in
    each session; a row not yet written must not be skipped over.)"""
    session, seq = mark
    if session < 0:
        return key == (0, 0)
    return key == (session, seq + 1) or key == (session + 1, 0)


def steps_pending(steps: list[StepRecord]) -> bool:
    return any(s.status == "started" for s in steps)


async def runs_stream(
    app: App,
    last_event_id: str | None,
    *,
    poll_s: float = 0.5,
    still_allowed: Callable[[], bool] | None = None,
    max_s: float | None = None,
) -> AsyncIterator[bytes]:
    """Every run whose row changes (submitted, claimed, waiting, finished, …), as
    ``run`` events; the id is the change's ``updated_at`` so a reconnect resumes.
    ``still_allowed`` and ``max_s`` end it as in :func:`event_stream`."""
    check = _Recheck(still_allowed, max_s)
    try:
        after = float(last_event_id) if last_event_id else app.clock.now()
    except ValueError:
        after = app.clock.now()
    if not math.isfinite(after) or after < 0:  # "inf" or "nan" would never match a row
        after = app.clock.now()
    quiet = _Quiet(poll_s)
    yield b"retry: 2000\n\n"
    while True:
        if not await check.allowed():
            return
        changed = await asyncio.to_thread(app.store.runs_changed_since, after)
        for run in changed:
            after = max(after, run.updated_at)
            data = {
                "id": run.id,
                "workflow": run.workflow,
                "status": run.status,
                "wait_reason": run.wait_reason,
                "created_at": run.created_at,
                "updated_at": run.updated_at,
            }
            yield _frame("run", repr(run.updated_at), data)
        if quiet.keep_alive(emitted=bool(changed)):
            yield b": keep-alive\n\n"
        await asyncio.sleep(poll_s)
