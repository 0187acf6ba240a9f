"""Live token streams (``ms_stream_chunks``): a model step's output while it is made.

Not the journal: the journal keeps a model step's final reply, and these rows only let
readers (the server's ``tokens`` events, ``App.stream``) watch it form. A writer appends
one row per batch of deltas (never one per token), numbered ``idx`` within its
``(run, session, seq, attempt)``; the last row of an attempt that ended says how
(``end_reason``: ``"done"`` or ``"failed"``); an attempt whose worker died has no end
row, and the next attempt's rows follow it. Readers page by the row ``id``. Rows go by
age (:meth:`StreamTables.prune_tokens`) and with their run (``prune``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._connection import Connection

__all__ = ["StreamTables", "TokenChunk"]

_COLUMNS = "id, run_id, session, seq, attempt, idx, text, end_reason, created_at"


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenChunk:
    """One batch of a model step's output deltas.

    Attributes:
        id: the row's number: readers resume after it.
        session / seq: the model step's journal position.
        attempt: which attempt of the step wrote it (a retry starts a new stream).
        idx: its place in that attempt's stream, from 0.
        text: the deltas, concatenated ("" in an end row with nothing left to say).
        end: ``None`` while the stream goes on; ``"done"`` or ``"failed"`` in its last row.
    """

    id: int
    run_id: str
    session: int
    seq: int
    attempt: int
    idx: int
    text: str
    end: str | None
    created_at: float


class StreamTables(Connection):
    """The store's part that keeps live token streams."""

    def append_tokens(
        self,
        run_id: str,
        session: int,
        seq: int,
        attempt: int,
        idx: int,
        text: str,
        now: float,
        *,
        end: str | None = None,
    ) -> None:
        """Append one batch of a step attempt's deltas (``end``: the stream's last)."""
        if end not in (None, "done", "failed"):
            raise ValueError(f"a token stream ends 'done' or 'failed', got {end!r}")
        with self._write() as cur:
            cur.execute(
                "INSERT INTO ms_stream_chunks"
                " (run_id, session, seq, attempt, idx, text, end_reason, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, session, seq, attempt, idx, text, end, now),
            )

    def tokens_after(
        self, run_id: str, after_id: int = 0, *, limit: int = 1000
    ) -> list[TokenChunk]:
        """The run's stream rows with an id past ``after_id``, oldest first."""
        with self._read() as cur:
            cur.execute(
                f"SELECT {_COLUMNS} FROM ms_stream_chunks WHERE run_id = ? AND id > ?"
                " ORDER BY id LIMIT ?",
                (run_id, after_id, limit),
            )
            rows = cur.fetchall()
        return [
            TokenChunk(
                id=int(r[0]),
                run_id=r[1],
                session=int(r[2]),
                seq=int(r[3]),
                attempt=int(r[4]),
                idx=int(r[5]),
                text=r[6],
                end=r[7],
                created_at=float(r[8]),
            )
            for r in rows
        ]

    def prune_tokens(self, before: float) -> int:
        """Delete stream rows written before ``before``; how many went."""
        with self._write() as cur:
            cur.execute("DELETE FROM ms_stream_chunks WHERE created_at < ?", (before,))
            return int(cur.rowcount)
