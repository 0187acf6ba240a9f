"""A worker's eye on the database file: the SQLite write-ahead log.

A read transaction that stays open (an operator's ``sqlite3`` shell, a backup, a
reader that never commits) keeps SQLite from checkpointing: the ``-wal`` file grows
with every commit, silently, and keeps its size once the reader has gone. Now and
then a worker looks at its size; past the limit, it tries a truncating checkpoint
(without waiting for anyone), and if a reader still holds the log, it says so at
WARNING, once a minute while it lasts. ``mainspring_store_wal_bytes``,
``mainspring db status`` and ``mainspring db checkpoint`` show and fix the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .._errors import StoreError, StoreUnavailable
from ..storage import Store

__all__ = ["WalWatch"]

log = logging.getLogger("mainspring.worker")

_EVERY_S = 10.0  # how often a worker looks (real time)
_WARN_EVERY_S = 60.0  # how often it repeats its warning while the log stays past its limit


class WalWatch:
    """Looks at the store's write-ahead log every ``every_s`` seconds."""

    def __init__(
        self,
        worker_id: str,
        every_s: float = _EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker_id = worker_id
        self._monotonic = monotonic
        self.every_s = every_s
        self._next = 0.0
        self._warned = 0.0
        self._off = False  # the store keeps no WAL of its own (PostgreSQL)

    def due(self) -> bool:
        """Whether a look is due (cheap: call it in the event loop)."""
        return not self._off and self._monotonic() >= self._next

    def look(self, store: Store) -> None:
        """Look at the log, truncate it when it is past its limit and nobody holds
        it, warn when somebody does (call it in a thread: it may checkpoint)."""
        now = self._monotonic()
        self._next = now + self.every_s
        try:
            found = store.wal_size()
            if found is None:
                self._off = True
                return
            size, limit = found
            if size <= limit:
                return
            after, limit = store.checkpoint(wait=False) or found
        except (StoreUnavailable, StoreError) as exc:
            log.warning("worker %s: looking at the write-ahead log failed: %s", self.worker_id, exc)
            return
        if after <= limit:
            log.info(
                "event=wal_truncated worker=%s wal_mb_before=%.1f wal_mb=%.1f limit_mb=%.1f",
                self.worker_id,
                size / 1e6,
                after / 1e6,
                limit / 1e6,
            )
            self._warned = 0.0
            return
        if now - self._warned < _WARN_EVERY_S:
            return
        self._warned = now
        log.warning(
            "event=wal_large worker=%s wal_mb=%.1f limit_mb=%.1f: SQLite cannot checkpoint its "
            "write-ahead log while a read transaction holds an old snapshot (an open sqlite3 "
            "shell, a backup, a reader that never commits), so the -wal file grows with every "
            "commit until that transaction ends; end it, and the file shrinks back to the "
            "limit (mainspring db checkpoint truncates it at once)",
            self.worker_id,
            after / 1e6,
            limit / 1e6,
        )
