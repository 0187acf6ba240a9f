"""Live token streams (``ms_stream_chunks``): a model step's output while it is made.

Not the journal: the journal keeps a model step's final reply, and these rows only let
readers (the server's ``tokens`` events, ``App.stream``) watch it form. They are held
to the journal's rules all the same:

- **Fenced.** A writer appends a batch of rows for one step attempt, at the epoch of
  the execution that runs it; the append is refused (``False``, nothing written) unless
  the run is ``running`` at that epoch, so a worker frozen past its lease writes
  nothing once another has taken the run over.
- **Paged by commit order.** Each row gets ``pos``, its place among its run's stream
  rows, from the run's ``ms_stream_heads`` row, which the append updates and so holds
  locked until it commits: two appends to one run commit in ``pos`` order. A reader
  that pages by ``pos > cursor`` can therefore never step over a row that commits
  late, as paging by ``id`` can on PostgreSQL (an id is taken at INSERT and becomes
  visible at COMMIT: with two writers, a row can appear behind a higher id already
  read). ``pos`` counts up for the run's whole life, through pruning.

Each row is one batch of one part of an attempt's output: the reply's ``text``, or one
tool call's arguments (``kind = "tool_call"``, with the call's index, id and tool name),
numbered ``idx`` within its ``(run, session, seq, epoch, attempt)``. The last row of an
attempt that ended says how (``end_reason``: ``"done"`` or ``"failed"``); an attempt
whose worker died has no end row. Rows go by age (:meth:`StreamTables.prune_tokens`)
and with their run (``prune``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from ._connection import Connection, Cursor
from ._transitions import fenced

__all__ = ["StreamEnd", "StreamTables", "TokenChunk", "TokenKind", "TokenPiece", "TokenStream"]

TokenKind: TypeAlias = Literal["text", "tool_call"]
StreamEnd: TypeAlias = Literal["done", "failed"]

_COLUMNS = (
    "pos, run_id, session, seq, epoch, attempt, idx, kind, call_index, call_id, name,"
    " text, end_reason, created_at"
)
# What an append writes, in this order (``pos`` is handed out by the append itself).
APPEND_COLUMNS = (
    "run_id, session, seq, epoch, attempt, idx, kind, call_index, call_id, name, text,"
    " end_reason, created_at, pos"
)
# The fence and the run's next places in one statement: a row for the run's head only
# if the run is running at the writer's epoch, added to (and so locked until the
# commit) when there is one already. Nothing comes back when the fence refuses.
APPEND_HEAD = (
    "INSERT INTO ms_stream_heads AS h (run_id, pos) SELECT id, ? FROM ms_runs"
    f" WHERE id = ? AND {fenced()}"
    " ON CONFLICT (run_id) DO UPDATE SET pos = h.pos + excluded.pos RETURNING pos"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenPiece:
    """What a writer appends as one row: a batch of one part's deltas.

    Attributes:
        text: the deltas, concatenated (``""`` may announce a tool call whose
            arguments have not begun, or carry only the stream's end).
        kind: ``"text"``, the reply's text; ``"tool_call"``, a tool call's arguments.
        call_index: the tool call's place in the reply (0, 1, ...); ``None`` for text.
        call_id / name: the tool call's id and tool name, as far as known yet.
    """

    text: str
    kind: TokenKind = "text"
    call_index: int | None = None
    call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenChunk:
    """One batch of a model step's output deltas, as stored.

    Attributes:
        pos: the row's place among its run's stream rows, in commit order: readers
            resume after it.
        session / seq: the model step's journal position.
        epoch: the epoch of the execution that wrote it.
        attempt: which attempt of the step wrote it (a retry starts a new stream).
        idx: its place in that attempt's stream, from 0.
        kind / call_index / call_id / name: what part of the reply it holds
            (:class:`TokenPiece`).
        text: the deltas, concatenated.
        end: ``None`` while the stream goes on; ``"done"`` or ``"failed"`` in its last row.
    """

    pos: int
    run_id: str
    session: int
    seq: int
    epoch: int
    attempt: int
    idx: int
    kind: TokenKind
    call_index: int | None
    call_id: str | None
    name: str | None
    text: str
    end: StreamEnd | None
    created_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenStream:
    """One step attempt's stream as far as a reader has read (:meth:`token_streams`)."""

    session: int
    seq: int
    epoch: int
    attempt: int
    end: StreamEnd | None


class StreamTables(Connection):
    """The store's part that keeps live token streams."""

    def append_tokens(
        self,
        run_id: str,
        *,
        epoch: int,
        session: int,
        seq: int,
        attempt: int,
        idx: int,
        pieces: Sequence[TokenPiece],
        now: float,
        end: StreamEnd | None = None,
    ) -> bool:
        """Append a batch of a step attempt's stream, fenced: one row per piece,
        numbered from ``idx``; ``end`` marks the last row as the stream's last (an
        empty text row is added to carry it when there are no pieces).

        Returns:
            ``False`` when the run is not ``running`` at ``epoch`` (a worker that lost
            its lease): nothing was written, and nothing more of this attempt should be.
        """
        if end not in (None, "done", "failed"):
            raise ValueError(f"a token stream ends 'done' or 'failed', got {end!r}")
        if not pieces:
            if end is None:
                raise ValueError("an append of a token stream needs pieces or an end")
            pieces = [TokenPiece(text="")]
        last = len(pieces) - 1
        rows = [
            (
                run_id,
                session,
                seq,
                epoch,
                attempt,
                idx + i,
                p.kind,
                p.call_index,
                p.call_id,
                p.name,
                p.text,
                end if i == last else None,
                now,
                i + 1,  # within the batch: the append turns it into the run's place
            )
            for i, p in enumerate(pieces)
        ]
        return self._append_stream(run_id, epoch, rows)

    def _append_stream(self, run_id: str, epoch: int, rows: list[tuple[Any, ...]]) -> bool:
        """Fence, take the run's next ``len(rows)`` places and insert, in one write
        transaction (a dialect may do it in one statement: PostgreSQL)."""
        with self._write() as cur:
            cur.execute(APPEND_HEAD, (len(rows), run_id, epoch))
            head = cur.fetchone()
            if head is None:
                return False
            base = int(head[0]) - len(rows)
            _insert(cur, [(*r[:-1], base + r[-1]) for r in rows])
        return True

    def tokens_after(self, run_id: str, after: int = 0, *, limit: int = 1000) -> list[TokenChunk]:
        """The run's stream rows past place ``after``, in commit order."""
        with self._read() as cur:
            cur.execute(
                f"SELECT {_COLUMNS} FROM ms_stream_chunks WHERE run_id = ? AND pos > ?"
                " ORDER BY pos LIMIT ?",
                (run_id, after, limit),
            )
            rows = cur.fetchall()
        return [
            TokenChunk(
                pos=int(r[0]),
                run_id=r[1],
                session=int(r[2]),
                seq=int(r[3]),
                epoch=int(r[4]),
                attempt=int(r[5]),
                idx=int(r[6]),
                kind=r[7],
                call_index=None if r[8] is None else int(r[8]),
                call_id=r[9],
                name=r[10],
                text=r[11],
                end=r[12],
                created_at=float(r[13]),
            )
            for r in rows
        ]

    def token_streams(self, run_id: str, through: int) -> list[TokenStream]:
        """Every step attempt with rows up to place ``through``, and its end if that
        was among them: what a reader resuming after ``through`` has seen."""
        with self._read() as cur:
            cur.execute(
                "SELECT session, seq, epoch, attempt, MAX(end_reason) FROM ms_stream_chunks"
                " WHERE run_id = ? AND pos <= ? GROUP BY session, seq, epoch, attempt",
                (run_id, through),
            )
            rows = cur.fetchall()
        return [
            TokenStream(session=int(s), seq=int(q), epoch=int(e), attempt=int(a), end=end)
            for s, q, e, a, end in rows
        ]

    def prune_tokens(self, before: float) -> int:
        """Delete stream rows written before ``before``; how many went. (The runs'
        heads stay: places keep counting up.)"""
        with self._write() as cur:
            cur.execute("DELETE FROM ms_stream_chunks WHERE created_at < ?", (before,))
            return int(cur.rowcount)


def _insert(cur: Cursor, rows: list[tuple[Any, ...]]) -> None:
    marks = ", ".join("?" * len(rows[0]))
    sql = f"INSERT INTO ms_stream_chunks ({APPEND_COLUMNS}) VALUES ({marks})"
    if len(rows) == 1:
        cur.execute(sql, rows[0])
    else:
        cur.executemany(sql, rows)
