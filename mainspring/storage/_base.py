"""The storage base class: all the SQL that every dialect shares.

A dialect (``sqlite.py``, later ``postgres.py``) overrides only connection set-up,
transactions, placeholders and the row-locking clause of claims. Methods are
synchronous: the engine calls them inline for a single run and from one committer
thread when many runs step at once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from .._errors import RunConflict, RunNotFound, SchemaVersionError, StoreError
from .._serde import dumps, loads
from ._api import ApiTables
from ._migrations import LATEST, MIGRATIONS
from ._records import (
    FINISHED,
    WAKE_NOW,
    RunRecord,
    RunTransition,
    RunWrite,
    SignalRecord,
    StepRecord,
    WriteResult,
    split_wait_signals,
)

__all__ = ["WAKE_NOW", "Cursor", "Heartbeat", "PruneResult", "Store"]

_RUN_COLUMNS = (
    "id, workflow, idem_key, status, input, output, error, session, handoff, epoch, owner,"
    " lease_until, wake_at, wait_reason, recoveries, cancel_requested, created_at, updated_at,"
    " finished_at, traceparent, parent, parent_step"
)
# The same, without the large values (input, output, hand-off): what lists need.
_RUN_SUMMARY_COLUMNS = _RUN_COLUMNS.replace("input, output,", "NULL, NULL,").replace(
    " handoff,", " NULL,"
)
_STEP_COLUMNS = (
    "run_id, session, seq, kind, name, status, attempt, epoch, output, error, started_at,"
    " finished_at, wake_at"
)
# A journal row only moves forward: to a later attempt, or within an attempt from
# started to retrying to an end; a completed or failed row is final. So a write
# re-sent late (a retried flush, a commit that was ambiguous) never replaces a
# newer row with its older snapshot.
_STEP_RANK = "CASE {t}.status WHEN 'started' THEN 0 WHEN 'retrying' THEN 1 ELSE 2 END"
_UPSERT_STEP = (
    f"INSERT INTO ms_steps ({_STEP_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
    " ON CONFLICT (run_id, session, seq) DO UPDATE SET kind = excluded.kind,"
    " name = excluded.name, status = excluded.status, attempt = excluded.attempt,"
    " epoch = excluded.epoch, output = excluded.output, error = excluded.error,"
    " started_at = excluded.started_at, finished_at = excluded.finished_at,"
    " wake_at = excluded.wake_at"
    " WHERE ms_steps.status NOT IN ('completed', 'failed')"
    " AND (excluded.attempt > ms_steps.attempt OR (excluded.attempt = ms_steps.attempt"
    f" AND {_STEP_RANK.format(t='excluded')} >= {_STEP_RANK.format(t='ms_steps')}))"
)
# Finished runs past retention: what ``prune`` deletes.
_PRUNABLE = "status IN ('succeeded', 'failed', 'cancelled') AND finished_at < ?"


class Cursor(Protocol):
    """The slice of a DB-API cursor the shared SQL uses."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...
    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What a heartbeat learned: runs whose lease is gone, runs asked to cancel."""

    lost: frozenset[str]
    cancel: frozenset[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneResult:
    """What :meth:`Store.prune` deleted (or, on a dry run, would delete)."""

    runs: int
    steps: int
    signals: int


def _run(row: Sequence[Any]) -> RunRecord:
    return RunRecord(
        id=row[0],
        workflow=row[1],
        key=row[2],
        status=row[3],
        input=row[4],
        output=row[5],
        error=row[6],
        session=row[7],
        handoff=row[8],
        epoch=row[9],
        owner=row[10],
        lease_until=row[11],
        wake_at=row[12],
        wait_reason=row[13],
        recoveries=row[14],
        cancel_requested=bool(row[15]),
        created_at=row[16],
        updated_at=row[17],
        finished_at=row[18],
        traceparent=row[19],
        parent=row[20],
        parent_step=row[21],
    )


def _step(row: Sequence[Any]) -> StepRecord:
    return StepRecord(
        run_id=row[0],
        session=row[1],
        seq=row[2],
        kind=row[3],
        name=row[4],
        status=row[5],
        attempt=row[6],
        epoch=row[7],
        output=row[8],
        error=row[9],
        started_at=row[10],
        finished_at=row[11],
        wake_at=row[12],
    )


def _step_params(s: StepRecord) -> tuple[Any, ...]:
    return (
        s.run_id,
        s.session,
        s.seq,
        s.kind,
        s.name,
        s.status,
        s.attempt,
        s.epoch,
        s.output,
        s.error,
        s.started_at,
        s.finished_at,
        s.wake_at,
    )


class Store(ApiTables, ABC):
    """Durable home of runs, their journals and their signals.

    Subclasses implement :meth:`_write` (a write transaction that serialises with
    every other writer on the run rows it touches), :meth:`_read`, :meth:`close` and,
    where the database needs it, the SQL hooks below.
    """

    dialect: ClassVar[str]
    url: str
    # Appended to the SELECTs of a claim: "FOR UPDATE SKIP LOCKED" on PostgreSQL.
    _lock_clause: ClassVar[str] = ""
    # Appended to the fence read of a commit: on PostgreSQL the run rows must stay
    # locked until the commit ends, or a claim could move the epoch on in between.
    # (SQLite's BEGIN IMMEDIATE already excludes every other writer.)
    _fence_lock: ClassVar[str] = ""
    # Appended to a read that must hold its run row until the transaction ends.
    _row_lock: ClassVar[str] = ""
    # The database's clock as seconds since the epoch, for leases (``db_clock=True``);
    # None: the dialect has no clock worth trusting over the caller's (SQLite runs on
    # the workers' own machine, so they share its clock).
    _db_now: ClassVar[str | None] = None

    # -- dialect hooks --------------------------------------------------------------

    @abstractmethod
    def _write(self) -> AbstractContextManager[Cursor]:
        """A write transaction; commits on exit, rolls back on error."""

    @abstractmethod
    def _read(self) -> AbstractContextManager[Cursor]:
        """A cursor for reads."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""

    def release_thread(self) -> None:
        """Close the calling thread's own connection, if the store keeps one per
        thread (SQLite). Threads that end while the store lives on call it, so that
        their connections do not stay open until :meth:`close`."""

    def _autocommit(self) -> AbstractContextManager[Cursor]:
        """A cursor whose every statement commits on its own (PostgreSQL); a write
        transaction where the database has no such thing (SQLite)."""
        return self._write()

    def _ddl(self, sql: str) -> str:
        """Fill a migration's dialect tokens."""
        return sql

    def _lock_migrations(self, cur: Cursor) -> None:
        """Serialise concurrent migrations (an advisory lock on PostgreSQL)."""

    def _check(self) -> None:
        """Called before every claim and heartbeat: raise if the store must not be
        used any more (SQLite: its file was deleted or replaced)."""

    def _clock(self, now: float, db_clock: bool) -> tuple[str, list[Any]]:
        """The SQL for "now" in lease arithmetic, and its parameters: the caller's
        ``now``, or the database's own clock where the dialect has one
        (``_db_now``) and the caller asked for it."""
        if db_clock and self._db_now is not None:
            return self._db_now, []
        return "?", [now]

    def _notify(self, cur: Cursor) -> None:
        """Tell listening workers that something became runnable (NOTIFY on PostgreSQL)."""

    def listen(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``callback`` (from another thread) when something may have become
        runnable; returns a function that stops listening, or ``None`` when this store
        cannot push (workers then only poll)."""
        return None

    # -- schema -----------------------------------------------------------------------

    def migrate(self) -> int:
        """Bring the schema to the latest version; returns the version it now has.

        Raises:
            SchemaVersionError: the database was written by a newer mainspring.
        """
        with self._write() as cur:
            self._lock_migrations(cur)
            cur.execute("CREATE TABLE IF NOT EXISTS ms_meta (key TEXT PRIMARY KEY, value TEXT)")
            cur.execute("SELECT value FROM ms_meta WHERE key = 'schema_version'")
            row = cur.fetchone()
            current = int(row[0]) if row else 0
            if current > LATEST:
                raise SchemaVersionError(
                    f"database {self.url!r} has schema version {current}, but this mainspring "
                    f"knows versions up to {LATEST}: upgrade mainspring to open it"
                )
            for version in range(current + 1, LATEST + 1):
                for statement in self._ddl(MIGRATIONS[version]).split(";"):
                    if statement.strip():
                        cur.execute(statement)
            if current < LATEST:
                if row:
                    cur.execute(
                        "UPDATE ms_meta SET value = ? WHERE key = 'schema_version'", (str(LATEST),)
                    )
                else:
                    cur.execute(
                        "INSERT INTO ms_meta (key, value) VALUES ('schema_version', ?)",
                        (str(LATEST),),
                    )
            return LATEST

    def schema_version(self) -> int:
        with self._read() as cur:
            cur.execute("SELECT value FROM ms_meta WHERE key = 'schema_version'")
            row = cur.fetchone()
            return int(row[0]) if row else 0

    def stored_schema_version(self) -> int:
        """The schema version the database records, read without migrating: 0 for a
        database without mainspring's tables (a new one, or another program's).

        Raises:
            StoreError: the database cannot be read at all.
            StoreUnavailable: the database is locked or unreachable.
        """
        with self._read() as cur:
            cur.execute("SELECT 1")  # reachable and readable: a failure below is the table
        try:
            return self.schema_version()
        except StoreError:
            # No catalog query works on every dialect; ms_meta missing is what fails here.
            return 0

    # -- runs -------------------------------------------------------------------------

    def create_run(
        self,
        *,
        run_id: str,
        workflow: str,
        input: str,
        key: str | None,
        now: float,
        traceparent: str | None = None,
    ) -> tuple[RunRecord, bool]:
        """Insert a queued run, or return the existing run with that ``key``.
        ``traceparent``: the caller's W3C trace context, kept with the run.

        Returns ``(run, created)``.
        """
        with self._write() as cur:
            if key is None:
                cur.execute(
                    "INSERT INTO ms_runs (id, workflow, idem_key, status, input, created_at,"
                    " updated_at, traceparent) VALUES (?, ?, NULL, 'queued', ?, ?, ?, ?)",
                    (run_id, workflow, input, now, now, traceparent),
                )
                created = True
            else:
                # One conditional statement, not a read then an insert: concurrent
                # submits with one key (many API servers) all get the one run. On
                # PostgreSQL the loser waits for the winner's commit, then selects it.
                cur.execute(
                    "INSERT INTO ms_runs (id, workflow, idem_key, status, input, created_at,"
                    " updated_at, traceparent) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?)"
                    " ON CONFLICT (idem_key) DO NOTHING",
                    (run_id, workflow, key, input, now, now, traceparent),
                )
                created = cur.rowcount == 1
            if not created:
                cur.execute(f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE idem_key = ?", (key,))
                existing = _run(cur.fetchone())
                if existing.workflow != workflow:
                    raise RunConflict(
                        f"key {key!r} already names a run of workflow "
                        f"{existing.workflow!r}, not {workflow!r}",
                        run_id=existing.id,
                    )
                return existing, False
            self._notify(cur)
            cur.execute(f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE id = ?", (run_id,))
            return _run(cur.fetchone()), True

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._read() as cur:
            cur.execute(f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE id = ?", (run_id,))
            row = cur.fetchone()
            return _run(row) if row else None

    def list_runs(
        self,
        *,
        statuses: Sequence[str] | None = None,
        workflow: str | None = None,
        limit: int = 50,
        offset: int = 0,
        since: float | None = None,
        search: str | None = None,
        summary: bool = False,
    ) -> list[RunRecord]:
        """Newest first. ``since``: created at or after this time; ``search``: text
        found (case-insensitively) in the id, key, input, output or error; ``summary``:
        leave input, output and hand-off out (``None``), for lists."""
        where: list[str] = []
        params: list[Any] = []
        if statuses:
            where.append(f"status IN ({', '.join('?' * len(statuses))})")
            params.extend(statuses)
        if workflow:
            where.append("workflow = ?")
            params.append(workflow)
        if since is not None:
            where.append("created_at >= ?")
            params.append(since)
        if search:
            escaped = search.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            columns = ("id", "idem_key", "input", "output", "error")
            where.append("(" + " OR ".join(f"LOWER({c}) LIKE ? ESCAPE '\\'" for c in columns) + ")")
            params.extend([f"%{escaped}%"] * len(columns))
        sql = f"SELECT {_RUN_SUMMARY_COLUMNS if summary else _RUN_COLUMNS} FROM ms_runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?"
        with self._read() as cur:
            cur.execute(sql, (*params, limit, offset))
            return [_run(r) for r in cur.fetchall()]

    def runs_changed_since(self, after: float, *, limit: int = 200) -> list[RunRecord]:
        """Runs whose row changed after ``after`` (their ``updated_at``), oldest change
        first: what a live list needs to redraw (summaries: no input, output or
        hand-off)."""
        with self._read() as cur:
            cur.execute(
                f"SELECT {_RUN_SUMMARY_COLUMNS} FROM ms_runs WHERE updated_at > ?"
                " ORDER BY updated_at, id LIMIT ?",
                (after, limit),
            )
            return [_run(r) for r in cur.fetchall()]

    def count_runs(self) -> dict[str, int]:
        """How many runs are in each status."""
        with self._read() as cur:
            cur.execute("SELECT status, COUNT(*) FROM ms_runs GROUP BY status")
            return {status: n for status, n in cur.fetchall()}

    def run_ids_starting(self, prefix: str, limit: int = 2) -> list[str]:
        """Ids of runs that start with ``prefix`` (up to ``limit``), for abbreviated ids."""
        # LIKE with the prefix's own wildcards escaped: "a_" matches "a_...", not "ab...".
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._read() as cur:
            cur.execute(
                "SELECT id FROM ms_runs WHERE id LIKE ? ESCAPE '\\' ORDER BY id LIMIT ?",
                [pattern, limit],
            )
            return [r[0] for r in cur.fetchall()]

    def next_wake(self, workflows: Sequence[str] | None = None) -> float | None:
        """The earliest ``wake_at`` of a sleeping or waiting run (of these workflows):
        when a worker next has something to claim that nobody needs to send."""
        names = list(workflows) if workflows is not None else None
        wf_sql = f" AND workflow IN ({', '.join('?' * len(names))})" if names else ""
        with self._read() as cur:
            cur.execute(
                "SELECT MIN(wake_at) FROM ms_runs WHERE status IN ('sleeping', 'waiting')"
                f" AND wake_at IS NOT NULL{wf_sql}",
                names or [],
            )
            row = cur.fetchone()
            return None if row is None or row[0] is None else float(row[0])

    def run_stamps(self) -> list[tuple[str, str, str, float]]:
        """``(id, workflow, status, updated_at)`` of every run: what a metrics scrape
        needs to tell which runs changed."""
        with self._read() as cur:
            cur.execute("SELECT id, workflow, status, updated_at FROM ms_runs")
            return [(r[0], r[1], r[2], r[3]) for r in cur.fetchall()]

    def run_changes(
        self, after: float | None = None
    ) -> list[tuple[str, str, str, float, float | None, str | None]]:
        """``(id, workflow, status, updated_at, finished_at, wait_reason)`` of the runs
        whose row changed after ``after`` (every run when ``None``): how a metrics
        scrape keeps its aggregates without reading every run (``ms_runs_updated``)."""
        sql = "SELECT id, workflow, status, updated_at, finished_at, wait_reason FROM ms_runs"
        with self._read() as cur:
            if after is None:
                cur.execute(sql)
            else:
                cur.execute(sql + " WHERE updated_at > ?", (after,))
            return [(r[0], r[1], r[2], r[3], r[4], r[5]) for r in cur.fetchall()]

    def oldest_finished_at(self) -> float | None:
        """The earliest ``finished_at`` in the store (``ms_runs_finished`` index): it
        rises when :meth:`prune` deletes runs, which delete oldest first."""
        with self._read() as cur:
            cur.execute("SELECT MIN(finished_at) FROM ms_runs WHERE finished_at IS NOT NULL")
            row = cur.fetchone()
            return None if row is None or row[0] is None else float(row[0])

    def fork_run(
        self,
        source: RunRecord,
        *,
        run_id: str,
        session: int,
        upto_seq: int,
        output: str | None,
        now: float,
        outputs: Mapping[int, str] | None = None,
        parent_step: str | None = None,
    ) -> RunRecord:
        """A new queued run of ``source``'s workflow and input whose journal is a copy
        of ``source``'s session ``session`` up to and including ``upto_seq``.
        The new run's ``parent`` is ``source.id``, its ``parent_step`` the step it was
        forked from (``"session:seq"``; default: ``upto_seq``'s).

        ``output`` replaces the journaled output of that last step (``None``: kept);
        ``outputs`` replaces the outputs of the steps it names by seq.
        The new run starts in ``session`` with ``source``'s hand-off, which the caller
        must have checked is the hand-off of that session.
        """
        with self._write() as cur:
            # The source's row is held while its journal is copied, so the copy and
            # the hand-off are of one moment (its worker may be committing).
            cur.execute(
                f"SELECT session, handoff FROM ms_runs WHERE id = ?{self._row_lock}",
                (source.id,),
            )
            row = cur.fetchone()
            if row is None:
                raise RunNotFound(f"cannot fork: no run {source.id!r}")
            if session == row[0]:
                handoff = row[1]
            elif session == source.session:
                handoff = source.handoff  # the caller's record is of that session
            elif session == 0:
                handoff = None
            else:
                raise RunConflict(
                    f"cannot fork run {source.id!r} from session {session}: its hand-off is "
                    f"not kept (the run is in session {row[0]})",
                    run_id=source.id,
                )
            cur.execute(
                "INSERT INTO ms_runs (id, workflow, status, input, session, handoff,"
                " created_at, updated_at, parent, parent_step)"
                " VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    source.workflow,
                    source.input,
                    session,
                    handoff if session else None,
                    now,
                    now,
                    source.id,
                    parent_step if parent_step is not None else f"{session}:{upto_seq}",
                ),
            )
            cur.execute(
                f"SELECT {_STEP_COLUMNS} FROM ms_steps WHERE run_id = ? AND session = ?"
                " AND seq <= ? ORDER BY seq",
                (source.id, session, upto_seq),
            )
            rows = [_step(r) for r in cur.fetchall()]
            for r in rows:
                r.run_id, r.epoch = run_id, 0
                if r.seq == upto_seq and output is not None:
                    r.output = output
                if outputs and r.seq in outputs:
                    r.output = outputs[r.seq]
            if rows:
                cur.executemany(_UPSERT_STEP, [_step_params(r) for r in rows])
            self._notify(cur)
            cur.execute(f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE id = ?", (run_id,))
            return _run(cur.fetchone())

    def retry_run(self, run_id: str, *, from_seq: int | None, now: float) -> RunRecord:
        """Queue a failed run again. Journal rows of its current session from
        ``from_seq`` on that did not complete are deleted, so that step runs again;
        completed rows are never deleted (a completed step never runs twice), so
        they replay, wherever they are.

        Re-opening the run bumps its epoch: a worker that still held it cannot
        write into the retried run.

        Raises:
            RunNotFound: no such run.
            RunConflict: the run is not failed (a concurrent retry got there first).
        """
        with self._write() as cur:
            cur.execute(
                f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE id = ?{self._row_lock}", (run_id,)
            )
            row = cur.fetchone()
            if row is None:
                raise RunNotFound(f"cannot retry: no run {run_id!r}")
            run = _run(row)
            if run.status != "failed":
                raise RunConflict(
                    f"cannot retry run {run_id!r}: it is {run.status}, and only a failed run "
                    "can be retried",
                    run_id=run_id,
                )
            if from_seq is not None:
                cur.execute(
                    "DELETE FROM ms_steps WHERE run_id = ? AND session = ? AND seq >= ?"
                    " AND status <> 'completed'",
                    (run_id, run.session, from_seq),
                )
            cur.execute(
                "UPDATE ms_runs SET status = 'queued', epoch = epoch + 1, output = NULL,"
                " error = NULL, finished_at = NULL, owner = NULL, lease_until = NULL,"
                " wake_at = NULL, wait_reason = NULL, wait_signal = NULL, recoveries = 0,"
                " cancel_requested = 0, updated_at = ? WHERE id = ? AND status = 'failed'",
                (now, run_id),
            )
            if cur.rowcount != 1:  # retried concurrently: raising rolls the delete back
                raise RunConflict(f"run {run_id!r} was retried concurrently", run_id=run_id)
            self._notify(cur)
            cur.execute(f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE id = ?", (run_id,))
            return _run(cur.fetchone())

    def load_steps(self, run_id: str, session: int | None = None) -> list[StepRecord]:
        """A run's journal in order; one session's only when ``session`` is given."""
        with self._read() as cur:
            if session is None:
                cur.execute(
                    f"SELECT {_STEP_COLUMNS} FROM ms_steps WHERE run_id = ? ORDER BY session, seq",
                    (run_id,),
                )
            else:
                cur.execute(
                    f"SELECT {_STEP_COLUMNS} FROM ms_steps WHERE run_id = ? AND session = ?"
                    " ORDER BY seq",
                    (run_id, session),
                )
            return [_step(r) for r in cur.fetchall()]

    def steps_after(
        self, run_id: str, session: int, seq: int, *, limit: int = 1000
    ) -> list[StepRecord]:
        """Journal rows after position ``(session, seq)``, in order (for followers)."""
        with self._read() as cur:
            cur.execute(
                f"SELECT {_STEP_COLUMNS} FROM ms_steps WHERE run_id = ?"
                " AND (session > ? OR (session = ? AND seq > ?)) ORDER BY session, seq LIMIT ?",
                (run_id, session, session, seq, limit),
            )
            return [_step(r) for r in cur.fetchall()]

    def last_steps(self, run_ids: Sequence[str]) -> dict[str, StepRecord]:
        """The newest journal row of each run (its current step), by run id."""
        found: dict[str, StepRecord] = {}
        with self._read() as cur:
            for rid in run_ids:
                cur.execute(
                    f"SELECT {_STEP_COLUMNS} FROM ms_steps WHERE run_id = ?"
                    " ORDER BY session DESC, seq DESC LIMIT 1",
                    (rid,),
                )
                row = cur.fetchone()
                if row:
                    found[rid] = _step(row)
        return found

    # -- claiming and leases ---------------------------------------------------------

    def claim(
        self,
        *,
        worker: str,
        now: float,
        lease_s: float,
        limit: int,
        workflows: Sequence[str] | None,
        max_recoveries: int,
        run_id: str | None = None,
        isolate_after: int | None = None,
        alone: bool = False,
        db_clock: bool = False,
    ) -> list[RunRecord]:
        """Take up to ``limit`` runnable runs: bump each one's epoch and lease it.

        Runnable: queued; sleeping or waiting whose ``wake_at`` has come; running
        whose lease expired (a recovery). A run recovered more than
        ``max_recoveries`` times in a row without progress is dead-lettered:
        moved to ``failed`` with the reason, not claimed.

        Args:
            isolate_after: a run recovered this many times in a row without progress
                is a *suspect* (its step may be what kills workers): it is claimed
                only by a caller that holds nothing else (``alone``), and then as the
                only run of the claim, so that a crash it causes is charged to it
                alone. ``None``: no isolation.
            alone: the caller executes no other run now.
            db_clock: compare and write leases with the database's clock instead of
                ``now`` (where the dialect has one: PostgreSQL), so that workers
                whose clocks disagree still agree on whose lease has run out.
        """
        self._check()
        if limit <= 0:
            return []
        names = list(workflows) if workflows is not None else None
        wf_sql = f" AND workflow IN ({', '.join('?' * len(names))})" if names else ""
        wf_params: list[Any] = list(names) if names else []
        lock = self._lock_clause
        at, at_params = self._clock(now, db_clock)
        queries: list[tuple[str, list[Any]]]
        if run_id is not None:
            queries = [
                (
                    "SELECT id, status, recoveries FROM ms_runs WHERE id = ? AND (status = 'queued'"
                    f" OR (status IN ('sleeping', 'waiting') AND wake_at <= {at})"
                    f" OR (status = 'running' AND lease_until < {at})){lock}",
                    [run_id, *at_params, *at_params],
                )
            ]
        else:
            queries = [
                (
                    "SELECT id, status, recoveries FROM ms_runs WHERE status = 'running'"
                    f" AND lease_until < {at}{wf_sql} ORDER BY lease_until LIMIT ?{lock}",
                    [*at_params, *wf_params],
                ),
                (
                    "SELECT id, status, recoveries FROM ms_runs WHERE status IN"
                    f" ('sleeping', 'waiting') AND wake_at <= {at}{wf_sql} ORDER BY wake_at"
                    f" LIMIT ?{lock}",
                    [*at_params, *wf_params],
                ),
                (
                    f"SELECT id, status, recoveries FROM ms_runs WHERE status = 'queued'{wf_sql}"
                    f" ORDER BY created_at LIMIT ?{lock}",
                    [*wf_params],
                ),
            ]
        if names == []:
            return []
        claimed: list[str] = []
        suspect = False
        with self._write() as cur:
            for sql, params in queries:
                left = limit - len(claimed)
                if left <= 0 or suspect:
                    break
                if run_id is None:
                    params = [*params, left]
                cur.execute(sql, params)
                for rid, status, recoveries in cur.fetchall():
                    if suspect:
                        break
                    recovering = status == "running"
                    count = recoveries + 1 if recovering else recoveries
                    if isolate_after is not None and isolate_after <= count <= max_recoveries:
                        # A suspect runs alone: left for a caller that holds nothing.
                        if not alone or claimed:
                            continue
                        suspect = True
                    if recovering and count > max_recoveries:
                        cur.execute(
                            # Ending the run moves the fence on: its last holder,
                            # stalled but alive, must not write into a dead run.
                            "UPDATE ms_runs SET status = 'failed', epoch = epoch + 1, error = ?,"
                            " owner = NULL, lease_until = NULL, recoveries = ?, finished_at = ?,"
                            " updated_at = ? WHERE id = ?",
                            (
                                _dead_letter_error(max_recoveries),
                                count,
                                now,
                                now,
                                rid,
                            ),
                        )
                        self._emit(
                            cur,
                            rid,
                            "run.failed",
                            {
                                "status": "failed",
                                "error": loads(_dead_letter_error(max_recoveries)),
                            },
                            now,
                        )
                        continue
                    cur.execute(
                        "UPDATE ms_runs SET status = 'running', epoch = epoch + 1, owner = ?,"
                        f" lease_until = {at} + ?, wake_at = NULL, wait_reason = NULL,"
                        " wait_signal = NULL, recoveries = ?, updated_at = ? WHERE id = ?",
                        (worker, *at_params, lease_s, count, now, rid),
                    )
                    claimed.append(rid)
            if not claimed:
                return []
            cur.execute(
                f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE id IN ({', '.join('?' * len(claimed))})",
                claimed,
            )
            by_id = {r.id: r for r in map(_run, cur.fetchall())}
        return [by_id[rid] for rid in claimed]

    def heartbeat(
        self,
        *,
        runs: Sequence[tuple[str, int]],
        now: float,
        lease_s: float,
        db_clock: bool = False,
    ) -> Heartbeat:
        """Extend the leases of ``(run_id, epoch)`` pairs this worker holds
        (``db_clock``: as :meth:`claim`)."""
        self._check()
        if not runs:
            return Heartbeat(frozenset(), frozenset())
        lost: set[str] = set()
        cancel: set[str] = set()
        at, at_params = self._clock(now, db_clock)
        with self._write() as cur:
            for rid, epoch in sorted(runs):
                cur.execute(
                    f"UPDATE ms_runs SET lease_until = {at} + ? WHERE id = ? AND epoch = ?"
                    " AND status = 'running'",
                    (*at_params, lease_s, rid, epoch),
                )
                if cur.rowcount == 0:
                    lost.add(rid)
            ids = [rid for rid, _ in runs if rid not in lost]
            if ids:
                cur.execute(
                    "SELECT id FROM ms_runs WHERE cancel_requested = 1 AND id IN"
                    f" ({', '.join('?' * len(ids))})",
                    ids,
                )
                cancel = {r[0] for r in cur.fetchall()}
        return Heartbeat(frozenset(lost), frozenset(cancel))

    def release(self, run_id: str, epoch: int, now: float) -> bool:
        """Give a run back (graceful shutdown): queued again, no recovery counted."""
        with self._write() as cur:
            cur.execute(
                "UPDATE ms_runs SET status = 'queued', owner = NULL, lease_until = NULL,"
                " updated_at = ? WHERE id = ? AND epoch = ? AND status = 'running'",
                (now, run_id, epoch),
            )
            released = bool(cur.rowcount)
            if released:
                self._notify(cur)
            return released

    # -- the journal -----------------------------------------------------------------

    def commit(self, batch: Sequence[RunWrite], now: float) -> list[WriteResult]:
        """Commit the writes of many runs in one transaction, each fenced.

        The fence is the epoch **and** the status: a run's writes apply only while
        it is ``running`` at the epoch the writer holds. Every write that ends or
        re-opens a run (finish, dead-letter, cancel, retry) bumps the epoch. A
        refused run gets ``WriteResult(ok=False)`` and none of its writes are
        applied; the others are.

        Every write is idempotent when re-sent after an ambiguous failure: journal
        rows only move forward (an older snapshot never replaces a newer row), a
        signal is consumed by one wait only, ``next_session`` moves from the
        session it names, and a finish or suspend that had already been applied
        answers ``ok`` with ``already=True`` and writes (and emits) nothing again.
        """
        results: list[WriteResult] = []
        with self._write() as cur:
            ids = sorted({w.run_id for w in batch})
            # One read of the fences and one upsert of all rows, however many runs.
            fences = self._fences(cur, ids)
            # A row another transaction holds is skipped on PostgreSQL: its run waits
            # and retries (busy); it must not hold up the rest of the batch.
            unlocked = self._epochs(cur, sorted(set(ids) - fences.keys()))
            taken: dict[int, str] = {}  # signal id -> the wait consuming it in this batch
            for w in batch:
                fence = fences.get(w.run_id)
                if fence is None:
                    held = unlocked.get(w.run_id)
                    busy = held is not None and held in (w.epoch, w.epoch + 1)
                    results.append(WriteResult(ok=False, busy=busy))
                    continue
                epoch, cancel, status = fence
                if epoch != w.epoch or status != "running":
                    results.append(self._resent(cur, w, epoch, status))
                    continue
                conflict = self._consume_conflict(cur, w, taken)
                if conflict is not None:
                    results.append(WriteResult(ok=False, conflict=conflict))
                    continue
                results.append(WriteResult(ok=True, cancel_requested=bool(cancel)))
            step_rows = [
                _step_params(s)
                for w, r in zip(batch, results, strict=True)
                if r.ok and not r.already
                for s in w.steps
            ]
            if step_rows:
                cur.executemany(_UPSERT_STEP, step_rows)
            for w, result in zip(batch, results, strict=True):
                if not result.ok or result.already:
                    continue
                for signal_id, by in w.consume:
                    cur.execute(
                        "UPDATE ms_signals SET consumed_at = ?, consumed_by = ? WHERE id = ?"
                        " AND consumed_at IS NULL",
                        (now, by, signal_id),
                    )
                if w.reset_recoveries:
                    cur.execute("UPDATE ms_runs SET recoveries = 0 WHERE id = ?", (w.run_id,))
                if w.transition is not None:
                    self._transition(cur, w, result.cancel_requested, now)
        return results

    def _resent(self, cur: Cursor, w: RunWrite, epoch: int, status: str) -> WriteResult:
        """A write the fence refuses: ``already`` when it is a finish or suspend whose
        first send committed (the run is exactly where that write put it); else
        refused."""
        t = w.transition
        if t is None or status != t.status:
            return WriteResult(ok=False)
        if t.kind == "suspend" and epoch == w.epoch:
            # Only this epoch's holder moves the run from running to waiting or
            # sleeping at this epoch, and only once.
            return WriteResult(ok=True, already=True)
        if t.kind == "finish" and epoch == w.epoch + 1:
            cur.execute("SELECT output, error FROM ms_runs WHERE id = ?", (w.run_id,))
            output, error = cur.fetchone()
            # A dead-letter also ends a run at epoch + 1, with its own error; a
            # cancel keeps the reason it was asked with.
            if status == "cancelled" or (output, error) == (t.output, t.error):
                return WriteResult(ok=True, already=True)
        return WriteResult(ok=False)

    def _consume_conflict(self, cur: Cursor, w: RunWrite, taken: dict[int, str]) -> str | None:
        """Why ``w`` cannot consume its signals (another wait has one), or ``None``.

        Only the run's current holder consumes its signals, and the fence holds the
        run's row, so what this reads cannot change before the commit."""
        if not w.consume:
            return None
        marks = ", ".join("?" * len(w.consume))
        cur.execute(
            f"SELECT id, consumed_by FROM ms_signals WHERE run_id = ? AND id IN ({marks})",
            (w.run_id, *(sid for sid, _ in w.consume)),
        )
        stored = {sid: by for sid, by in cur.fetchall()}
        for sid, by in w.consume:
            if sid not in stored:
                return f"signal {sid} of run {w.run_id!r} does not exist"
            holder = stored[sid] if stored[sid] is not None else taken.get(sid)
            if holder is not None and holder != by:
                return (
                    f"signal {sid} of run {w.run_id!r} was consumed by the wait at {holder},"
                    f" not the one at {by}"
                )
        for sid, by in w.consume:
            taken[sid] = by
        return None

    def _fences(self, cur: Cursor, run_ids: list[str]) -> dict[str, tuple[int, int, str]]:
        fences: dict[str, tuple[int, int, str]] = {}
        for i in range(0, len(run_ids), 500):
            chunk = run_ids[i : i + 500]
            # Ordered, so that concurrent batches lock rows in one order (no deadlock).
            cur.execute(
                "SELECT id, epoch, cancel_requested, status FROM ms_runs WHERE id IN"
                f" ({', '.join('?' * len(chunk))}) ORDER BY id{self._fence_lock}",
                chunk,
            )
            for rid, epoch, cancel, status in cur.fetchall():
                fences[rid] = (epoch, cancel, status)
        return fences

    def _epochs(self, cur: Cursor, run_ids: list[str]) -> dict[str, int]:
        """Epochs read without locking (of runs whose fence row was skipped)."""
        epochs: dict[str, int] = {}
        for i in range(0, len(run_ids), 500):
            chunk = run_ids[i : i + 500]
            cur.execute(
                f"SELECT id, epoch FROM ms_runs WHERE id IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
            epochs.update({rid: epoch for rid, epoch in cur.fetchall()})
        return epochs

    def _transition(self, cur: Cursor, w: RunWrite, cancel_requested: bool, now: float) -> None:
        t = w.transition
        assert t is not None
        if t.kind == "finish":
            # A cancelled run keeps the reason ``cancel()`` stored with the request.
            cur.execute(
                "UPDATE ms_runs SET status = ?, epoch = epoch + 1, output = ?, error = CASE WHEN"
                " CAST(? AS TEXT) = 'cancelled' AND cancel_requested = 1 AND error IS NOT NULL"
                " THEN error ELSE ? END,"
                " finished_at = ?, updated_at = ?, owner = NULL, lease_until = NULL,"
                " wake_at = NULL, wait_reason = NULL, wait_signal = NULL WHERE id = ?",
                (t.status, t.output, t.status, t.error, now, now, w.run_id),
            )
            if t.status in FINISHED:
                self._emit(cur, w.run_id, f"run.{t.status}", _event_run(t.status, t), now)  # type: ignore[arg-type]
        elif t.kind == "suspend":
            wake_at = t.wake_at
            if cancel_requested:
                wake_at = WAKE_NOW  # let a worker pick it up at once and cancel it
            elif t.wait_signal is not None:
                names = split_wait_signals(t.wait_signal)  # any of them wakes the run
                cur.execute(
                    "SELECT 1 FROM ms_signals WHERE run_id = ? AND name IN"
                    f" ({', '.join('?' * len(names))}) AND consumed_at IS NULL LIMIT 1",
                    (w.run_id, *names),
                )
                if cur.fetchone():  # the signal beat the wait: wake at once
                    wake_at = WAKE_NOW
            if wake_at == WAKE_NOW:
                self._notify(cur)
            cur.execute(
                "UPDATE ms_runs SET status = ?, wake_at = ?, wait_reason = ?, wait_signal = ?,"
                " owner = NULL, lease_until = NULL, updated_at = ? WHERE id = ?",
                (t.status, wake_at, t.wait_reason, t.wait_signal, now, w.run_id),
            )
            if t.status == "waiting" and wake_at != WAKE_NOW:
                waiting = {"status": "waiting", "wait_reason": t.wait_reason}
                self._emit(cur, w.run_id, "run.waiting", waiting, now)
        else:
            # Set, not incremented: a re-sent continue-as-new leaves the run in the
            # session the first send opened (same idempotency keys downstream).
            ending = t.session
            if ending is None and w.steps:
                ending = w.steps[0].session
            if ending is None:
                cur.execute("SELECT session FROM ms_runs WHERE id = ?", (w.run_id,))
                ending = int(cur.fetchone()[0])
            cur.execute(
                "UPDATE ms_runs SET session = ?, handoff = ?, updated_at = ?"
                " WHERE id = ? AND session = ?",
                (ending + 1, t.handoff, now, w.run_id, ending),
            )

    # -- signals and cancellation -----------------------------------------------------

    def send_signal(self, run_id: str, name: str, payload: str, now: float) -> int:
        """Store a signal for a run (before or after its wait) and wake it if it waits.

        Raises:
            RunNotFound: no such run.
            RunConflict: the run has finished.
        """
        with self._write() as cur:
            # Locked: a suspend committing now either sees this signal or is seen
            # waiting by it, so a stored signal always wakes the run waiting for it.
            cur.execute(
                f"SELECT status, wait_signal FROM ms_runs WHERE id = ?{self._row_lock}", (run_id,)
            )
            row = cur.fetchone()
            if row is None:
                raise RunNotFound(f"cannot signal {name!r}: no run {run_id!r}")
            if row[0] in FINISHED:
                raise RunConflict(
                    f"cannot signal {name!r}: run {run_id!r} is already {row[0]}", run_id=run_id
                )
            return self._insert_signal(cur, run_id, name, payload, row[0], row[1], now)

    def next_signal(
        self, run_id: str, name: str, *, skip: Sequence[int] = ()
    ) -> SignalRecord | None:
        """The oldest unconsumed signal of that name, other than the ids in ``skip``
        (those another wait of the run has taken but not committed yet)."""
        also = f" AND id NOT IN ({', '.join('?' * len(skip))})" if skip else ""
        with self._read() as cur:
            cur.execute(
                "SELECT id, run_id, name, payload, created_at, consumed_at, consumed_by"
                " FROM ms_signals WHERE run_id = ? AND name = ? AND consumed_at IS NULL"
                f"{also} ORDER BY id LIMIT 1",
                (run_id, name, *skip),
            )
            row = cur.fetchone()
        if row is None:
            return None
        return SignalRecord(
            id=row[0],
            run_id=row[1],
            name=row[2],
            payload=row[3],
            created_at=row[4],
            consumed_at=row[5],
            consumed_by=row[6],
        )

    def cancel(self, run_id: str, now: float, reason: str | None = None) -> str:
        """Cancel a run; returns its status afterwards.

        A run that no worker holds is cancelled at once (its epoch moves on, so
        nothing written by an earlier holder can land after). A running run is
        marked and its worker cancels it at the next step boundary (status stays
        ``running`` until then). A finished run is left exactly as it is and its
        final status returned.
        """
        error = _cancel_error(reason)
        with self._write() as cur:
            # Locked: a worker's commit (a suspend, a finish) cannot slip between
            # this read and the write below.
            cur.execute(f"SELECT status FROM ms_runs WHERE id = ?{self._row_lock}", (run_id,))
            row = cur.fetchone()
            if row is None:
                raise RunNotFound(f"cannot cancel: no run {run_id!r}")
            status: str = row[0]
            if status in FINISHED:
                return status
            if status == "running":
                cur.execute(
                    "UPDATE ms_runs SET cancel_requested = 1, error = ?, updated_at = ?"
                    " WHERE id = ? AND status = 'running'",
                    (error, now, run_id),
                )
                return status
            cur.execute(
                "UPDATE ms_runs SET status = 'cancelled', epoch = epoch + 1,"
                " cancel_requested = 1, error = ?, finished_at = ?, updated_at = ?,"
                " owner = NULL, lease_until = NULL, wake_at = NULL, wait_signal = NULL,"
                " wait_reason = NULL WHERE id = ? AND status = ?",
                (error, now, now, run_id, status),
            )
            self._emit(
                cur, run_id, "run.cancelled", {"status": "cancelled", "error": loads(error)}, now
            )
            return "cancelled"

    # -- retention ----------------------------------------------------------------------

    def prune(
        self, older_than_s: float, now: float, *, batch: int = 500, dry_run: bool = False
    ) -> PruneResult:
        """Delete finished runs whose ``finished_at`` is before ``now - older_than_s``,
        with their journals and signals. Unfinished runs are never touched.

        Deletes ``batch`` runs per transaction, so that no lock is held for long while
        workers keep committing. ``dry_run`` only counts what would be deleted.
        """
        if batch <= 0:
            raise ValueError(f"batch must be > 0, got {batch!r}")
        cutoff = now - older_than_s
        if dry_run:
            with self._read() as cur:
                counts = []
                for sql in (
                    f"SELECT COUNT(*) FROM ms_runs WHERE {_PRUNABLE}",
                    f"SELECT COUNT(*) FROM ms_steps WHERE run_id IN"
                    f" (SELECT id FROM ms_runs WHERE {_PRUNABLE})",
                    f"SELECT COUNT(*) FROM ms_signals WHERE run_id IN"
                    f" (SELECT id FROM ms_runs WHERE {_PRUNABLE})",
                ):
                    cur.execute(sql, (cutoff,))
                    counts.append(int(cur.fetchone()[0]))
            return PruneResult(runs=counts[0], steps=counts[1], signals=counts[2])
        runs = steps = signals = 0
        while True:
            with self._write() as cur:
                # Rows another transaction holds are skipped on PostgreSQL: a later
                # prune takes them.
                cur.execute(
                    f"SELECT id FROM ms_runs WHERE {_PRUNABLE} ORDER BY finished_at, id"
                    f" LIMIT ?{self._lock_clause}",
                    (cutoff, batch),
                )
                ids = [row[0] for row in cur.fetchall()]
                if not ids:
                    break
                for i in range(0, len(ids), 500):  # within every driver's parameter limit
                    chunk = ids[i : i + 500]
                    marks = ", ".join("?" * len(chunk))
                    cur.execute(f"DELETE FROM ms_steps WHERE run_id IN ({marks})", chunk)
                    steps += cur.rowcount
                    cur.execute(f"DELETE FROM ms_signals WHERE run_id IN ({marks})", chunk)
                    signals += cur.rowcount
                    # Delivered or given-up webhook events of those runs go with them.
                    cur.execute(
                        f"DELETE FROM ms_outbox WHERE run_id IN ({marks})"
                        " AND (delivered_at IS NOT NULL OR next_at IS NULL)",
                        chunk,
                    )
                    cur.execute(f"DELETE FROM ms_runs WHERE id IN ({marks})", chunk)
                    runs += cur.rowcount
            if len(ids) < batch:
                break
        return PruneResult(runs=runs, steps=steps, signals=signals)

    def iter_all_steps(self) -> Iterator[StepRecord]:
        """Every journal row, for consistency checks."""
        with self._read() as cur:
            cur.execute(f"SELECT {_STEP_COLUMNS} FROM ms_steps ORDER BY run_id, session, seq")
            rows = cur.fetchall()
        return map(_step, rows)


def _dead_letter_error(max_recoveries: int) -> str:
    return dumps(
        {
            "type": "DeadLettered",
            "message": f"recovery failed {max_recoveries} times in a row without progress;"
            " the run was moved to failed (dead-lettered)",
        }
    )


def _cancel_error(reason: str | None) -> str:
    return dumps({"type": "Cancelled", "message": reason or "cancelled"})


def _event_run(status: str, t: RunTransition) -> dict[str, Any]:
    run: dict[str, Any] = {"status": status}
    if t.output is not None:
        run["output"] = loads(t.output)
    if t.error is not None:
        run["error"] = loads(t.error)
    return run
