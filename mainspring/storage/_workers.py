"""The worker registry (``ms_workers``): which worker processes exist, where they run,
when they last beat and whether they stopped.

A worker writes its row from its heartbeat, inside the heartbeat's own transaction
(statement) when it holds runs and alone when it is idle: registering costs no round
trip per step and one write per beat at most. A graceful stop marks the row stopped;
a worker that went silent for longer than its lease is *dead* (it crashed, was
killed, or lost the database). A row silent for longer than ``forget_before`` says is
deleted by some live worker's beat (``WorkerBeat.forget_before``), so the table holds
the workers of about the last day, not every process that ever ran.

Runs held are read from ``ms_runs`` (the runs a worker owns while ``running``), the
truth a lease is: the registry never keeps a count of its own that could drift.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._connection import Connection, Cursor

__all__ = ["WORKER_STATES", "WorkerBeat", "WorkerRecord", "WorkerState", "WorkerTables"]

WorkerState = Literal["alive", "dead", "stopped"]
WORKER_STATES: tuple[WorkerState, ...] = ("alive", "dead", "stopped")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerBeat:
    """What a worker's heartbeat registers about itself.

    Attributes:
        id: the worker id (``Worker.worker_id``).
        host / pid: where it runs.
        started_at: when it started (epoch seconds).
        lease_s: how long it may stay silent before it counts as dead (its lease).
        forget_before: also delete the rows of workers silent since before this time
            (``None``: not this beat).
    """

    id: str
    host: str
    pid: int
    started_at: float
    lease_s: float
    forget_before: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerRecord:
    """One registered worker, as an operator sees it.

    Attributes:
        beat_at: its last heartbeat (the last renewal of its leases).
        stopped_at: when it stopped gracefully (``None``: it did not).
        runs: the ids of the runs it holds (``running``, owned by it), oldest first.
        lease_until: the latest lease it holds ends then (``None``: it holds none).
    """

    id: str
    host: str
    pid: int
    started_at: float
    beat_at: float
    lease_s: float
    stopped_at: float | None
    runs: tuple[str, ...] = ()
    lease_until: float | None = None

    def state(self, now: float) -> WorkerState:
        """``stopped`` (gracefully), ``dead`` (silent for longer than its lease) or
        ``alive``."""
        if self.stopped_at is not None:
            return "stopped"
        return "dead" if now - self.beat_at > self.lease_s else "alive"

    def age_s(self, now: float) -> float:
        """Seconds since its last heartbeat."""
        return max(0.0, now - self.beat_at)


_UPSERT = (
    "INSERT INTO ms_workers (id, host, pid, started_at, beat_at, lease_s, stopped_at)"
    " VALUES (?, ?, ?, ?, {at}, ?, NULL) ON CONFLICT (id) DO UPDATE SET"
    " beat_at = excluded.beat_at, lease_s = excluded.lease_s, stopped_at = NULL"
)


def register_sql(at: str) -> str:
    """The statement that registers a beat (``at``: the SQL for now)."""
    return _UPSERT.format(at=at)


def register_params(beat: WorkerBeat, at_params: Sequence[Any]) -> list[Any]:
    return [beat.id, beat.host, beat.pid, beat.started_at, *at_params, beat.lease_s]


def register(cur: Cursor, beat: WorkerBeat, at: str, at_params: Sequence[Any]) -> None:
    """Register ``beat`` (and forget long-silent workers) in ``cur``'s transaction."""
    cur.execute(register_sql(at), register_params(beat, at_params))
    if beat.forget_before is not None:
        cur.execute(
            "DELETE FROM ms_workers WHERE beat_at < ? AND id <> ?", (beat.forget_before, beat.id)
        )


class WorkerTables(Connection):
    """The worker registry: methods of every :class:`~mainspring.storage.Store`."""

    def list_workers(self) -> list[WorkerRecord]:
        """Every registered worker, the most recently started first, with the runs
        each holds."""
        with self._snapshot() as cur:
            cur.execute(
                "SELECT id, host, pid, started_at, beat_at, lease_s, stopped_at"
                " FROM ms_workers ORDER BY started_at DESC, id"
            )
            rows = cur.fetchall()
            cur.execute(
                "SELECT owner, id, lease_until FROM ms_runs WHERE status = 'running'"
                " AND owner IS NOT NULL ORDER BY created_at, id"
            )
            held: dict[str, list[tuple[str, float | None]]] = {}
            for owner, run_id, until in cur.fetchall():
                held.setdefault(owner, []).append((run_id, until))
        out = []
        for r in rows:
            mine = held.get(r[0], [])
            leases = [u for _, u in mine if u is not None]
            out.append(
                WorkerRecord(
                    id=r[0],
                    host=r[1],
                    pid=int(r[2]),
                    started_at=float(r[3]),
                    beat_at=float(r[4]),
                    lease_s=float(r[5]),
                    stopped_at=None if r[6] is None else float(r[6]),
                    runs=tuple(rid for rid, _ in mine),
                    lease_until=max(leases) if leases else None,
                )
            )
        return out

    def worker_stopped(self, worker_id: str, now: float) -> None:
        """Mark a worker stopped (its graceful stop): shown as such, never as dead."""
        with self._write() as cur:
            cur.execute(
                "UPDATE ms_workers SET stopped_at = ? WHERE id = ? AND stopped_at IS NULL",
                (now, worker_id),
            )

    def forget_workers(self, before: float) -> int:
        """Delete the rows of workers silent since before ``before``; how many."""
        with self._write() as cur:
            cur.execute("DELETE FROM ms_workers WHERE beat_at < ?", (before,))
            return int(cur.rowcount)
