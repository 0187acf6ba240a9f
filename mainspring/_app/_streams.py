"""Following a run's live token streams: :meth:`Streams.stream` (``async for``) and
:meth:`Streams.follow_tokens` (what the server's ``tokens`` events read). Mixed into
:class:`~mainspring.App`.

The store keeps each model step attempt's text in batches (``ms_stream_chunks``); a
follower reads them in order and says how each stream ended: ``"done"`` (the step has
its reply), or ``"interrupted"`` (the attempt failed, its worker died and the next
attempt's stream began, or the run ended without it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..storage import RunRecord, Store, TokenChunk
from ._handle import RunHandle, run_id_of

__all__ = ["Streams", "TokenEvent", "TokenFollower"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenEvent:
    """A piece of a model step's live text, or the end of its stream.

    Attributes:
        session / seq: the model step's journal position.
        attempt: the step attempt whose stream this is (a retry streams anew).
        text: the text (``""`` in an end event).
        end: ``None`` for text; ``"done"``: the stream is complete and the step has
            its reply; ``"interrupted"``: this attempt's text is void.
        cursor: resume after this (``App.stream(..., after=cursor)``).
    """

    session: int
    seq: int
    attempt: int
    text: str = ""
    end: Literal["done", "interrupted"] | None = None
    cursor: int = 0

    def to_json(self) -> dict[str, object]:
        """The event as the server's ``tokens`` event data."""
        data: dict[str, object] = {
            "type": "tokens",
            "session": self.session,
            "seq": self.seq,
            "attempt": self.attempt,
        }
        if self.end is None:
            data["text"] = self.text
        else:
            data["end"] = self.end
        return data


class TokenFollower:
    """Reads one run's token streams from a cursor on, in order, and marks their ends.

    Not thread-safe: one reader (a server stream, an ``async for``) owns it. Build it
    with :meth:`Streams.follow_tokens`."""

    def __init__(self, store: Store, run_id: str, after: int = 0) -> None:
        self._store = store
        self.run_id = run_id
        self.cursor = max(0, after)
        # The attempt streaming now of each step, and whether its stream ended.
        self._open: dict[tuple[int, int], int] = {}
        if self.cursor:  # what the reader saw already: which streams are open
            for chunk in store.tokens_after(run_id, 0, limit=100_000):
                if chunk.id > self.cursor:
                    break
                self._track(chunk)

    def _track(self, chunk: TokenChunk) -> None:
        key = (chunk.session, chunk.seq)
        if chunk.end is None:
            self._open[key] = chunk.attempt
        else:
            self._open.pop(key, None)

    def poll(self) -> list[TokenEvent]:
        """The events past the cursor (a blocking store read)."""
        out: list[TokenEvent] = []
        for chunk in self._store.tokens_after(self.run_id, self.cursor):
            key = (chunk.session, chunk.seq)
            current = self._open.get(key)
            if current is not None and current != chunk.attempt:
                # A new attempt streams while the last one never ended: its worker died.
                out.append(self._ended(key, current, "interrupted", self.cursor))
            self.cursor = chunk.id
            if chunk.text:
                out.append(
                    TokenEvent(
                        session=chunk.session,
                        seq=chunk.seq,
                        attempt=chunk.attempt,
                        text=chunk.text,
                        cursor=chunk.id,
                    )
                )
            if chunk.end is not None:
                end: Literal["done", "interrupted"] = (
                    "done" if chunk.end == "done" else "interrupted"
                )
                out.append(self._ended(key, chunk.attempt, end, chunk.id))
            else:
                self._open[key] = chunk.attempt
        return out

    def _ended(
        self, key: tuple[int, int], attempt: int, end: Literal["done", "interrupted"], cursor: int
    ) -> TokenEvent:
        self._open.pop(key, None)
        return TokenEvent(session=key[0], seq=key[1], attempt=attempt, end=end, cursor=cursor)

    def close_open(self) -> list[TokenEvent]:
        """End every stream still open as interrupted (the run ended without them)."""
        return [
            self._ended(key, attempt, "interrupted", self.cursor)
            for key, attempt in sorted(self._open.items())
        ]


class Streams:
    """Following the live token streams of an App's runs."""

    if TYPE_CHECKING:

        @property
        def store(self) -> Store: ...

        def get_run(self, run_id: str) -> RunRecord: ...

    def follow_tokens(self, run_id: str | RunHandle, *, after: int = 0) -> TokenFollower:
        """A reader of ``run_id``'s token streams from row ``after`` on (0: from
        what the store still holds). Blocking reads: call ``poll`` off the loop."""
        run_id = run_id_of(run_id)
        return TokenFollower(self.store, run_id, after)

    async def stream(
        self, run_id: str | RunHandle, *, after: int = 0, poll_s: float = 0.1
    ) -> AsyncIterator[TokenEvent]:
        """The run's model output as it forms, until the run ends::

            async for event in app.stream(run_id):
                if event.end is None:
                    print(event.text, end="", flush=True)

        The text so far comes first (what the store still holds), then the rest as it
        is written. A stream cut short says ``end="interrupted"`` and the retried
        call's stream follows. ``after`` resumes after an event's ``cursor``.

        Raises:
            RunNotFound: there is no such run.
        """
        run_id = run_id_of(run_id)
        follower = await asyncio.to_thread(self.follow_tokens, run_id, after=after)
        while True:
            run = await asyncio.to_thread(self.get_run, run_id)
            for event in await asyncio.to_thread(follower.poll):
                yield event
            if run.finished:  # read after the run ended: nothing more will come
                for event in follower.close_open():
                    yield event
                return
            await asyncio.sleep(poll_s)
