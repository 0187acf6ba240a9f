"""Schedules in the store: one ``ms_schedules`` row per schedule, with the next time
it is due (``next_at``), whether it is paused, and the last run it started.

Any number of workers tick the schedules. A tick that finds a schedule due fires it
with :meth:`ScheduleTables.fire_schedule`: one transaction that moves ``next_at``
on with a conditional UPDATE (``WHERE next_at = <the value the worker read>``) and,
only if that UPDATE changed the row, inserts the run. Two workers ticking at once
both read the same ``next_at``; the first UPDATE to commit changes it, so the
other's matches no row and inserts nothing. The run's idempotency key
(``schedule:<name>:<due time>``) is a second guard: a due time never names two runs.

Whose clock. Due times are compared with the database's clock
(:meth:`ScheduleTables.database_now`), not with each worker's: a worker whose clock
runs ahead would otherwise fire runs early and move ``next_at`` past due times that
then start nothing. PostgreSQL reads its server's clock (as leases do); SQLite reads
the clock of the machine that holds the file (every worker of a SQLite store runs
there), through SQLite itself, so a process that keeps a clock of its own (an App's
injected clock) cannot skew it either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ._connection import Connection

__all__ = ["CatchUp", "ScheduleRecord", "ScheduleTables"]

CatchUp = Literal["skip", "once"]

_COLUMNS = (
    "name, cron, tz, workflow, input, catch_up, next_at, paused, last_at, last_run,"
    " created_at, updated_at, queue"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRecord:
    """A schedule as stored.

    Attributes:
        name: the schedule's name (unique).
        cron: the cron expression (five fields), read in ``tz``.
        tz: the IANA time zone its times are wall times of (``"UTC"``, ``"Europe/Paris"``).
        workflow: the registered name of the workflow it starts.
        input: the run's encoded input (what the workflow was given with the schedule).
        catch_up: ``"skip"`` or ``"once"`` (docs/schedules-and-queues.md).
        next_at: when it is next due (seconds since the epoch).
        paused: a paused schedule starts nothing until resumed.
        last_at: the due time of the last run it started, or None.
        last_run: that run's id, or None.
        queue: the queue its runs start in (within its limits), or None.
    """

    name: str
    cron: str
    tz: str
    workflow: str
    input: str
    catch_up: CatchUp
    next_at: float
    paused: bool
    last_at: float | None
    last_run: str | None
    created_at: float
    updated_at: float
    queue: str | None = None

    def summary(self) -> dict[str, Any]:
        """The schedule as JSON-ready data (what the CLI's ``--json`` and the HTTP
        API show): every field but the encoded input and the row's timestamps."""
        return {
            "name": self.name,
            "cron": self.cron,
            "tz": self.tz,
            "workflow": self.workflow,
            "catch_up": self.catch_up,
            "queue": self.queue,
            "paused": self.paused,
            "next_at": self.next_at,
            "last_at": self.last_at,
            "last_run": self.last_run,
        }


def _record(row: Any) -> ScheduleRecord:
    return ScheduleRecord(
        name=row[0],
        cron=row[1],
        tz=row[2],
        workflow=row[3],
        input=row[4],
        catch_up=row[5],
        next_at=float(row[6]),
        paused=bool(row[7]),
        last_at=None if row[8] is None else float(row[8]),
        last_run=row[9],
        created_at=float(row[10]),
        updated_at=float(row[11]),
        queue=row[12],
    )


# SQLite's reading of its machine's clock, in seconds since the epoch (millisecond
# resolution): the Julian day of 1970-01-01T00:00:00Z is 2440587.5.
_MACHINE_NOW = "(julianday('now') - 2440587.5) * 86400.0"


class ScheduleTables(Connection):
    """Schedules: methods of every :class:`~mainspring.storage.Store`."""

    def database_now(self) -> float:
        """The database's clock, in seconds since the epoch: the server's on
        PostgreSQL; on SQLite the clock of the machine that holds the file, as SQLite
        reads it. What schedules are due by, whatever the caller's clock says."""
        with self._read() as cur:
            cur.execute(f"SELECT {self._db_now or _MACHINE_NOW}")
            return float(cur.fetchone()[0])

    def put_schedule(
        self,
        *,
        name: str,
        cron: str,
        tz: str,
        workflow: str,
        input: str,
        catch_up: CatchUp,
        next_at: float,
        now: float,
        queue: str | None = None,
    ) -> tuple[ScheduleRecord, bool]:
        """Store a schedule's definition: insert it with ``next_at``, or, if a
        schedule of that name exists with another definition (cron, zone, workflow,
        input, catch-up or queue), rewrite it and start it afresh from ``next_at``. An
        unchanged definition is left as it is (its ``next_at`` and pause kept).

        Returns ``(record, changed)``: changed is True if a row was inserted or
        rewritten.
        """
        definition = (cron, tz, workflow, input, catch_up, queue)
        with self._write() as cur:
            cur.execute(
                "INSERT INTO ms_schedules (name, cron, tz, workflow, input, catch_up, queue,"
                " next_at, paused, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?)"
                " ON CONFLICT (name) DO NOTHING",
                (name, *definition, next_at, now, now),
            )
            changed = cur.rowcount == 1
            if not changed:
                cur.execute(
                    "UPDATE ms_schedules SET cron = ?, tz = ?, workflow = ?, input = ?,"
                    " catch_up = ?, queue = ?, next_at = ?, updated_at = ? WHERE name = ? AND NOT"
                    " (cron = ? AND tz = ? AND workflow = ? AND input = ? AND catch_up = ?"
                    " AND COALESCE(queue, '') = COALESCE(?, ''))",
                    (*definition, next_at, now, name, *definition),
                )
                changed = cur.rowcount == 1
            cur.execute(f"SELECT {_COLUMNS} FROM ms_schedules WHERE name = ?", (name,))
            return _record(cur.fetchone()), changed

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        with self._read() as cur:
            cur.execute(f"SELECT {_COLUMNS} FROM ms_schedules WHERE name = ?", (name,))
            row = cur.fetchone()
            return None if row is None else _record(row)

    def list_schedules(self) -> list[ScheduleRecord]:
        """Every schedule, by name."""
        with self._read() as cur:
            cur.execute(f"SELECT {_COLUMNS} FROM ms_schedules ORDER BY name")
            return [_record(row) for row in cur.fetchall()]

    def due_schedules(self, now: float) -> list[ScheduleRecord]:
        """The schedules not paused whose ``next_at`` is at or before ``now``."""
        with self._read() as cur:
            cur.execute(
                f"SELECT {_COLUMNS} FROM ms_schedules WHERE paused = 0 AND next_at <= ?"
                " ORDER BY next_at, name",
                (now,),
            )
            return [_record(row) for row in cur.fetchall()]

    def set_schedule_paused(
        self, name: str, paused: bool, *, now: float, next_at: float | None = None
    ) -> bool:
        """Pause or resume ``name``; ``next_at``: when it is next due from now on
        (a resume passes it, so that the times that passed while it was paused start
        nothing). Returns False if there is no such schedule."""
        with self._write() as cur:
            if next_at is None:
                cur.execute(
                    "UPDATE ms_schedules SET paused = ?, updated_at = ? WHERE name = ?",
                    (int(paused), now, name),
                )
            else:
                cur.execute(
                    "UPDATE ms_schedules SET paused = ?, next_at = ?, updated_at = ?"
                    " WHERE name = ?",
                    (int(paused), next_at, now, name),
                )
            return cur.rowcount == 1

    def fire_schedule(
        self,
        *,
        name: str,
        seen_next_at: float,
        next_at: float,
        due_at: float | None,
        run_id: str,
        key: str,
        version: str | None,
        now: float,
    ) -> str | None:
        """Move schedule ``name`` from ``seen_next_at`` (what the caller read) to
        ``next_at`` and, if ``due_at`` is given, queue a run of the schedule's
        workflow for that due time under idempotency ``key``, in one transaction.

        The run starts in the schedule's queue, if it has one (within its limits).

        Returns the run's id if this call started it; None if another caller moved
        the schedule first (or paused it), or ``due_at`` is None (nothing to start:
        a skipped time), or the key names a run already.
        """
        with self._write() as cur:
            cur.execute(
                "UPDATE ms_schedules SET next_at = ?, updated_at = ?"
                " WHERE name = ? AND next_at = ? AND paused = 0",
                (next_at, now, name, seen_next_at),
            )
            if cur.rowcount != 1 or due_at is None:
                return None
            cur.execute("SELECT workflow, input, queue FROM ms_schedules WHERE name = ?", (name,))
            workflow, encoded, queue = cur.fetchone()
            if queue is not None:
                # Every queue a run names has a row: the claim finds queues by them.
                cur.execute(
                    "INSERT INTO ms_queues (name, updated_at) VALUES (?, ?)"
                    " ON CONFLICT (name) DO NOTHING",
                    (queue, now),
                )
            cur.execute(
                "INSERT INTO ms_runs (id, workflow, idem_key, status, input, created_at,"
                " updated_at, version, schedule, queue) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?,"
                " ?, ?) ON CONFLICT (idem_key) DO NOTHING",
                (run_id, workflow, key, encoded, now, now, version, name, queue),
            )
            if cur.rowcount != 1:
                return None
            cur.execute(
                "UPDATE ms_schedules SET last_at = ?, last_run = ? WHERE name = ?",
                (due_at, run_id, name),
            )
            self._notify(cur, run_id)
            return run_id
