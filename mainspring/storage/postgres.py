"""The PostgreSQL store: many workers on many machines sharing one database.

psycopg 3 with a connection pool. Claims take rows with ``FOR UPDATE SKIP LOCKED`` so
workers never wait on each other; commits lock their runs' rows while they check the
epoch fence; workers are woken by ``LISTEN``/``NOTIFY`` (polling stays as the
fallback); migrations run under an advisory lock so workers starting together don't
race. A lost connection surfaces as :class:`StoreUnavailable` (retryable); the pool
reconnects.

Needs the ``postgres`` extra: ``pip install 'mainspring[postgres]'``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, ClassVar

from .._errors import ConfigError, MissingExtra, StoreError, StoreUnavailable
from ._base import Cursor, Heartbeat, Store
from ._url import redact_url

try:
    import psycopg
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("the PostgreSQL store", "postgres", exc.name) from exc

__all__ = ["PostgresStore"]

log = logging.getLogger("mainspring.storage")

CHANNEL = "mainspring_wake"
# pg_advisory_xact_lock key for migrations: "msmigrat" as a 64-bit integer.
_MIGRATION_LOCK = 0x6D736D6967726174


@lru_cache(maxsize=512)
def _pg(sql: str) -> str:
    """The shared SQL uses ``?`` placeholders; psycopg wants ``%s``."""
    return sql.replace("%", "%%").replace("?", "%s")


class _Cursor:
    """A psycopg cursor that speaks the shared SQL's placeholders."""

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._cur.execute(_pg(sql), params)

    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> Any:
        return self._cur.executemany(_pg(sql), params)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()


class PostgresStore(Store):
    """A :class:`Store` in a PostgreSQL database.

    Args:
        dsn: ``postgresql://user@host:5432/dbname`` (any libpq connection string).
        min_size: connections the pool keeps open.
        max_size: connections the pool may open.
        connect_timeout_s: how long opening the store may wait for the server.
    """

    dialect: ClassVar[str] = "postgresql"
    _lock_clause: ClassVar[str] = " FOR UPDATE SKIP LOCKED"
    _fence_lock: ClassVar[str] = " FOR UPDATE SKIP LOCKED"
    _row_lock: ClassVar[str] = " FOR UPDATE"

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        connect_timeout_s: float = 10.0,
        migrate: bool = True,
    ) -> None:
        self.url = redact_url(dsn)  # what messages and logs show: no password
        self._dsn = dsn
        self._timeout = connect_timeout_s
        self._local = threading.local()  # per-thread transaction settings
        # Fail fast and clearly on a wrong DSN or a missing database, before the pool
        # starts retrying in the background.
        try:
            psycopg.connect(dsn, connect_timeout=max(1, int(connect_timeout_s))).close()
        except psycopg.OperationalError as exc:
            raise ConfigError(
                f"cannot connect to PostgreSQL at {redact_url(dsn)!r}: {_one_line(exc)}"
            ) from None
        except psycopg.ProgrammingError as exc:
            raise ConfigError(f"invalid PostgreSQL DSN {redact_url(dsn)!r}: {exc}") from None
        self._pool = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            timeout=connect_timeout_s,
            kwargs={"autocommit": True},
            open=True,
            name="mainspring",
        )
        if migrate:
            self.migrate()

    def close(self) -> None:
        self._pool.close()

    # -- transactions -------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[Cursor]:
        try:
            with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                if getattr(self._local, "lock_timeout", None):
                    cur.execute(f"SET LOCAL lock_timeout = '{self._local.lock_timeout}'")
                yield _Cursor(cur)
        except psycopg.Error as exc:
            raise self._error(exc, "writing") from exc

    @contextmanager
    def _read(self) -> Iterator[Cursor]:
        try:
            with self._pool.connection() as conn, conn.cursor() as cur:
                yield _Cursor(cur)
        except psycopg.Error as exc:
            raise self._error(exc, "reading") from exc

    @contextmanager
    def _autocommit(self) -> Iterator[Cursor]:
        # The pool's connections are in autocommit mode: outside a transaction block
        # each statement commits alone, with no BEGIN/COMMIT round trips.
        try:
            with self._pool.connection() as conn, conn.cursor() as cur:
                yield _Cursor(cur)
        except psycopg.Error as exc:
            raise self._error(exc, "writing") from exc

    def _error(self, exc: psycopg.Error, doing: str) -> Exception:
        where = f"PostgreSQL at {redact_url(self._dsn)!r}"
        if isinstance(exc, PoolTimeout):  # before OperationalError, which it is too
            return StoreUnavailable(
                f"{where}: no connection within {self._timeout}s while {doing} ({exc})"
            )
        if isinstance(
            exc,
            psycopg.OperationalError
            | psycopg.errors.SerializationFailure
            | psycopg.errors.DeadlockDetected
            | psycopg.errors.LockNotAvailable
            | psycopg.errors.AdminShutdown,
        ):
            return StoreUnavailable(f"{where} unavailable while {doing}: {str(exc).strip()}")
        return StoreError(f"{where} failed while {doing}: {str(exc).strip()}")

    def heartbeat(
        self, *, runs: Sequence[tuple[str, int]], now: float, lease_s: float
    ) -> Heartbeat:
        """One short transaction per run, each waiting a moment at most for its row: a
        row locked elsewhere delays its own lease, never the others'."""
        lost: set[str] = set()
        cancel: set[str] = set()
        self._local.lock_timeout = "500ms"
        try:
            for held in sorted(runs):
                try:
                    beat = super().heartbeat(runs=[held], now=now, lease_s=lease_s)
                except StoreUnavailable as exc:
                    if not isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
                        raise
                    continue  # locked elsewhere: neither extended nor lost; next beat
                lost |= beat.lost
                cancel |= beat.cancel
        finally:
            self._local.lock_timeout = None
        return Heartbeat(frozenset(lost), frozenset(cancel))

    # -- dialect hooks ------------------------------------------------------------------

    def _ddl(self, sql: str) -> str:
        return sql.format(
            float="DOUBLE PRECISION",
            autoid="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
            without_rowid="",
        )

    def _lock_migrations(self, cur: Cursor) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))

    def _notify(self, cur: Cursor) -> None:
        # Delivered at commit, once per transaction and channel.
        cur.execute(f"NOTIFY {CHANNEL}")

    def listen(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """LISTEN on a dedicated connection in a thread; reconnects with back-off."""
        stop = threading.Event()

        def run() -> None:
            delay = 0.1
            while not stop.is_set():
                try:
                    with psycopg.connect(
                        self._dsn, autocommit=True, connect_timeout=max(1, int(self._timeout))
                    ) as conn:
                        conn.execute(f"LISTEN {CHANNEL}")
                        callback()  # anything sent while we were away: look now
                        delay = 0.1
                        while not stop.is_set():
                            for _ in conn.notifies(timeout=0.5, stop_after=64):
                                if stop.is_set():
                                    break
                                callback()
                except psycopg.Error as exc:
                    if stop.is_set():
                        return
                    log.warning("LISTEN connection lost (%s); reconnecting", exc)
                    stop.wait(delay)
                    delay = min(delay * 2, 5.0)

        thread = threading.Thread(target=run, name="mainspring-listen", daemon=True)
        thread.start()

        def stop_listening() -> None:
            stop.set()  # the thread notices within its 0.5 s poll and closes its connection

        return stop_listening


def _one_line(exc: BaseException) -> str:
    """libpq's messages span lines (a hint on a tab-indented second line)."""
    return " ".join(str(exc).split())
