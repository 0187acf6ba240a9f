"""What every part of the store shares: one connection (the dialect's), its
transactions and hooks, and the schema.

A dialect (``sqlite.py``, ``postgres.py``) implements :meth:`Connection._write`,
:meth:`Connection._read` and :meth:`Connection.close`, and overrides only the hooks
below that its database needs (placeholders, row locks, a clock, notifications).
The parts of :class:`~mainspring.storage.Store` (runs, leases, journal, signals,
keys and webhooks, rate tables) each hold their own SQL and reach the database only
through these.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar, Protocol

from .._errors import RunNotFound, SchemaVersionError, StoreError
from ._migrations import LATEST, MIGRATIONS
from ._records import RunWrite

__all__ = ["Connection", "Cursor"]


class Cursor(Protocol):
    """The slice of a DB-API cursor the shared SQL uses."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...
    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Connection(ABC):
    """The connection every part of a store shares, and the schema it holds.

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
    # The database's clock as seconds since the epoch, for leases (``db_clock=True``)
    # and rate limiters;
    # None: the dialect has no clock worth trusting over the caller's (SQLite runs on
    # the workers' own machine, so they share its clock).
    _db_now: ClassVar[str | None] = None
    # How a read opens one snapshot for several statements.
    _snapshot_begin: ClassVar[str] = "BEGIN"

    @property
    def has_db_clock(self) -> bool:
        """Whether this store can time leases and rate limits by the database
        server's own clock (PostgreSQL), rather than each caller's (SQLite, whose
        workers share one machine and its clock)."""
        return self._db_now is not None

    @abstractmethod
    def _write(self) -> AbstractContextManager[Cursor]:
        """A write transaction; commits on exit, rolls back on error."""

    @abstractmethod
    def _read(self) -> AbstractContextManager[Cursor]:
        """A cursor for reads."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""

    def release_thread(self) -> None:  # noqa: B027 (an optional hook)
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

    def _lock_migrations(self, cur: Cursor) -> None:  # noqa: B027 (an optional hook)
        """Serialise concurrent migrations (an advisory lock on PostgreSQL)."""

    def _check(self) -> None:  # noqa: B027 (an optional hook)
        """Called before every claim and heartbeat: raise if the store must not be
        used any more (SQLite: its file was deleted or replaced)."""

    def _clock(self, now: float, db_clock: bool) -> tuple[str, list[Any]]:
        """The SQL for "now" in lease arithmetic, and its parameters: the caller's
        ``now``, or the database's own clock where the dialect has one
        (``_db_now``) and the caller asked for it."""
        if db_clock and self._db_now is not None:
            return self._db_now, []
        return "?", [now]

    # Whether _fenced exists (PostgreSQL): without it, a commit goes straight to the
    # statement by statement path (SQLite, where a round trip costs nothing).
    _one_round_trip: ClassVar[bool] = False

    def _fenced(
        self,
        runs: Sequence[tuple[str, int]],
        write: Callable[[Cursor], None],
        *,
        lock: Callable[[Cursor], None] | None = None,
        parents_of: Sequence[str] = (),
        not_cancelled: Sequence[str] = (),
    ) -> dict[str, bool] | None:
        """One transaction, sent in one round trip where the database allows it
        (PostgreSQL's pipeline mode): let ``lock`` queue the statements that lock
        rows before the runs' (waiting for them: an ending parent's children, in the
        order a child's end locks them, child before parent), then lock every
        ``(run_id, epoch)`` of ``runs`` that is ``running`` at that epoch (and, for
        those of ``not_cancelled``, not asked to cancel) and, in
        the same statement and without waiting, the rows the ends of ``parents_of``
        write besides their own (their parents and those parents' forks, their
        children: ``told_rows_sql``), then let ``write`` queue its statements, and
        commit. Returns ``cancel_requested`` by run id; ``None`` when any run (or
        row of ``parents_of``) was not locked (nothing was written: the caller falls
        back to the statement-by-statement commit, which says why) or the dialect
        has no such thing (SQLite, where a round trip costs nothing). ``write`` must
        not read what it need not: its statements are only sent, their answers come
        at the end, and a read waits for its answer (a run's end reads its parent to
        tell and its children to cancel)."""
        return None

    # Whether _fenced_rows exists (PostgreSQL).
    _rows_in_one: ClassVar[bool] = False

    def _fenced_rows(self, batch: Sequence[RunWrite]) -> dict[str, bool] | None:
        """As :meth:`_fenced`, for a batch that writes journal rows and recovery
        resets only, in one statement where ``_rows_in_one`` says the dialect can."""
        raise NotImplementedError

    def _notify(self, cur: Cursor, run_id: str | None = None) -> None:  # noqa: B027 (an optional hook)
        """Tell listening workers that ``run_id`` (``None``: something) became
        runnable (NOTIFY on PostgreSQL)."""

    def listen(
        self, callback: Callable[[], None], *, on_run: Callable[[str], None] | None = None
    ) -> Callable[[], None] | None:
        """Call ``callback`` (from another thread) when something may have become
        runnable; returns a function that stops listening, or ``None`` when this store
        cannot push (workers then only poll).

        With ``on_run``, a push that names the run that became runnable calls
        ``on_run(run_id)`` instead, so that the listener can claim exactly that run;
        ``callback`` is still called whenever pushes may have been missed (at every
        (re)connection) or one names no run."""
        return None

    def _locked_run(self, cur: Cursor, run_id: str, columns: str, doing: str) -> Any:
        """The run's ``columns``, its row held until the transaction ends: what a
        read that decides a write to the run reads under (§11, ``FOR UPDATE`` on
        PostgreSQL), so that no worker's commit slips between the two.

        Raises:
            RunNotFound: no such run (``doing``: what could not be done, for the message).
        """
        cur.execute(f"SELECT {columns} FROM ms_runs WHERE id = ?{self._row_lock}", (run_id,))
        row = cur.fetchone()
        if row is None:
            raise RunNotFound(f"cannot {doing}: no run {run_id!r}")
        return row

    @contextmanager
    def _snapshot(self) -> Iterator[Cursor]:
        """A read transaction: every statement sees the database as of one moment."""
        with self._read() as cur:
            cur.execute(self._snapshot_begin)
            try:
                yield cur
            finally:
                cur.execute("COMMIT")

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
            # In order; a number may be absent while branches that each add one merge.
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

    def stamp_schema_version(self, version: int) -> None:
        """Record ``version`` as the schema's version without migrating anything (what
        a database written by another mainspring version says; for tools and tests)."""
        with self._write() as cur:
            cur.execute(
                "UPDATE ms_meta SET value = ? WHERE key = 'schema_version'", (str(version),)
            )
