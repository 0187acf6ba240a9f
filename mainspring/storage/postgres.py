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
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from functools import lru_cache
from typing import Any, ClassVar

from .._errors import ConfigError, MissingExtra, StoreError, StoreUnavailable
from ._base import Cursor, Heartbeat, Store
from ._children import told_rows_sql
from ._records import RunWrite
from ._rows import _STEP_COLUMNS, _STEP_FIELDS, _UPSERT_STEP, _step_params
from ._streams import APPEND_COLUMNS, APPEND_HEAD
from ._transitions import fenced
from ._url import redact_url
from ._workers import WorkerBeat, register, register_params, register_sql

try:
    import psycopg
    from psycopg.types.json import Jsonb
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("the PostgreSQL store", "postgres", exc.name) from exc

__all__ = ["PostgresStore"]

log = logging.getLogger("mainspring.storage")

CHANNEL = "mainspring_wake"
# pg_advisory_xact_lock key for migrations: "msmigrat" as a 64-bit integer.
_MIGRATION_LOCK = 0x6D736D6967726174


# The fence of a one-round-trip commit (see ``PostgresStore._fenced``), spelled by
# the state machine (``_transitions.fenced``), as every fence here is: ordered, so
# that concurrent commits lock rows in one order; ``id = ANY`` makes it look the runs
# up by key rather than scan every running one. The runs of the last parameter must
# not have been asked to cancel (they end otherwise, see ``not_cancelled``).
_FENCE = (
    "SELECT coalesce(array_agg(f.id), '{}'), coalesce(array_agg(f.cancel_requested), '{}'),"
    " 1 / CAST(count(*) = %s AS INT) FROM (SELECT r.id, r.cancel_requested FROM ms_runs r"
    " JOIN unnest(CAST(%s AS TEXT[]), CAST(%s AS BIGINT[])) AS h(id, epoch)"
    f" ON r.id = h.id WHERE r.id = ANY(CAST(%s AS TEXT[])) AND {fenced('r.', 'h.epoch')}"
    " AND (r.cancel_requested = 0 OR NOT r.id = ANY(CAST(%s AS TEXT[])))"
    " ORDER BY r.id FOR UPDATE OF r SKIP LOCKED) f"
)
# The same, for a batch of several runs that ends runs: it locks the rows those ends
# write besides their own too (parents and their forks told, children cancelled:
# ``told_rows_sql``; ``SKIP LOCKED``, see ``lock_parents``), and divides by zero
# unless it locked every one, so that those writes never wait while the batch holds
# its runs. It also refuses a batch one of whose ends writes another's row (a parent
# ending with its child): their ends must apply child first (see ``_deepest_first``),
# which the statement by statement commit does.
_FENCE_PARENTS = (
    told_rows_sql("id = ANY(CAST(%s AS TEXT[]))")
    + ", want AS (SELECT DISTINCT h.id FROM told h JOIN ms_runs x ON x.id = h.id),"
    " got AS (SELECT p.id FROM ms_runs p JOIN want ON p.id = want.id"
    " ORDER BY p.id FOR UPDATE OF p SKIP LOCKED) "
    + _FENCE.replace(
        "1 / CAST(count(*) = %s AS INT)",
        "1 / CAST(count(*) = %s AND (SELECT count(*) FROM got) = (SELECT count(*) FROM want)"
        " AND NOT EXISTS (SELECT 1 FROM want w JOIN tree t ON t.id = w.id AND t.root = t.id)"
        " AS INT)",
    )
)


# A commit of journal rows (and recovery resets) only, as one statement with one
# parameter: a JSON document {"runs": [{"id", "epoch"}], "ids": [...], "rows": [...],
# "resets": [...]}. The fence is the one above; the rows are read by
# ``jsonb_populate_recordset`` with the table's own row type (a new column needs no
# change here); the resets run only once the fence held. The answer is the ids of the
# runs asked to cancel (NULL: none). One JSON parameter and a NULL answer cost the
# client far less than arrays both ways (psycopg dumps each list parameter and parses
# each array it gets back in Python: ~30 µs of a commit's client time, measured), and
# the common commit, without resets, has no UPDATE of ms_runs for the executor to set
# up (its indexes).
_COMMIT_STEPS = (
    "WITH p AS (SELECT CAST(%s AS JSONB) AS j),"
    " fence AS (SELECT r.id, r.cancel_requested FROM ms_runs r"
    " JOIN jsonb_to_recordset((SELECT j -> 'runs' FROM p)) AS h(id TEXT, epoch BIGINT)"
    " ON r.id = h.id"
    " WHERE r.id = ANY(ARRAY(SELECT jsonb_array_elements_text(j -> 'ids') FROM p))"
    f" AND {fenced('r.', 'h.epoch')} ORDER BY r.id FOR UPDATE OF r SKIP LOCKED),"
    " held AS (SELECT jsonb_agg(id) FILTER (WHERE cancel_requested <> 0) AS cancels,"
    " 1 / CAST(count(*) = (SELECT jsonb_array_length(j -> 'ids') FROM p) AS INT) AS one"
    " FROM fence),"
    f" journal AS (INSERT INTO ms_steps ({_STEP_COLUMNS})"
    f" SELECT {', '.join(f's.{c}' for c in _STEP_FIELDS)}"
    " FROM jsonb_populate_recordset(NULL::ms_steps, (SELECT j -> 'rows' FROM p)) s, held"
    " WHERE held.one = 1 ON CONFLICT" + _UPSERT_STEP.split(" ON CONFLICT", 1)[1] + "),"
    "{reset} SELECT cancels FROM held"
)
_COMMIT_STEPS_RESET = _COMMIT_STEPS.replace(
    "{reset}",
    " reset AS (UPDATE ms_runs r SET recoveries = 0 FROM held"
    " WHERE r.id IN (SELECT jsonb_array_elements_text(j -> 'resets') FROM p)"
    " AND held.one = 1)",
)
_COMMIT_STEPS = _COMMIT_STEPS.replace("),{reset}", ")")
# The same for one run without a reset (every step of a run alone in its worker): a
# point lookup, no join of the fence against a set (~20 µs of server CPU less).
_COMMIT_ONE = (
    "WITH fence AS (SELECT cancel_requested FROM ms_runs WHERE id = %s"
    f" AND {fenced(epoch='%s')} FOR UPDATE SKIP LOCKED),"
    f" journal AS (INSERT INTO ms_steps ({_STEP_COLUMNS})"
    f" SELECT {', '.join(f's.{c}' for c in _STEP_FIELDS)}"
    " FROM jsonb_populate_recordset(NULL::ms_steps, CAST(%s AS JSONB)) s"
    " WHERE EXISTS (SELECT FROM fence) ON CONFLICT" + _UPSERT_STEP.split(" ON CONFLICT", 1)[1] + ")"
    " SELECT CASE WHEN max(cancel_requested) <> 0 THEN jsonb_build_array(CAST(%s AS TEXT)) END,"
    " 1 / count(*) FROM fence"
)


# A batch of token stream rows, fenced and placed, as one statement (autocommit: the
# head row's lock is held only while the server runs it, never while a frozen client
# sits in an open transaction). The rows are one JSON parameter, read with the table's
# own row type; their "pos" is their place within the batch, from 1.
_APPEND_STREAM = (
    f"WITH head AS ({APPEND_HEAD}) INSERT INTO ms_stream_chunks ({APPEND_COLUMNS})"
    " SELECT r.run_id, r.session, r.seq, r.epoch, r.attempt, r.idx, r.kind, r.call_index,"
    " r.call_id, r.name, r.text, r.end_reason, r.created_at, head.pos - ? + r.pos"
    " FROM head, jsonb_populate_recordset(NULL::ms_stream_chunks, CAST(? AS JSONB)) r"
)
_APPEND_NAMES = [c.strip() for c in APPEND_COLUMNS.split(",")]


class _Default(float):
    """A timeout nobody chose: mainspring's default."""


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
        idle_in_transaction_timeout_s: the server ends a session that sits inside a
            transaction this long without sending anything (a frozen or paused
            worker), which releases its row locks, so other workers can take its
            runs over and ``cancel``/``signal`` never wait on it for longer.
            mainspring's own transactions never idle for more than milliseconds.
        lock_timeout_s: the longest any statement waits for a row lock; past it the
            call fails with the retryable :class:`StoreUnavailable`.
        statement_timeout_s: the longest any statement may run (migrations are
            exempt); past it the call fails with :class:`StoreUnavailable`.

    Each timeout is set on every connection the store opens. A value you pass wins;
    ``None`` leaves the server's setting alone; a default gives way to a setting made
    for the role or the database (``ALTER ROLE ... SET``) or in the DSN's ``options``
    (``?options=-c%20lock_timeout%3D2s``), so workers started from a URL can be tuned.
    """

    dialect: ClassVar[str] = "postgresql"
    _lock_clause: ClassVar[str] = " FOR UPDATE SKIP LOCKED"
    _fence_lock: ClassVar[str] = " FOR UPDATE SKIP LOCKED"
    _row_lock: ClassVar[str] = " FOR UPDATE"
    _claim_returning: ClassVar[bool] = True
    _rows_in_one: ClassVar[bool] = True
    _one_round_trip: ClassVar[bool] = True
    _snapshot_begin: ClassVar[str] = "BEGIN ISOLATION LEVEL REPEATABLE READ"
    # Leases on the server's clock (when the App runs on the real clock): one clock
    # for every machine, so a worker whose own clock runs ahead cannot see healthy
    # leases as expired.
    _db_now: ClassVar[str | None] = (
        "CAST(extract(epoch FROM clock_timestamp()) AS DOUBLE PRECISION)"
    )

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        connect_timeout_s: float = 10.0,
        idle_in_transaction_timeout_s: float | None = _Default(10.0),
        lock_timeout_s: float | None = _Default(5.0),
        statement_timeout_s: float | None = _Default(60.0),
        migrate: bool = True,
    ) -> None:
        self.url = redact_url(dsn)  # what messages and logs show: no password
        self._dsn = dsn
        self._timeout = connect_timeout_s
        # name -> (value, forced): a default gives way to a setting the operator made
        # for the role, the database or the connection (ALTER ROLE ... SET, options=-c).
        self._settings = {
            name: (_ms(name, value), not isinstance(value, _Default))
            for name, value in (
                ("idle_in_transaction_session_timeout", idle_in_transaction_timeout_s),
                ("lock_timeout", lock_timeout_s),
                ("statement_timeout", statement_timeout_s),
            )
            if value is not None
        }
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
            configure=self._configure,
            open=True,
            name="mainspring",
        )
        if migrate:
            self.migrate()

    def close(self) -> None:
        self._pool.close()

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        # Session settings, once per new connection (autocommit: they stay), in one
        # round trip.
        if self._settings:
            conn.execute(
                "SELECT set_config(v.name, v.value, false) FROM (VALUES "
                + ", ".join("(%s, %s, %s)" for _ in self._settings)
                + ") AS v(name, value, forced) JOIN pg_settings s ON s.name = v.name"
                " WHERE v.forced OR s.source NOT IN ('client', 'user', 'database',"
                " 'database user')",
                [
                    x
                    for name, (value, forced) in self._settings.items()
                    for x in (name, value, forced)
                ],
            )

    # -- transactions -------------------------------------------------------------------

    def _write(self) -> AbstractContextManager[Cursor]:
        return self._cursor("writing", transaction=True)

    def _read(self) -> AbstractContextManager[Cursor]:
        return self._cursor("reading", transaction=False)

    def _autocommit(self) -> AbstractContextManager[Cursor]:
        # The pool's connections are in autocommit mode: outside a transaction block
        # each statement commits alone, with no BEGIN/COMMIT round trips.
        return self._cursor("writing", transaction=False)

    @contextmanager
    def _cursor(self, doing: str, *, transaction: bool) -> Iterator[Cursor]:
        """A cursor on a pooled connection, its statements in one transaction
        (``transaction``) or each committing alone: the three ways the store talks to
        the database differ only there, and all report a driver's error as the
        store's own (``doing``: what the store was doing, for its message)."""
        try:
            with (
                self._pool.connection() as conn,
                conn.transaction() if transaction else nullcontext(),
                conn.cursor() as cur,
            ):
                yield _Cursor(cur)
        except psycopg.Error as exc:
            raise self._error(exc, doing) from exc

    def _fenced(
        self,
        runs: Sequence[tuple[str, int]],
        write: Callable[[Cursor], None],
        *,
        lock: Callable[[Cursor], None] | None = None,
        parents_of: Sequence[str] = (),
        not_cancelled: Sequence[str] = (),
    ) -> dict[str, bool] | None:
        """BEGIN, the fence, ``write``'s statements and COMMIT in one pipeline: one
        round trip. The fence locks the runs that are ``running`` at their epochs
        (``SKIP LOCKED``: a row another transaction holds counts as failed; so does
        a run of ``not_cancelled`` asked to cancel) and divides by zero unless it
        locked them all, which aborts the transaction before anything after it
        runs."""
        try:
            with self._pool.connection() as conn:
                fence, cur = conn.cursor(), conn.cursor()
                ids = [r for r, _ in runs]
                refused = False
                try:
                    # BEGIN and COMMIT are statements of the pipeline, not
                    # conn.transaction(), which waits for each; the one Sync is
                    # the pipeline's exit. The fence's error may come back while
                    # later statements are being sent, or at the exit.
                    with conn.pipeline():
                        try:
                            cur.execute("BEGIN")
                            if lock is not None:
                                lock(_Cursor(cur))
                            params = (
                                len(runs),
                                ids,
                                [e for _, e in runs],
                                ids,
                                list(not_cancelled),
                            )
                            if parents_of:
                                fence.execute(_FENCE_PARENTS, (list(parents_of), *params))
                            else:
                                fence.execute(_FENCE, params)
                            write(_Cursor(cur))
                            cur.execute("COMMIT")
                        except psycopg.errors.DivisionByZero:
                            refused = True
                except psycopg.Error as exc:
                    aborted = isinstance(exc, psycopg.errors.PipelineAborted)
                    if not isinstance(exc, psycopg.errors.DivisionByZero) and not (
                        refused and aborted
                    ):
                        with suppress(psycopg.Error):
                            conn.rollback()
                        raise
                    refused = True
                if refused:
                    conn.rollback()  # the transaction block stays open, aborted
                    return None
                row = fence.fetchone()
                assert row is not None  # an aggregate: always one row
                locked, cancels, _ = row
                return {rid: bool(c) for rid, c in zip(locked, cancels, strict=True)}
        except psycopg.Error as exc:
            raise self._error(exc, "writing") from exc

    def _fenced_rows(self, batch: Sequence[RunWrite]) -> dict[str, bool] | None:
        """Journal rows and recovery resets, fenced, in one statement (autocommit:
        one round trip, and psycopg prepares it like any other)."""
        ids = [w.run_id for w in batch]
        rows = [
            dict(zip(_STEP_FIELDS, _step_params(s), strict=True)) for w in batch for s in w.steps
        ]
        resets = [w.run_id for w in batch if w.reset_recoveries]
        params: tuple[Any, ...]
        if len(batch) == 1 and not resets:
            sql, params = _COMMIT_ONE, (ids[0], batch[0].epoch, Jsonb(rows), ids[0])
        else:
            doc = {
                "runs": [{"id": w.run_id, "epoch": w.epoch} for w in batch],
                "ids": ids,
                "rows": rows,
                **({"resets": resets} if resets else {}),
            }
            sql, params = (_COMMIT_STEPS_RESET if resets else _COMMIT_STEPS), (Jsonb(doc),)
        try:
            with self._pool.connection() as conn, conn.cursor() as cur:
                try:
                    cur.execute(sql, params)
                except psycopg.errors.DivisionByZero:
                    return None
                row = cur.fetchone()
        except psycopg.Error as exc:
            raise self._error(exc, "writing") from exc
        assert row is not None  # an aggregate: always one row
        cancelled = set(row[0] or ())
        return {rid: rid in cancelled for rid in ids}

    def _append_stream(self, run_id: str, epoch: int, rows: list[tuple[Any, ...]]) -> bool:
        doc = [dict(zip(_APPEND_NAMES, r, strict=True)) for r in rows]
        with self._autocommit() as cur:
            cur.execute(_APPEND_STREAM, (len(rows), run_id, epoch, len(rows), Jsonb(doc)))
            return cur.rowcount > 0

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
            | psycopg.errors.QueryCanceled
            | psycopg.errors.IdleInTransactionSessionTimeout
            | psycopg.errors.AdminShutdown,
        ):
            return StoreUnavailable(f"{where} unavailable while {doing}: {str(exc).strip()}")
        return StoreError(f"{where} failed while {doing}: {str(exc).strip()}")

    def heartbeat(
        self,
        *,
        runs: Sequence[tuple[str, int]],
        now: float,
        lease_s: float,
        db_clock: bool = False,
        worker: WorkerBeat | None = None,
    ) -> Heartbeat:
        """One statement for every held run, whatever their number, with the
        worker's registration (``worker``) in it.

        Rows that another transaction holds are skipped (``SKIP LOCKED``), so that
        they never delay the others' leases. A run is lost when its row is gone, or
        its epoch or status moved on (read from the last committed version of the
        row). The skipped rows, usually held for a moment by this worker's own group
        commit, get a second statement that waits for them briefly; a row still held
        after that is neither extended nor lost this beat.
        """
        self._check()
        at, at_params = self._clock(now, db_clock)
        if not runs:
            if worker is not None:
                with self._write() as cur:
                    register(cur, worker, at, at_params)
            return Heartbeat(frozenset(), frozenset())
        if worker is not None and worker.forget_before is not None:
            with self._write() as cur:  # now and then (see _workers.py): its own trip
                register(cur, worker, at, at_params)
            worker = None
        ids = [rid for rid, _ in runs]
        epochs = [epoch for _, epoch in runs]
        # The registration rides in the statement as a data-modifying CTE.
        reg = "" if worker is None else f" reg AS ({register_sql(at)}),"
        reg_params = [] if worker is None else register_params(worker, at_params)
        with self._autocommit() as cur:
            cur.execute(
                f"WITH{reg} held AS (SELECT * FROM unnest(CAST(? AS TEXT[]), CAST(? AS BIGINT[]))"
                " AS h(id, epoch)),"
                " mine AS (SELECT r.id FROM ms_runs r JOIN held ON r.id = held.id"
                f" WHERE {fenced('r.', 'held.epoch')}"
                " ORDER BY r.id FOR UPDATE OF r SKIP LOCKED),"
                f" beat AS (UPDATE ms_runs r SET lease_until = {at} + ? FROM mine"
                " WHERE r.id = mine.id RETURNING r.id, r.cancel_requested)"
                " SELECT held.id, beat.id IS NOT NULL, beat.cancel_requested,"
                f" {fenced('r.', 'held.epoch')}"
                " FROM held LEFT JOIN beat ON beat.id = held.id"
                " LEFT JOIN ms_runs r ON r.id = held.id",
                (*reg_params, ids, epochs, *at_params, lease_s),
            )
            rows = cur.fetchall()
        lost = {rid for rid, extended, _, current in rows if not extended and not current}
        cancel = {rid for rid, extended, cancel, _ in rows if extended and cancel}
        held = dict(runs)
        skipped = sorted(rid for rid, extended, _, current in rows if not extended and current)
        if skipped:
            cancel |= self._beat_locked(
                [(rid, held[rid]) for rid in skipped], at, at_params, lease_s
            )
        return Heartbeat(frozenset(lost), frozenset(cancel))

    def _beat_locked(
        self, runs: list[tuple[str, int]], at: str, at_params: list[Any], lease_s: float
    ) -> set[str]:
        """Extend leases whose rows were locked a moment ago, waiting a little for them.
        Returns those asked to cancel.

        Waiting, it locks them in the order a cascade does (``lock_closed_children``),
        a child before its parent (their paths from the root of their tree of child
        runs, descending): the order a child's end takes too (its row, then its
        parent's), so a beat never holds a parent while it waits for a child whose end
        waits for that parent. In no set order, the lock timeout broke that cycle:
        the child's end stalled and the beat extended none of the leases it waited for."""
        try:
            with self._write() as cur:
                cur.execute("SET LOCAL lock_timeout = '500ms'")
                cur.execute(
                    "WITH RECURSIVE held AS (SELECT * FROM unnest(CAST(? AS TEXT[]),"
                    " CAST(? AS BIGINT[])) AS h(id, epoch)),"
                    " up (id, node, depth) AS (SELECT id, id, 0 FROM held UNION ALL"
                    " SELECT up.id, r.parent, up.depth + 1 FROM up JOIN ms_runs r"
                    " ON r.id = up.node WHERE r.parent_kind = 'child' AND r.parent IS NOT NULL"
                    " AND up.depth < 1000),"
                    " paths AS (SELECT id, array_agg(node ORDER BY depth DESC) AS path"
                    " FROM up GROUP BY id),"
                    " locked AS MATERIALIZED (SELECT r.id FROM ms_runs r"
                    " JOIN held ON held.id = r.id"
                    f" JOIN paths ON paths.id = r.id WHERE {fenced('r.', 'held.epoch')}"
                    " ORDER BY paths.path DESC FOR UPDATE OF r)"
                    f" UPDATE ms_runs r SET lease_until = {at} + ? FROM locked"
                    " WHERE r.id = locked.id RETURNING r.id, r.cancel_requested",
                    ([r for r, _ in runs], [e for _, e in runs], *at_params, lease_s),
                )
                return {rid for rid, cancel in cur.fetchall() if cancel}
        except StoreUnavailable as exc:
            if not isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
                raise
            return set()  # held elsewhere for longer: neither extended nor lost; next beat

    # -- dialect hooks ------------------------------------------------------------------

    def _ddl(self, sql: str) -> str:
        return sql.format(
            float="DOUBLE PRECISION",
            autoid="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
            without_rowid="",
        )

    def _lock_migrations(self, cur: Cursor) -> None:
        # A migration may wait for another worker's and may take long on a big
        # table: neither is what the per-connection timeouts are there to stop.
        cur.execute("SET LOCAL lock_timeout = 0")
        cur.execute("SET LOCAL statement_timeout = 0")
        cur.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))

    def _notify(self, cur: Cursor, run_id: str | None = None) -> None:
        # Delivered at commit, once per transaction, channel and payload.
        cur.execute("SELECT pg_notify(?, ?)", (CHANNEL, run_id or ""))

    def listen(
        self, callback: Callable[[], None], *, on_run: Callable[[str], None] | None = None
    ) -> Callable[[], None] | None:
        """LISTEN on a dedicated connection in a thread; reconnects with back-off.
        Each notification's payload is the run that became runnable (empty: any);
        ``callback`` is also called at every (re)connection, for what was sent
        while nobody listened."""
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
                            for note in conn.notifies(timeout=0.5, stop_after=64):
                                if stop.is_set():
                                    break
                                if on_run is not None and note.payload:
                                    on_run(note.payload)
                                else:
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


def _ms(name: str, seconds: float) -> str:
    """A timeout setting's value in milliseconds (0 turns it off, as in PostgreSQL)."""
    if seconds < 0:
        raise ConfigError(f"{name}: a timeout must be >= 0 seconds, got {seconds!r}")
    return f"{round(seconds * 1000)}ms"


def _one_line(exc: BaseException) -> str:
    """libpq's messages span lines (a hint on a tab-indented second line)."""
    return " ".join(str(exc).split())
