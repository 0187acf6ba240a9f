"""A step's live output: text shown while the step runs, never journaled.

A model step hands its reply's deltas (text, and tool calls' arguments as they form) to
a :class:`TokenWriter` as they arrive; the writer appends them to the store's token
streams (``Store.append_tokens``) in batches: what arrived during ``every_s`` (or
``max_chars`` of it, sooner), one row per part of the reply, off the event loop. So a
reply of a thousand tokens costs a few dozen small writes, not a thousand commits.

Every append is fenced by the epoch of the execution that runs the step, as the
journal is: once another worker has taken the run over, the store refuses the rows and
the writer stops, silently for the step (the step's own commit will say the lease was
lost). Secrets are redacted on the way in by the App's redactor, piece by piece, with
a short tail held back so that a secret split across two batches is still caught. The
stream is best-effort: a store error stops it (logged) and never fails the step, whose
journaled reply is the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from .._clock import Clock
from ..storage import Store, StreamEnd, TokenPiece
from ._stepinfo import StepInfo

__all__ = ["LiveRedaction", "TokenWriter"]

log = logging.getLogger("mainspring.streams")

# Every this many streams closed, rows older than KEEP_S go (a reconnecting client
# has that long to catch up on a finished stream; the journal has the reply anyway).
_PRUNE_EVERY = 50
KEEP_S = 600.0
_closed = itertools.count(1)


class LiveRedaction(Protocol):
    """Redaction of one text that arrives in pieces (the App's redactor's ``live()``):
    what ``feed`` and ``end`` return, joined, is the whole text redacted."""

    def feed(self, text: str) -> str: ...

    def end(self) -> str: ...


@dataclass(slots=True)
class _Part:
    """One part of the reply being streamed: its text, or one tool call."""

    kind: Literal["text", "tool_call"]
    redaction: LiveRedaction | None
    call_index: int | None = None
    call_id: str | None = None
    name: str | None = None
    pending: list[str] = field(default_factory=list)
    announced: bool = False  # a tool call's first row went out (its name, at least)

    def take(self, *, last: bool) -> TokenPiece | None:
        raw = "".join(self.pending)
        self.pending.clear()
        text = raw
        if self.redaction is not None:
            text = self.redaction.feed(raw) + (self.redaction.end() if last else "")
        if not text and (self.kind == "text" or self.announced):
            return None
        self.announced = True
        return TokenPiece(
            text=text,
            kind=self.kind,
            call_index=self.call_index,
            call_id=self.call_id,
            name=self.name,
        )


class TokenWriter:
    """Appends one step attempt's output deltas to its live token stream, in batches.

    Args:
        store / clock: where the rows go, and their ``created_at``.
        step: the step attempt whose stream this is.
        epoch: the epoch of the execution running it: every append is fenced by it.
        redaction: makes a :class:`LiveRedaction` for each part of the reply (the
            App's redactor); ``None``: the text goes out as it is.
        every_s: how long deltas are gathered before a batch is written.
        max_chars: a batch this long is written without waiting.
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        step: StepInfo,
        epoch: int,
        *,
        redaction: Callable[[], LiveRedaction] | None = None,
        every_s: float = 0.08,
        max_chars: int = 1024,
    ) -> None:
        self._store = store
        self._clock = clock
        self._step = step
        self._epoch = epoch
        self._redaction = redaction
        self._every_s = every_s
        self._max_chars = max_chars
        self._parts: dict[int | None, _Part] = {}  # None: the text; else a call's index
        self._dirty: list[int | None] = []  # parts with deltas since the last batch
        self._size = 0
        self._idx = 0
        self._full = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Why the stream stopped early: the run moved on (nothing more may be written),
        # or the store failed (the end still says the text is void, if it can).
        self._stopped: Literal["fenced", "broken"] | None = None
        self.batches = 0  # appends that went through

    def write(self, text: str) -> None:
        """Add a delta of the reply's text; it reaches the store within ``every_s``."""
        if text:
            self._add(None, "text", text, None, None)

    def tool_call(self, index: int, call_id: str | None, name: str | None, arguments: str) -> None:
        """Add a delta of the arguments of the reply's tool call number ``index``
        (``call_id`` and ``name`` as far as known: providers send them first). The
        first delta of a call goes out even when empty, so readers see the call begin."""
        self._add(index, "tool_call", arguments, call_id or None, name or None)

    def _add(
        self,
        key: int | None,
        kind: Literal["text", "tool_call"],
        text: str,
        call_id: str | None,
        name: str | None,
    ) -> None:
        if self._stopped is not None:
            return
        part = self._parts.get(key)
        if part is None:
            redaction = self._redaction() if self._redaction is not None else None
            part = self._parts[key] = _Part(kind, redaction, call_index=key)
        part.call_id = call_id or part.call_id
        part.name = name or part.name
        part.pending.append(text)
        if key not in self._dirty:
            self._dirty.append(key)
        self._size += len(text)
        if self._size >= self._max_chars:
            self._full.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def close(self, end: StreamEnd) -> None:
        """Write what is left and end the stream: ``"done"`` (the step has its reply)
        or ``"failed"`` (this attempt's text is void; a retry streams anew)."""
        if self._task is not None:
            self._full.set()
            await asyncio.shield(self._task)
        if self._stopped == "broken":
            # Some of the text may be missing: say the stream is void, if we can.
            end, self._stopped = "failed", None
            self._parts.clear()
        await self._append(end)
        if end == "done" and next(_closed) % _PRUNE_EVERY == 0 and self._stopped is None:
            try:
                await asyncio.to_thread(self._store.prune_tokens, self._clock.now() - KEEP_S)
            except Exception:  # best-effort, as the stream itself
                log.warning("pruning old token streams failed", exc_info=True)

    async def _drain(self) -> None:
        try:
            while self._dirty and self._stopped is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self._every_s)
                self._full.clear()
                await self._append(None)
        finally:
            self._task = None

    async def _append(self, end: StreamEnd | None) -> None:
        if self._stopped is not None:
            return
        last = end is not None
        keys = list(self._parts) if last else self._dirty
        taken = [self._parts[k].take(last=last) for k in keys]
        self._dirty = []
        self._size = 0
        pieces = [p for p in taken if p is not None]
        if not pieces and not last:
            return  # everything is held back, for now
        s = self._step
        try:
            appended = await asyncio.to_thread(
                self._store.append_tokens,
                s.run_id,
                epoch=self._epoch,
                session=s.session,
                seq=s.seq,
                attempt=s.attempt,
                idx=self._idx,
                pieces=pieces,
                now=self._clock.now(),
                end=end,
            )
        except Exception:
            self._stopped = "broken"
            log.warning("the live token stream of %s stopped", s.idempotency_key, exc_info=True)
            return
        if not appended:
            self._stopped = "fenced"
            log.info(
                "the live token stream of %s stopped: the run is no longer running at "
                "epoch %d (another worker took it over, or it ended)",
                s.idempotency_key,
                self._epoch,
            )
            return
        self._idx += max(1, len(pieces))
        self.batches += 1
