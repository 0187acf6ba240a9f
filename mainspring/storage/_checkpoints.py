"""Checkpoints that integrations keep in this database (``ms_checkpoints``,
``ms_checkpoint_blobs``, ``ms_checkpoint_writes``): a LangGraph graph's checkpoints,
its channels' values (one row per channel version) and pending writes, by thread,
namespace and checkpoint id.

The store keeps them as opaque text (the integration serialises them) and knows one
thing about them: a thread may be a run's (its id is the run's id). A write can be
*fenced* by that run: made only while the run is ``running`` at the epoch the writer
holds (a stale worker writes nothing), or, for a writer from outside, only once the
run has finished (its executions own its state until then).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._connection import Connection, Cursor
from ._rows import _given

__all__ = ["CheckpointRow", "CheckpointTables", "CheckpointWrite"]

_COLUMNS = (
    "thread_id, checkpoint_ns, checkpoint_id, parent_id, position, checkpoint, metadata, created_at"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRow:
    """One checkpoint as stored.

    Attributes:
        position: its place among the checkpoints a run's executions mirrored
            (``None`` for one written by anything else).
        checkpoint / metadata: the integration's own serialisation.
    """

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    position: int | None
    checkpoint: str
    metadata: str
    created_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointWrite:
    """One pending write of a task, stored under its checkpoint."""

    task_id: str
    idx: int
    channel: str
    value: str
    task_path: str = ""


def _row(r: Sequence[object]) -> CheckpointRow:
    return CheckpointRow(
        thread_id=str(r[0]),
        checkpoint_ns=str(r[1]),
        checkpoint_id=str(r[2]),
        parent_id=None if r[3] is None else str(r[3]),
        position=None if r[4] is None else int(str(r[4])),
        checkpoint=str(r[5]),
        metadata=str(r[6]),
        created_at=float(str(r[7])),
    )


class CheckpointTables(Connection):
    """The store's part that keeps integrations' checkpoints."""

    def _fence_ok(self, cur: Cursor, run_id: str | None, epoch: int | None) -> bool:
        """Whether a write fenced by ``run_id`` may go ahead: the run is ``running`` at
        ``epoch`` (a holder's write), or, with ``epoch=None``, it has finished (an
        edit from outside; a thread that is no run's is anybody's)."""
        if run_id is None:
            return True
        cur.execute(f"SELECT epoch, status FROM ms_runs WHERE id = ?{self._row_lock}", (run_id,))
        row = cur.fetchone()
        if epoch is None:
            return row is None or row[1] in ("succeeded", "failed", "cancelled")
        return row is not None and row[1] == "running" and int(row[0]) == epoch

    def put_checkpoint(
        self,
        row: CheckpointRow,
        blobs: Sequence[tuple[str, str, str]] = (),
        *,
        fence_run: str | None = None,
        fence_epoch: int | None = None,
    ) -> bool:
        """Store a checkpoint (the same id again replaces it) with the channel values
        it introduced, ``(channel, version, value)`` (a version already stored stays);
        ``False`` when the fence refused it (nothing written).

        Args:
            fence_run: the run whose thread this is: with ``fence_epoch``, write only
                while it is ``running`` at that epoch; without, only once it has
                finished.
        """
        with self._write() as cur:
            if not self._fence_ok(cur, fence_run, fence_epoch):
                return False
            cur.execute(
                "DELETE FROM ms_checkpoints WHERE thread_id = ? AND checkpoint_ns = ?"
                " AND checkpoint_id = ?",
                (row.thread_id, row.checkpoint_ns, row.checkpoint_id),
            )
            cur.execute(
                f"INSERT INTO ms_checkpoints ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.thread_id,
                    row.checkpoint_ns,
                    row.checkpoint_id,
                    row.parent_id,
                    row.position,
                    row.checkpoint,
                    row.metadata,
                    row.created_at,
                ),
            )
            for channel, version, value in blobs:
                cur.execute(
                    "SELECT 1 FROM ms_checkpoint_blobs WHERE thread_id = ? AND checkpoint_ns = ?"
                    " AND channel = ? AND version = ?",
                    (row.thread_id, row.checkpoint_ns, channel, version),
                )
                if cur.fetchone() is None:
                    cur.execute(
                        "INSERT INTO ms_checkpoint_blobs"
                        " (thread_id, checkpoint_ns, channel, version, value)"
                        " VALUES (?, ?, ?, ?, ?)",
                        (row.thread_id, row.checkpoint_ns, channel, version, value),
                    )
        return True

    def checkpoint_blobs(
        self, thread_id: str, checkpoint_ns: str, versions: dict[str, str]
    ) -> dict[str, str]:
        """The stored values of ``{channel: version}`` (those stored), by channel."""
        if not versions:
            return {}
        found: dict[str, str] = {}
        with self._read() as cur:
            for channel, version in versions.items():
                cur.execute(
                    "SELECT value FROM ms_checkpoint_blobs WHERE thread_id = ?"
                    " AND checkpoint_ns = ? AND channel = ? AND version = ?",
                    (thread_id, checkpoint_ns, channel, version),
                )
                row = cur.fetchone()
                if row is not None:
                    found[channel] = str(row[0])
        return found

    def put_checkpoint_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[CheckpointWrite],
        *,
        replace: bool,
        fence_run: str | None = None,
        fence_epoch: int | None = None,
    ) -> bool:
        """Store a task's pending writes under a checkpoint. ``replace``: a write at the
        same ``(task_id, idx)`` is replaced (LangGraph's special channels); otherwise
        the first one stays (a re-sent write is harmless). ``False`` when the fence
        refused them (see :meth:`put_checkpoint`)."""
        key = (thread_id, checkpoint_ns, checkpoint_id)
        with self._write() as cur:
            if not self._fence_ok(cur, fence_run, fence_epoch):
                return False
            for w in writes:
                cur.execute(
                    "SELECT 1 FROM ms_checkpoint_writes WHERE thread_id = ? AND checkpoint_ns = ?"
                    " AND checkpoint_id = ? AND task_id = ? AND idx = ?",
                    (*key, w.task_id, w.idx),
                )
                if cur.fetchone() is not None:
                    if not replace:
                        continue
                    cur.execute(
                        "DELETE FROM ms_checkpoint_writes WHERE thread_id = ?"
                        " AND checkpoint_ns = ? AND checkpoint_id = ? AND task_id = ? AND idx = ?",
                        (*key, w.task_id, w.idx),
                    )
                cur.execute(
                    "INSERT INTO ms_checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id,"
                    " task_id, idx, channel, value, task_path) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (*key, w.task_id, w.idx, w.channel, w.value, w.task_path),
                )
        return True

    def get_checkpoint(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None = None
    ) -> CheckpointRow | None:
        """A checkpoint by id, or the thread's newest in that namespace (ids sort by
        time: LangGraph's are uuid6)."""
        with self._read() as cur:
            if checkpoint_id is None:
                cur.execute(
                    f"SELECT {_COLUMNS} FROM ms_checkpoints WHERE thread_id = ?"
                    " AND checkpoint_ns = ? ORDER BY checkpoint_id DESC LIMIT 1",
                    (thread_id, checkpoint_ns),
                )
            else:
                cur.execute(
                    f"SELECT {_COLUMNS} FROM ms_checkpoints WHERE thread_id = ?"
                    " AND checkpoint_ns = ? AND checkpoint_id = ?",
                    (thread_id, checkpoint_ns, checkpoint_id),
                )
            found = cur.fetchone()
        return None if found is None else _row(found)

    def list_checkpoints(
        self,
        *,
        thread_id: str | None = None,
        checkpoint_ns: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[CheckpointRow]:
        """Checkpoints, newest first, of one thread (or all), in one namespace (or
        all), older than the id ``before``, at most ``limit``."""
        where, params = _given(thread_id=thread_id, checkpoint_ns=checkpoint_ns)
        if before is not None:
            where.append("checkpoint_id < ?")
            params.append(before)
        sql = f"SELECT {_COLUMNS} FROM ms_checkpoints"
        if where:
            sql += " WHERE " + " AND ".join(where)
        # Newest first within a thread (LangGraph's ids sort by time).
        order = "checkpoint_id DESC" if thread_id is not None else "thread_id, checkpoint_id DESC"
        sql += f" ORDER BY {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._read() as cur:
            cur.execute(sql, params)
            return [_row(r) for r in cur.fetchall()]

    def checkpoint_writes(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> list[CheckpointWrite]:
        """The pending writes stored under a checkpoint, by task and index."""
        with self._read() as cur:
            cur.execute(
                "SELECT task_id, idx, channel, value, task_path FROM ms_checkpoint_writes"
                " WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
                " ORDER BY task_id, idx",
                (thread_id, checkpoint_ns, checkpoint_id),
            )
            rows = cur.fetchall()
        return [
            CheckpointWrite(
                task_id=str(r[0]),
                idx=int(r[1]),
                channel=str(r[2]),
                value=str(r[3]),
                task_path=str(r[4]),
            )
            for r in rows
        ]

    def checkpoint_at(self, thread_id: str, checkpoint_ns: str, position: int) -> str | None:
        """The id of the checkpoint a run's executions mirrored at ``position``."""
        with self._read() as cur:
            cur.execute(
                "SELECT checkpoint_id FROM ms_checkpoints WHERE thread_id = ?"
                " AND checkpoint_ns = ? AND position = ?",
                (thread_id, checkpoint_ns, position),
            )
            found = cur.fetchone()
        return None if found is None else str(found[0])

    def delete_checkpoints(self, thread_id: str) -> None:
        """Every checkpoint and pending write of a thread, in every namespace."""
        with self._write() as cur:
            cur.execute("DELETE FROM ms_checkpoints WHERE thread_id = ?", (thread_id,))
            cur.execute("DELETE FROM ms_checkpoint_writes WHERE thread_id = ?", (thread_id,))
            cur.execute("DELETE FROM ms_checkpoint_blobs WHERE thread_id = ?", (thread_id,))
