"""A step's live output: text shown while the step runs, never journaled.

A model step hands its reply's text deltas to a :class:`TokenWriter` as they arrive;
the writer appends them to the store's token streams (``Store.append_tokens``) in
batches: what arrived during ``every_s`` (or ``max_chars`` of it, sooner), one row per
batch, off the event loop. So a reply of a thousand tokens costs a few dozen small
writes, not a thousand commits. The stream is best-effort: a store error stops it
(logged) and never fails the step, whose journaled reply is the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

from .._clock import Clock
from ..storage import Store
from ._stepinfo import StepInfo

__all__ = ["TokenWriter"]

log = logging.getLogger("mainspring.streams")

# Every this many streams closed, rows older than KEEP_S go (a reconnecting client
# has that long to catch up on a finished stream; the journal has the reply anyway).
_PRUNE_EVERY = 50
KEEP_S = 600.0
_closed = itertools.count(1)


class TokenWriter:
    """Appends one step attempt's text deltas to its live token stream, in batches.

    Args:
        store / clock: where the rows go, and their ``created_at``.
        step: the step attempt whose stream this is.
        every_s: how long deltas are gathered before a batch is written.
        max_chars: a batch this long is written without waiting.
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        step: StepInfo,
        *,
        every_s: float = 0.08,
        max_chars: int = 1024,
    ) -> None:
        self._store = store
        self._clock = clock
        self._step = step
        self._every_s = every_s
        self._max_chars = max_chars
        self._buffer: list[str] = []
        self._size = 0
        self._idx = 0
        self._full = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._broken = False
        self.batches = 0  # rows written

    def write(self, text: str) -> None:
        """Add a delta; it reaches the store within ``every_s``."""
        if not text or self._broken:
            return
        self._buffer.append(text)
        self._size += len(text)
        if self._size >= self._max_chars:
            self._full.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def close(self, end: str) -> None:
        """Write what is left and end the stream: ``"done"`` (the step has its reply)
        or ``"failed"`` (this attempt's text is void; a retry streams anew)."""
        if self._task is not None:
            self._full.set()
            await asyncio.shield(self._task)
        await self._append(end)
        if end == "done" and next(_closed) % _PRUNE_EVERY == 0 and not self._broken:
            try:
                await asyncio.to_thread(self._store.prune_tokens, self._clock.now() - KEEP_S)
            except Exception:  # best-effort, as the stream itself
                log.warning("pruning old token streams failed", exc_info=True)

    async def _drain(self) -> None:
        try:
            while self._buffer and not self._broken:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self._every_s)
                self._full.clear()
                await self._append(None)
        finally:
            self._task = None

    async def _append(self, end: str | None) -> None:
        if self._broken or (end is None and not self._buffer):
            return
        text = "".join(self._buffer)
        self._buffer.clear()
        self._size = 0
        s = self._step
        try:
            await asyncio.to_thread(
                self._store.append_tokens,
                s.run_id,
                s.session,
                s.seq,
                s.attempt,
                self._idx,
                text,
                self._clock.now(),
                end=end,
            )
        except Exception:
            self._broken = True
            log.warning("the live token stream of %s stopped", s.idempotency_key, exc_info=True)
            return
        self._idx += 1
        self.batches += 1
