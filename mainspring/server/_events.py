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

from .. import App, RunNotFound
from ..serde import loads, public_error
from ..storage import StepRecord

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


def _decode(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return loads(text)
    except Exception:
        return text


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
        "output": _decode(s.output),
        "error": _error(s.error, full),
    }


def _error(text: str | None, full: bool) -> Any:
    return _decode(text) if full else public_error(_decode(text))


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
    mark = parse_event_id(last_event_id)
    tokens = await asyncio.to_thread(
        app.follow_tokens, run_id, after=parse_token_cursor(last_event_id)
    )

    def tail() -> str:
        return f"~t{tokens.cursor}" if tokens.cursor != "0" else ""

    sent: dict[tuple[int, int], str] = {}  # rows past the watermark, as last sent
    status: str | None = None
    quiet = 0.0
    seen_finished = False
    check = _Recheck(still_allowed, max_s)
    yield b"retry: 1000\n\n"
    while True:
        if not await check.allowed():
            return  # the key was revoked: close, so the client's reconnect gets a 401
        try:
            run = await asyncio.to_thread(app.get_run, run_id)
        except RunNotFound:  # pruned while we followed it
            yield _frame("end", f"{mark[0]}.{mark[1]}~gone{tail()}", {"status": "gone"})
            return
        steps = await asyncio.to_thread(app.store.steps_after, run_id, *mark)
        # Read after the steps: the text of every step seen finished is all here.
        live = await asyncio.to_thread(tokens.poll)
        if run.finished:
            live += tokens.close_open()
        emitted = bool(live)
        for t in live:
            yield _frame(
                t.sse_event,
                f"{mark[0]}.{mark[1]}~tok.{t.session}.{t.seq}.{t.attempt}~t{t.cursor}",
                t.to_json(),
            )
        for s in steps:
            key = (s.session, s.seq)
            if sent.get(key) != s.status:
                sent[key] = s.status
                if s.status != "started" and _follows(mark, key):
                    mark = key
                    sent.pop(key, None)
                yield _frame(
                    "step",
                    f"{mark[0]}.{mark[1]}~{s.session}.{s.seq}.{s.status}{tail()}",
                    _step_data(s, full=full),
                )
                emitted = True
            elif s.status != "started" and _follows(mark, key):
                mark = key
                sent.pop(key, None)
        if run.status != status:
            status = run.status
            data: dict[str, Any] = {"status": status, "wait_reason": run.wait_reason}
            if status == "waiting":
                pending = await asyncio.to_thread(app.requests, run_id)
                data["pending_requests"] = [p.to_json() for p in pending]
            if run.finished:
                data["output"] = _decode(run.output)
                data["error"] = _error(run.error, full)
            yield _frame("status", f"{mark[0]}.{mark[1]}~run.{status}{tail()}", data)
            emitted = True
        # A run cancelled in a wait or sleep keeps that row 'started' for good: after
        # one more poll (for rows still being written) the stream ends anyway.
        if run.finished and (not steps_pending(steps) or seen_finished):
            yield _frame("end", f"{mark[0]}.{mark[1]}~end{tail()}", {"status": run.status})
            return
        seen_finished = run.finished
        if emitted:
            quiet = 0.0
        else:
            quiet += poll_s
            if quiet >= _KEEPALIVE_S:
                quiet = 0.0
                yield b": keep-alive\n\n"
        await asyncio.sleep(poll_s)


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
    quiet = 0.0
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
        if changed:
            quiet = 0.0
        else:
            quiet += poll_s
            if quiet >= _KEEPALIVE_S:
                quiet = 0.0
                yield b": keep-alive\n\n"
        await asyncio.sleep(poll_s)
