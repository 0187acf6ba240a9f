"""Following a run's live token streams: :meth:`Streams.stream` (``async for``) and
:meth:`Streams.follow_tokens` (what the server's ``tokens`` and ``tool_call_delta``
events read). A part of :class:`~mainspring.App`.

The store keeps each model step attempt's output in batches (``ms_stream_chunks``), in
commit order (``pos``). A follower reads them in that order and says how each stream
ended: ``"done"`` (the call returned its reply), or ``"interrupted"``: this attempt's
text is void, with the reason: ``"failed"`` (the call raised: an HTTP 500, a dropped
connection, a timeout), ``"abandoned"`` (its worker died or lost the run, seen when
the next attempt began or the run ended) or ``"superseded"`` (it was ``done``, but its
worker lost the run before journaling the reply, and the step ran again).

Attempts of one step are ordered by ``(epoch, attempt)``, never by arrival: a row of an
older attempt is never shown after a newer one began (the store's fence already
refuses a stale worker's rows; this holds for rows written before it too).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from ..storage import Store, StreamEnd, TokenChunk, TokenKind
from ._handle import RunHandle, run_id_of
from ._runtime import Part

__all__ = ["InterruptReason", "Streams", "TokenEvent", "TokenFollower"]

InterruptReason = Literal["failed", "abandoned", "superseded"]

_CURSOR = re.compile(r"(\d{1,15})(?:\.(\d{1,6}))?")


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenEvent:
    """A piece of a model step's live output, or the end of its stream.

    Attributes:
        session / seq: the model step's journal position.
        epoch / attempt: the execution and attempt whose stream this is (a retry, or
            another worker taking the run over, streams anew).
        kind: ``"text"``: a piece of the reply's text (in ``text``); ``"tool_call"``:
            a piece of a tool call's arguments as they form (in ``arguments``; the
            call is ``call_index``, ``call_id``, ``name``). End events are ``"text"``.
        text: the text (``""`` in an end event and a tool call's event).
        end: ``None`` for output; ``"done"``: the stream is complete and the call
            returned its reply; ``"interrupted"``: this attempt's output is void.
        reason: why an interrupted stream is void: ``"failed"`` (the call raised),
            ``"abandoned"`` (its worker died or lost the run), ``"superseded"`` (it
            ended ``done`` but the step ran again: its reply was never journaled).
        cursor: resume after this (``App.stream(..., after=cursor)``): opaque.
    """

    session: int
    seq: int
    attempt: int
    text: str = ""
    end: Literal["done", "interrupted"] | None = None
    cursor: str = "0"
    epoch: int = 0
    kind: TokenKind = "text"
    reason: InterruptReason | None = None
    call_index: int | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str = ""

    @property
    def sse_event(self) -> str:
        """The server's event name for it: ``tokens`` or ``tool_call_delta``."""
        return "tool_call_delta" if self.kind == "tool_call" else "tokens"

    def to_json(self) -> dict[str, object]:
        """The event as the data of the server's ``tokens`` (text, ends) or
        ``tool_call_delta`` event."""
        data: dict[str, object] = {
            "type": self.sse_event,
            "session": self.session,
            "seq": self.seq,
            "epoch": self.epoch,
            "attempt": self.attempt,
        }
        if self.kind == "tool_call":
            data.update(
                index=self.call_index,
                call_id=self.call_id,
                name=self.name,
                arguments=self.arguments,
            )
        elif self.end is None:
            data["text"] = self.text
        else:
            data["end"] = self.end
            if self.reason is not None:
                data["reason"] = self.reason
        return data


@dataclass(slots=True)
class _Attempt:
    """The attempt of a step a follower shows now, and how its stream ended."""

    epoch: int
    attempt: int
    end: Literal["done", "interrupted"] | None = None


def parse_cursor(value: int | str) -> tuple[int, int]:
    """``(pos, k)`` from a cursor: after row ``pos`` and the ``k`` events that
    followed it (``"41"``, ``"41.2"``, or an int).

    Raises:
        ValueError: not a cursor.
    """
    if isinstance(value, int):
        return max(0, value), 0
    found = _CURSOR.fullmatch(value)
    if found is None:
        raise ValueError(f"not a token stream cursor: {value!r}")
    return int(found.group(1)), int(found.group(2) or 0)


class TokenFollower:
    """Reads one run's token streams from a cursor on, in order, and marks their ends.

    Cursors are exact: every event has one (``"<pos>"``, or ``"<pos>.<k>"`` for the
    ``k``-th event after row ``pos`` that is not that row's last), and a follower made
    after any of them emits exactly the events that came after it.

    Not thread-safe: one reader (a server stream, an ``async for``) owns it. Build it
    with :meth:`Streams.follow_tokens`."""

    def __init__(self, store: Store, run_id: str, after: int | str = 0) -> None:
        self._store = store
        self.run_id = run_id
        pos, k = parse_cursor(after)
        self._pos = pos  # the rows through this one are read
        self._k = 0  # events made since that row
        self._skip = k  # of which this many reached the reader before this follower
        self._last = f"{pos}.{k}" if k else str(pos)
        self._shown: dict[tuple[int, int], _Attempt] = {}
        if pos:  # what the reader saw already: which attempts, which ended
            for s in store.token_streams(run_id, pos):
                key, shown = (s.session, s.seq), self._shown.get((s.session, s.seq))
                if shown is None or (s.epoch, s.attempt) > (shown.epoch, shown.attempt):
                    self._shown[key] = _Attempt(s.epoch, s.attempt, _ended(s.end))

    @property
    def cursor(self) -> str:
        """Resume after everything read so far."""
        return self._last

    def poll(self) -> list[TokenEvent]:
        """The events past the cursor (a blocking store read)."""
        out: list[TokenEvent] = []
        for chunk in self._store.tokens_after(self.run_id, self._pos):
            events = self._events(chunk)
            for i, event in enumerate(events):
                if i == len(events) - 1:  # a row's last event resumes after the row
                    self._pos, self._k = chunk.pos, 0
                    self._emit(event, str(chunk.pos), out)
                else:
                    self._k += 1
                    self._emit(event, f"{self._pos}.{self._k}", out)
            if not events:
                self._pos, self._k = chunk.pos, 0
                self._last = str(chunk.pos)
            self._skip = 0
        return out

    def _emit(self, event: TokenEvent, cursor: str, out: list[TokenEvent]) -> None:
        if self._skip:  # the reader had it before it resumed
            self._skip -= 1
            return
        out.append(_with_cursor(event, cursor))
        self._last = cursor

    def _current(
        self, key: tuple[int, int], chunk: TokenChunk, events: list[TokenEvent]
    ) -> _Attempt | None:
        """The attempt ``chunk`` belongs to, once the one it supersedes is ended (into
        ``events``); ``None`` when nothing of the chunk is shown."""
        shown = self._shown.get(key)
        if shown is not None:
            if (chunk.epoch, chunk.attempt) < (shown.epoch, shown.attempt):
                return None  # an older attempt's row: a newer one is under way or done
            if (chunk.epoch, chunk.attempt) > (shown.epoch, shown.attempt):
                if shown.end is None:
                    events.append(self._ended(key, shown, "abandoned"))
                elif shown.end == "done":
                    events.append(self._ended(key, shown, "superseded"))
                shown = None
        if shown is None:
            shown = self._shown[key] = _Attempt(chunk.epoch, chunk.attempt)
            return shown
        return None if shown.end is not None else shown  # nothing follows an attempt's end

    def _events(self, chunk: TokenChunk) -> list[TokenEvent]:
        key = (chunk.session, chunk.seq)
        events: list[TokenEvent] = []
        shown = self._current(key, chunk, events)
        if shown is None:
            return events
        common: dict[str, Any] = {
            "session": chunk.session,
            "seq": chunk.seq,
            "epoch": chunk.epoch,
            "attempt": chunk.attempt,
        }
        if chunk.kind == "tool_call":
            events.append(
                TokenEvent(
                    **common,
                    kind="tool_call",
                    call_index=chunk.call_index,
                    call_id=chunk.call_id,
                    name=chunk.name,
                    arguments=chunk.text,
                )
            )
        elif chunk.text:
            events.append(TokenEvent(**common, text=chunk.text))
        if chunk.end is not None:
            if chunk.end == "done":
                shown.end = "done"
                events.append(TokenEvent(**common, end="done"))
            else:
                events.append(self._ended(key, shown, "failed"))
        return events

    def _ended(self, key: tuple[int, int], shown: _Attempt, reason: InterruptReason) -> TokenEvent:
        shown.end = "interrupted"
        return TokenEvent(
            session=key[0],
            seq=key[1],
            epoch=shown.epoch,
            attempt=shown.attempt,
            end="interrupted",
            reason=reason,
        )

    def close_open(self) -> list[TokenEvent]:
        """End every stream still open as interrupted (``"abandoned"``): the run
        ended without them. Call it after a :meth:`poll` that read the run ended."""
        out: list[TokenEvent] = []
        for key, shown in sorted(self._shown.items()):
            if shown.end is None:
                self._k += 1
                self._emit(self._ended(key, shown, "abandoned"), f"{self._pos}.{self._k}", out)
        return out


def _ended(end: StreamEnd | None) -> Literal["done", "interrupted"] | None:
    return None if end is None else "done" if end == "done" else "interrupted"


def _with_cursor(event: TokenEvent, cursor: str) -> TokenEvent:
    return TokenEvent(
        session=event.session,
        seq=event.seq,
        attempt=event.attempt,
        text=event.text,
        end=event.end,
        cursor=cursor,
        epoch=event.epoch,
        kind=event.kind,
        reason=event.reason,
        call_index=event.call_index,
        call_id=event.call_id,
        name=event.name,
        arguments=event.arguments,
    )


class Streams(Part):
    """Following the live token streams of an App's runs."""

    def follow_tokens(self, run_id: str | RunHandle, *, after: int | str = 0) -> TokenFollower:
        """A reader of ``run_id``'s token streams after cursor ``after`` (0: from
        what the store still holds). Blocking reads: call ``poll`` off the loop.

        Raises:
            ValueError: ``after`` is not a cursor.
        """
        run_id = run_id_of(run_id)
        return TokenFollower(self._store, run_id, after)

    async def stream(
        self, run_id: str | RunHandle, *, after: int | str = 0, poll_s: float = 0.1
    ) -> AsyncIterator[TokenEvent]:
        """The run's model output as it forms, until the run ends::

            async for event in app.stream(run_id):
                if event.kind == "text" and event.end is None:
                    print(event.text, end="", flush=True)

        The output so far comes first (what the store still holds), then the rest as
        it is written: text (``kind="text"``) and tool calls' arguments as they form
        (``kind="tool_call"``). A stream cut short says ``end="interrupted"`` (its
        output is void) and the retried call's stream follows. ``after`` resumes
        after an event's ``cursor``.

        Raises:
            RunNotFound: there is no such run.
        """
        run_id = run_id_of(run_id)
        follower = await asyncio.to_thread(self.follow_tokens, run_id, after=after)
        while True:
            run = await asyncio.to_thread(self._get_run, run_id)
            for event in await asyncio.to_thread(follower.poll):
                yield event
            if run.finished:  # read after the run ended: nothing more will come
                for event in follower.close_open():
                    yield event
                return
            await asyncio.sleep(poll_s)
