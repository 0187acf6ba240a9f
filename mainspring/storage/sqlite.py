"""The SQLite store: the embedded default, on the standard library's ``sqlite3``.

WAL journal, ``synchronous=FULL`` by default (a committed step survives power
loss) or ``NORMAL`` on request (survives a process crash, may lose the last
commits on power loss), a busy timeout, and ``BEGIN IMMEDIATE`` for every write so
that claims and fenced commits serialise across worker processes.

URL forms: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``, with
optional ``?synchronous=NORMAL&busy_timeout_ms=10000&wal_limit_mb=64``.

The WAL and a reader that never ends: SQLite copies the write-ahead log back into the
database (a *checkpoint*) only up to the oldest snapshot a reader still holds, and can
start the log over only when no reader needs it. A read transaction held open (an
operator's ``sqlite3`` shell, a backup, a stuck reader) therefore lets the ``-wal`` file
grow with every commit (about 15 MB/s under a busy worker), and SQLite reuses the file
afterwards rather than shrinking it. ``journal_size_limit`` (``wal_limit_bytes``) makes
SQLite truncate the log back to that size when it starts it over, which the first
checkpoint after the reader leaves allows; :meth:`SQLiteStore.checkpoint` truncates it
at once, and workers call it (without waiting) when they find the file past its limit.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar, Literal
from urllib.parse import parse_qsl, urlsplit

from .._errors import ConfigError, StoreError, StoreUnavailable
from ._base import Cursor, Store

__all__ = ["DatabaseGone", "SQLiteStore"]

Synchronous = Literal["FULL", "NORMAL", "EXTRA", "OFF"]


#: ``journal_size_limit`` by default: a log starts over at most this large. In steady
#: use it stays near SQLite's automatic checkpoint (1,000 pages, 8 MiB here).
WAL_LIMIT_BYTES = 64 << 20


class DatabaseGone(StoreError):
    """The SQLite file was deleted or replaced under a running store: whatever it
    writes now goes to a file no other process can see. Not retryable; a worker
    that meets it stops."""


class SQLiteStore(Store):
    """A :class:`Store` in one SQLite file, shared by any number of local processes.

    What SQLite cannot do: the file must live on a local disk of the one machine
    whose processes share it (never a network file system), every worker uses that
    machine's clock, and one writer at a time holds the whole database, so a
    process frozen inside a write stops every other writer until its transaction
    ends.
    """

    dialect: ClassVar[str] = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout_ms: int = 5000,
        migrate: bool = True,
        wal_limit_bytes: int = WAL_LIMIT_BYTES,
    ) -> None:
        path = os.fspath(path)
        if path in ("", ":memory:"):
            raise ConfigError(
                f"SQLite path {path!r}: an in-memory database cannot be shared by the "
                "engine's threads and workers; use a file (a temporary one in tests)"
            )
        sync = str(synchronous).upper()
        if sync not in ("FULL", "NORMAL", "EXTRA", "OFF"):
            raise ConfigError(
                f"synchronous={synchronous!r}: expected FULL (default), NORMAL, EXTRA or OFF"
            )
        self.path = path
        self.synchronous = sync
        self.busy_timeout_ms = int(busy_timeout_ms)
        if isinstance(wal_limit_bytes, bool) or not isinstance(wal_limit_bytes, int):
            raise ConfigError(f"wal_limit_bytes must be an integer, got {wal_limit_bytes!r}")
        if wal_limit_bytes < 0:
            raise ConfigError(f"wal_limit_bytes must be >= 0, got {wal_limit_bytes!r}")
        self.wal_limit_bytes = wal_limit_bytes
        self.url = f"sqlite:///{path}"
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        _create_private(path)
        # (st_dev, st_ino) of the file when the first connection opened it: a path
        # that later names another file (or none) means ours was deleted or replaced.
        self._identity: tuple[int, int] | None = None
        self._gone: str | None = None
        if migrate:
            try:
                self.migrate()
            except BaseException:
                self.close()
                raise

    @classmethod
    def from_url(cls, url: str, *, migrate: bool = True) -> SQLiteStore:
        """Open ``sqlite:///path?synchronous=NORMAL&busy_timeout_ms=5000``."""
        parts = urlsplit(url)
        if parts.scheme != "sqlite":
            raise ConfigError(f"not a SQLite URL: {url!r} (expected sqlite:///path/to/file.db)")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if parts.netloc:
            raise ConfigError(
                f"SQLite URL {url!r} has a host part {parts.netloc!r}; use three slashes "
                "for a relative path (sqlite:///app.db) or four for an absolute one"
            )
        options = dict(parse_qsl(parts.query))
        unknown = set(options) - {"synchronous", "busy_timeout_ms", "wal_limit_mb"}
        if unknown:
            raise ConfigError(
                f"SQLite URL {url!r}: unknown option(s) {sorted(unknown)!r}; "
                "known: synchronous, busy_timeout_ms, wal_limit_mb"
            )
        sync = options.get("synchronous", "FULL").upper()
        try:
            busy = int(options.get("busy_timeout_ms", "5000"))
        except ValueError:
            raise ConfigError(f"SQLite URL {url!r}: busy_timeout_ms must be an integer") from None
        try:
            limit = int(options.get("wal_limit_mb", str(WAL_LIMIT_BYTES >> 20))) << 20
        except ValueError:
            raise ConfigError(f"SQLite URL {url!r}: wal_limit_mb must be an integer") from None
        return cls(
            path,
            synchronous=sync,  # type: ignore[arg-type]
            busy_timeout_ms=busy,
            migrate=migrate,
            wal_limit_bytes=limit,
        )

    # -- connections ----------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._open()
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
                if self._identity is None:
                    st = os.stat(self.path)
                    self._identity = (st.st_dev, st.st_ino)
        return conn

    def _open(self) -> sqlite3.Connection:
        """A new connection, set up. The set-up is idempotent, so one that meets a lock
        (a new thread's first statement while other threads write, which does not
        always go through the busy handler) is tried again within the busy timeout."""
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        delay = 0.01
        while True:
            conn: sqlite3.Connection | None = None
            try:
                conn = sqlite3.connect(
                    self.path,
                    isolation_level=None,  # we issue BEGIN ourselves
                    timeout=self.busy_timeout_ms / 1000,
                    check_same_thread=False,
                )
                conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
                # 8 KiB pages keep ~1 KiB journal rows inline instead of each spilling to
                # a mostly empty overflow page (a no-op on an existing database).
                conn.execute("PRAGMA page_size = 8192")
                mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() != "wal":  # set once, by the first connection
                    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    conn.close()
                    raise StoreError(f"SQLite file {self.path!r} cannot use WAL (got {mode!r})")
                conn.execute(f"PRAGMA synchronous = {self.synchronous}")
                # Each connection that starts the log over truncates it to this size: a
                # log a long reader let grow shrinks back once it has gone (see above).
                conn.execute(f"PRAGMA journal_size_limit = {self.wal_limit_bytes}")
                return conn
            except sqlite3.DatabaseError as exc:
                if conn is not None:
                    conn.close()
                locked = isinstance(exc, sqlite3.OperationalError) and (
                    "locked" in str(exc) or "busy" in str(exc)
                )
                if not locked or time.monotonic() + delay > deadline:
                    raise self._error(exc, "opening") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def check_file(self) -> None:
        """Raise :class:`DatabaseGone` if the path no longer names the file this store
        opened (deleted, or replaced by another file). Workers call it with every
        claim and heartbeat: a stat, no I/O on the database.
        """
        if self._gone is None and self._identity is not None:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                self._gone = "was deleted"
            else:
                if (st.st_dev, st.st_ino) != self._identity:
                    self._gone = "was replaced by another file"
        if self._gone is not None:
            raise DatabaseGone(
                f"SQLite file {self.path!r} {self._gone} while this process had it open: "
                "anything written now would be lost. Stopping; restore the file (or start "
                "on a new one) and restart the workers"
            )

    def _check(self) -> None:
        self.check_file()

    # -- the write-ahead log -------------------------------------------------------

    def wal_size(self) -> tuple[int, int]:
        """``(bytes of the -wal file now, the limit it is truncated to)``."""
        try:
            size = os.path.getsize(self.path + "-wal")
        except OSError:  # none yet, or removed by the last connection's close
            size = 0
        return size, self.wal_limit_bytes

    def checkpoint(self, *, wait: bool = False) -> tuple[int, int]:
        """Copy the write-ahead log into the database and truncate it to nothing
        (``PRAGMA wal_checkpoint(TRUNCATE)``), after a passive checkpoint that does
        the copying without holding writers back. A read transaction that still uses
        the log keeps it (nothing is lost; try again once it has ended).

        Args:
            wait: wait up to the busy timeout for readers and writers to let go;
                ``False``: give up at once (what a worker does now and then).

        Returns:
            :meth:`wal_size` afterwards.
        """
        conn = self._conn()
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            if not wait:
                conn.execute("PRAGMA busy_timeout = 0")
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            finally:
                if not wait:
                    conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise self._error(exc, "checkpointing") from exc
        except sqlite3.DatabaseError as exc:
            raise self._error(exc, "checkpointing") from exc
        return self.wal_size()

    def release_thread(self) -> None:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            return
        self._local.conn = None
        with self._lock:
            if conn in self._all:
                self._all.remove(conn)
        conn.close()

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()

    def _write(self) -> _WriteTransaction:
        if self._gone is not None:
            self.check_file()  # raises: never write into a file nobody can see
        return _WriteTransaction(self, self._conn())

    @contextmanager
    def _read(self) -> Iterator[Cursor]:
        conn = self._conn()
        try:
            yield conn.cursor()
        except sqlite3.DatabaseError as exc:
            raise self._error(exc, "reading") from exc

    def _ddl(self, sql: str) -> str:
        return sql.format(
            float="REAL",
            autoid="INTEGER PRIMARY KEY AUTOINCREMENT",
            without_rowid=" WITHOUT ROWID",
        )

    def _error(self, exc: sqlite3.DatabaseError, doing: str) -> Exception:
        text = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and (
            "locked" in text
            or "busy" in text
            or "unable to open" in text
            or "I/O" in text
            # SQLITE_FULL: a full disk (or max_page_count) can be freed; the same
            # write may succeed later.
            or "is full" in text
        ):
            return StoreUnavailable(
                f"SQLite file {self.path!r} unavailable while {doing}: {text} "
                f"(busy timeout {self.busy_timeout_ms} ms)"
            )
        if isinstance(exc, sqlite3.ProgrammingError):  # a value of the wrong type, say
            return StoreError(f"SQLite file {self.path!r} refused a value while {doing}: {text}")
        return StoreError(
            f"SQLite file {self.path!r} failed while {doing}: {text}; is it a mainspring "
            "database, and intact?"
        )


class _WriteTransaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on an error), as a class rather
    than a generator-based context manager: every step's commit passes through it,
    and a generator's ``__enter__``/``__exit__`` cost about a microsecond more."""

    __slots__ = ("conn", "store")

    def __init__(self, store: SQLiteStore, conn: sqlite3.Connection) -> None:
        self.store = store
        self.conn = conn

    def __enter__(self) -> Cursor:
        try:
            return self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            raise self.store._error(exc, "starting a write") from exc

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        conn = self.conn
        if exc is None:
            try:
                conn.execute("COMMIT")
                return
            except BaseException as error:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(error, sqlite3.DatabaseError):
                    raise self.store._error(error, "writing") from error
                raise
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if isinstance(exc, sqlite3.DatabaseError):
            raise self.store._error(exc, "writing") from exc


def _create_private(path: str) -> None:
    """Create a new database file readable by its owner only (0600, whatever the
    umask): it holds run inputs and outputs and webhook signing secrets. SQLite
    gives the ``-wal`` and ``-shm`` files the database file's mode. An existing file
    keeps its mode (the operator chose it)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:  # it exists, or sqlite3 reports the real problem when it opens
        return
    os.close(fd)
