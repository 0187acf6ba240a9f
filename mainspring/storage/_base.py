"""The storage base class: all the SQL that every dialect shares.

A dialect (``sqlite.py``, later ``postgres.py``) overrides only connection set-up,
transactions, placeholders and the row-locking clause of claims. Methods are
synchronous: the engine calls them inline for a single run and from one committer
thread when many runs step at once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
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
)

__all__ = ["WAKE_NOW", "Cursor", "Heartbeat", "PruneResult", "Store"]

_RUN_COLUMNS = (
    "id, workflow, idem_key, status, input, output, error, session, handoff, epoch, owner,"
    " lease_until, wake_at, wait_reason, recoveries, cancel_requested, created_at, updated_at,"
    " finished_at"
)
_STEP_COLUMNS = (
    "run_id, session, seq, kind, name, status, attempt, epoch, output, error, started_at,"
    " finished_at, wake_at"
)
_UPSERT_STEP = (
    f"INSERT INTO ms_steps ({_STEP_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
    " ON CONFLICT (run_id, session, seq) DO UPDATE SET kind = excluded.kind,"
    " name = excluded.name, status = excluded.status, attempt = excluded.attempt,"
    " epoch = excluded.epoch, output = excluded.output, error = excluded.error,"
    " started_at = excluded.started_at, finished_at = excluded.finished_at,"
    " wake_at = excluded.wake_at"
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

    def _autocommit(self) -> AbstractContextManager[Cursor]:
        """A cursor whose every statement commits on its own (PostgreSQL); a write
        transaction where the database has no such thing (SQLite)."""
        return self._write()

    def _ddl(self, sql: str) -> str:
        """Fill a migration's dialect tokens."""
        return sql

    def _lock_migrations(self, cur: Cursor) -> None:
        """Serialise concurrent migrations (an advisory lock on PostgreSQL)."""

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
        self, *, run_id: str, workflow: str, input: str, key: str | None, now: float
    ) -> tuple[RunRecord, bool]:
        """Insert a queued run, or return the existing run with that ``key``.

        Returns ``(run, created)``.
        """
        with self._write() as cur:
            if key is not None:
                cur.execute(f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE idem_key = ?", (key,))
                row = cur.fetchone()
                if row:
                    existing = _run(row)
                    if existing.workflow != workflow:
                        raise RunConflict(
                            f"key {key!r} already names a run of workflow "
                            f"{existing.workflow!r}, not {workflow!r}",
                            run_id=existing.id,
                        )
                    return existing, False
            cur.execute(
                "INSERT INTO ms_runs (id, workflow, idem_key, status, input, created_at,"
                " updated_at) VALUES (?, ?, ?, 'queued', ?, ?, ?)",
                (run_id, workflow, key, input, now, now),
            )
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
    ) -> list[RunRecord]:
        """Newest first. ``since``: created at or after this time; ``search``: text
        found (case-insensitively) in the id, key, input, output or error."""
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
        sql = f"SELECT {_RUN_COLUMNS} FROM ms_runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?"
        with self._read() as cur:
            cur.execute(sql, (*params, limit, offset))
            return [_run(r) for r in cur.fetchall()]

    def runs_changed_since(self, after: float, *, limit: int = 200) -> list[RunRecord]:
        """Runs whose row changed after ``after`` (their ``updated_at``), oldest change
        first: what a live list needs to redraw."""
        with self._read() as cur:
            cur.execute(
                f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE updated_at > ?"
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

    def fork_run(
        self,
        source: RunRecord,
        *,
        run_id: str,
        session: int,
        upto_seq: int,
        output: str | None,
        now: float,
    ) -> RunRecord:
        """A new queued run of ``source``'s workflow and input whose journal is a copy
        of ``source``'s session ``session`` up to and including ``upto_seq``.

        ``output`` replaces the journaled output of that last step (``None``: kept).
        The new run starts in ``session`` with ``source``'s hand-off, which the caller
        must have checked is the hand-off of that session.
        """
        with self._write() as cur:
            cur.execute(
                "INSERT INTO ms_runs (id, workflow, status, input, session, handoff,"
                " created_at, updated_at) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?)",
                (
                    run_id,
                    source.workflow,
                    source.input,
                    session,
                    source.handoff if session else None,
                    now,
                    now,
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
            if rows:
                cur.executemany(_UPSERT_STEP, [_step_params(r) for r in rows])
            self._notify(cur)
            cur.execute(f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE id = ?", (run_id,))
            return _run(cur.fetchone())

    def retry_run(self, run_id: str, *, from_seq: int | None, now: float) -> RunRecord:
        """Queue a failed run again. Journal rows of its current session from
        ``from_seq`` on are deleted, so that step runs again; earlier rows replay.

        Raises:
            RunNotFound: no such run.
            RunConflict: the run is not failed (a concurrent retry got there first).
        """
        with self._write() as cur:
            cur.execute(f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE id = ?", (run_id,))
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
                    "DELETE FROM ms_steps WHERE run_id = ? AND session = ? AND seq >= ?",
                    (run_id, run.session, from_seq),
                )
            cur.execute(
                "UPDATE ms_runs SET status = 'queued', output = NULL, error = NULL,"
                " finished_at = NULL, owner = NULL, lease_until = NULL, wake_at = NULL,"
                " wait_reason = NULL, wait_signal = NULL, recoveries = 0,"
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
    ) -> list[RunRecord]:
        """Take up to ``limit`` runnable runs: bump each one's epoch and lease it.

        Runnable: queued; sleeping or waiting whose ``wake_at`` has come; running
        whose lease expired (a recovery). A run recovered more than
        ``max_recoveries`` times in a row without progress is dead-lettered:
        moved to ``failed`` with the reason, not claimed.
        """
        if limit <= 0:
            return []
        names = list(workflows) if workflows is not None else None
        wf_sql = f" AND workflow IN ({', '.join('?' * len(names))})" if names else ""
        wf_params: list[Any] = list(names) if names else []
        lock = self._lock_clause
        queries: list[tuple[str, list[Any]]]
        if run_id is not None:
            queries = [
                (
                    "SELECT id, status, recoveries FROM ms_runs WHERE id = ? AND (status = 'queued'"
                    " OR (status IN ('sleeping', 'waiting') AND wake_at <= ?)"
                    f" OR (status = 'running' AND lease_until < ?)){lock}",
                    [run_id, now, now],
                )
            ]
        else:
            queries = [
                (
                    "SELECT id, status, recoveries FROM ms_runs WHERE status = 'running'"
                    f" AND lease_until < ?{wf_sql} ORDER BY lease_until LIMIT ?{lock}",
                    [now, *wf_params],
                ),
                (
                    "SELECT id, status, recoveries FROM ms_runs WHERE status IN"
                    f" ('sleeping', 'waiting') AND wake_at <= ?{wf_sql} ORDER BY wake_at"
                    f" LIMIT ?{lock}",
                    [now, *wf_params],
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
        with self._write() as cur:
            for sql, params in queries:
                left = limit - len(claimed)
                if left <= 0:
                    break
                if run_id is None:
                    params = [*params, left]
                cur.execute(sql, params)
                for rid, status, recoveries in cur.fetchall():
                    recovering = status == "running"
                    count = recoveries + 1 if recovering else recoveries
                    if recovering and count > max_recoveries:
                        cur.execute(
                            "UPDATE ms_runs SET status = 'failed', error = ?, owner = NULL,"
                            " lease_until = NULL, recoveries = ?, finished_at = ?, updated_at = ?"
                            " WHERE id = ?",
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
                        " lease_until = ?, wake_at = NULL, wait_reason = NULL,"
                        " wait_signal = NULL, recoveries = ?, updated_at = ? WHERE id = ?",
                        (worker, now + lease_s, count, now, rid),
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
        self, *, runs: Sequence[tuple[str, int]], now: float, lease_s: float
    ) -> Heartbeat:
        """Extend the leases of ``(run_id, epoch)`` pairs this worker holds."""
        if not runs:
            return Heartbeat(frozenset(), frozenset())
        lost: set[str] = set()
        cancel: set[str] = set()
        with self._write() as cur:
            for rid, epoch in sorted(runs):
                cur.execute(
                    "UPDATE ms_runs SET lease_until = ? WHERE id = ? AND epoch = ?"
                    " AND status = 'running'",
                    (now + lease_s, rid, epoch),
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
        """Commit the writes of many runs in one transaction, each fenced by its epoch.

        A run whose epoch moved on gets ``WriteResult(ok=False)`` and none of its
        writes are applied; the others are. Writes are idempotent (upserts keyed by
        ``(run_id, session, seq)``), so re-sending a batch after an ambiguous
        failure is safe.
        """
        results: list[WriteResult] = []
        with self._write() as cur:
            # One read of the fences and one upsert of all rows, however many runs.
            fences = self._fences(cur, sorted({w.run_id for w in batch}))
            # A row another transaction holds is skipped on PostgreSQL: its run waits
            # and retries (busy); it must not hold up the rest of the batch.
            unlocked = self._epochs(cur, sorted({w.run_id for w in batch} - fences.keys()))
            step_rows: list[tuple[Any, ...]] = []
            for w in batch:
                fence = fences.get(w.run_id)
                if fence is None and unlocked.get(w.run_id) == w.epoch:
                    results.append(WriteResult(ok=False, busy=True))
                    continue
                if fence is None or fence[0] != w.epoch:
                    results.append(WriteResult(ok=False))
                    continue
                results.append(WriteResult(ok=True, cancel_requested=bool(fence[1])))
                step_rows.extend(_step_params(s) for s in w.steps)
            if step_rows:
                cur.executemany(_UPSERT_STEP, step_rows)
            for w, result in zip(batch, results, strict=True):
                if not result.ok:
                    continue
                for signal_id, by in w.consume:
                    cur.execute(
                        "UPDATE ms_signals SET consumed_at = ?, consumed_by = ? WHERE id = ?"
                        " AND (consumed_at IS NULL OR consumed_by = ?)",
                        (now, by, signal_id, by),
                    )
                if w.reset_recoveries:
                    cur.execute("UPDATE ms_runs SET recoveries = 0 WHERE id = ?", (w.run_id,))
                if w.transition is not None:
                    self._transition(cur, w, result.cancel_requested, now)
        return results

    def _fences(self, cur: Cursor, run_ids: list[str]) -> dict[str, tuple[int, int]]:
        fences: dict[str, tuple[int, int]] = {}
        for i in range(0, len(run_ids), 500):
            chunk = run_ids[i : i + 500]
            # Ordered, so that concurrent batches lock rows in one order (no deadlock).
            cur.execute(
                "SELECT id, epoch, cancel_requested FROM ms_runs WHERE id IN"
                f" ({', '.join('?' * len(chunk))}) ORDER BY id{self._fence_lock}",
                chunk,
            )
            for rid, epoch, cancel in cur.fetchall():
                fences[rid] = (epoch, cancel)
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
                "UPDATE ms_runs SET status = ?, output = ?, error = CASE WHEN"
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
                cur.execute(
                    "SELECT 1 FROM ms_signals WHERE run_id = ? AND name = ?"
                    " AND consumed_at IS NULL LIMIT 1",
                    (w.run_id, t.wait_signal),
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
            cur.execute(
                "UPDATE ms_runs SET session = session + 1, handoff = ?, updated_at = ?"
                " WHERE id = ?",
                (t.handoff, now, w.run_id),
            )

    # -- signals and cancellation -----------------------------------------------------

    def send_signal(self, run_id: str, name: str, payload: str, now: float) -> int:
        """Store a signal for a run (before or after its wait) and wake it if it waits.

        Raises:
            RunNotFound: no such run.
            RunConflict: the run has finished.
        """
        with self._write() as cur:
            cur.execute("SELECT status, wait_signal FROM ms_runs WHERE id = ?", (run_id,))
            row = cur.fetchone()
            if row is None:
                raise RunNotFound(f"cannot signal {name!r}: no run {run_id!r}")
            if row[0] in FINISHED:
                raise RunConflict(
                    f"cannot signal {name!r}: run {run_id!r} is already {row[0]}", run_id=run_id
                )
            return self._insert_signal(cur, run_id, name, payload, row[0], row[1], now)

    def next_signal(self, run_id: str, name: str) -> SignalRecord | None:
        """The oldest unconsumed signal of that name."""
        with self._read() as cur:
            cur.execute(
                "SELECT id, run_id, name, payload, created_at, consumed_at, consumed_by"
                " FROM ms_signals WHERE run_id = ? AND name = ? AND consumed_at IS NULL"
                " ORDER BY id LIMIT 1",
                (run_id, name),
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

        A run that no worker holds is cancelled at once. A running run is marked
        and its worker cancels it at the next step boundary (status stays
        ``running`` until then). A finished run is left as it is.
        """
        error = _cancel_error(reason)
        with self._write() as cur:
            cur.execute("SELECT status FROM ms_runs WHERE id = ?", (run_id,))
            row = cur.fetchone()
            if row is None:
                raise RunNotFound(f"cannot cancel: no run {run_id!r}")
            status: str = row[0]
            if status in FINISHED:
                return status
            if status == "running":
                cur.execute(
                    "UPDATE ms_runs SET cancel_requested = 1, error = ?, updated_at = ?"
                    " WHERE id = ?",
                    (error, now, run_id),
                )
                return status
            cur.execute(
                "UPDATE ms_runs SET status = 'cancelled', cancel_requested = 1, error = ?,"
                " finished_at = ?, updated_at = ?, wake_at = NULL, wait_signal = NULL,"
                " wait_reason = NULL"
                " WHERE id = ?",
                (error, now, now, run_id),
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
