"""The rate limiters' shared state in the store (``ms_rate_limits``, ``ms_rate_outputs``).

SQLite: one short ``BEGIN IMMEDIATE`` transaction reads the row, runs the GCRA of
``_rate.py`` and writes it back (the write lock serialises every process on the file).
PostgreSQL: one autocommit ``UPDATE`` computes the same arithmetic on the row it locks,
against the database's clock, so workers on machines whose clocks disagree still book
one timeline. ``now`` may be given explicitly (tests); ``None`` means the store's clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import ConfigError
from ..storage import Store
from ..storage._base import Cursor
from ._rate import (
    DIMENSIONS,
    BucketState,
    Dimension,
    RateLimit,
    book,
    effective_limits,
    settle,
    tighten,
)

__all__ = ["RateTable"]

_COLUMNS = (
    "lim_rpm, lim_tpm, lim_itpm, lim_otpm, tat_rpm, tat_tpm, tat_itpm, tat_otpm, blocked_until"
)
_KEEP_OUTPUTS = 200  # rows per limiter kept in ms_rate_outputs; the quantile reads fewer


def _f(name: str) -> str:
    return f"CAST(? AS DOUBLE PRECISION) AS {name}"


def _pg_params(names: list[str]) -> str:
    return (
        "WITH p AS (SELECT "
        + ", ".join(_f(n) for n in names)
        + "), "
        + (
            "q AS (SELECT p.*, COALESCE(p.now_in, "
            "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)) AS now FROM p) "
        )
    )


def _pg_book_sql() -> str:
    names = ["now_in", *(f"d_{d}" for d in DIMENSIONS), *(f"c_{d}" for d in DIMENSIONS)]
    names += ["period", "keep", "burst"]
    lim = {d: f"LEAST(q.d_{d}, r.lim_{d})" for d in DIMENSIONS}
    interval = {d: f"(q.period / ({lim[d]} * q.keep))" for d in DIMENSIONS}
    earliest = [f"r.tat_{d} + q.c_{d} * {interval[d]} - q.burst * q.period" for d in DIMENSIONS]
    start = "GREATEST(q.now, r.blocked_until, " + ", ".join(earliest) + ")"
    sets = [
        f"tat_{d} = CASE WHEN {lim[d]} IS NULL THEN r.tat_{d} "
        f"ELSE GREATEST(r.tat_{d}, {start}) + q.c_{d} * {interval[d]} END"
        for d in DIMENSIONS
    ]
    fits = " AND ".join(
        f"COALESCE(q.c_{d} <= q.burst * {lim[d]} * q.keep, TRUE)" for d in DIMENSIONS
    )
    # RETURNING sees the new row, so the start travels through last_start.
    return (
        _pg_params(names)
        + "UPDATE ms_rate_limits AS r SET "
        + ", ".join([*sets, f"last_start = {start}", "bookings = r.bookings + 1"])
        + f" FROM q WHERE r.key = ? AND {fits} RETURNING r.last_start, q.now"
    )


def _pg_settle_sql() -> str:
    names = ["now_in", *(f"d_{d}" for d in DIMENSIONS), *(f"learn_{d}" for d in DIMENSIONS)]
    names += [*(f"rem_{d}" for d in DIMENSIONS), *(f"delta_{d}" for d in DIMENSIONS)]
    names += ["period", "keep", "retry_after", "ratio"]
    sets = []
    for d in DIMENSIONS:
        lim = f"LEAST(q.d_{d}, COALESCE(q.learn_{d}, r.lim_{d}))"
        interval = f"(q.period / ({lim} * q.keep))"
        moved = (
            f"CASE WHEN q.delta_{d} > 0 THEN GREATEST(r.tat_{d}, q.now) ELSE r.tat_{d} END"
            f" + q.delta_{d} * {interval}"
        )
        told = f"q.now + GREATEST(0, COALESCE(q.learn_{d}, {lim}) - q.rem_{d}) * {interval}"
        sets.append(
            f"tat_{d} = CASE WHEN {lim} IS NULL THEN r.tat_{d} ELSE GREATEST({moved}, {told}) END"
        )
        sets.append(f"lim_{d} = COALESCE(q.learn_{d}, r.lim_{d})")
    sets.append("blocked_until = GREATEST(r.blocked_until, q.now + q.retry_after)")
    sets.append(
        "input_ratio = CASE WHEN q.ratio IS NULL THEN r.input_ratio "
        "WHEN q.ratio > r.input_ratio THEN q.ratio "
        "ELSE 0.8 * r.input_ratio + 0.2 * q.ratio END"
    )
    return (
        _pg_params(names)
        + "UPDATE ms_rate_limits AS r SET "
        + ", ".join(sets)
        + (" FROM q WHERE r.key = ?")
    )


_PG_BOOK = _pg_book_sql()
_PG_SETTLE = _pg_settle_sql()


class RateTable:
    """Reads and writes the limiters' rows in one store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pg = store.dialect == "postgresql"
        self._known: set[str] = set()
        self._settled = itertools.count(1)

    def _ensure(self, key: str) -> None:
        if key in self._known:
            return
        with self.store._autocommit() as cur:
            cur.execute(
                "INSERT INTO ms_rate_limits (key) VALUES (?) ON CONFLICT (key) DO NOTHING", (key,)
            )
        self._known.add(key)

    def state(self, key: str) -> BucketState:
        """The limiter's row as a :class:`BucketState` (a fresh one if it has none)."""
        with self.store._read() as cur:
            return _load(cur, key) or BucketState()

    def snapshot(self, key: str, samples: int = 50) -> tuple[float, list[int]]:
        """``(input_ratio, recent output sizes, newest first)`` of a limiter."""
        with self.store._read() as cur:
            cur.execute("SELECT input_ratio FROM ms_rate_limits WHERE key = ?", (key,))
            row = cur.fetchone()
            cur.execute(
                "SELECT tokens FROM ms_rate_outputs WHERE key = ? ORDER BY id DESC LIMIT ?",
                (key, samples),
            )
            outputs = [int(r[0]) for r in cur.fetchall()]
        return (float(row[0]) if row else 1.0), outputs

    def book(
        self,
        rate: RateLimit,
        charges: Mapping[Dimension, float],
        now: float | Callable[[], float] | None,
    ) -> tuple[float, float]:
        """Book ``charges``; ``(start, now)`` on the clock the booking used. A callable
        ``now`` is read once the write lock is held: time spent waiting for the lock
        must not count as refill that was never there.

        Raises:
            ConfigError: the request can never fit one of the limits.
        """
        self._ensure(rate.key)
        if not self._pg:
            assert now is not None, "SQLite books on the caller's clock"
            with self.store._write() as cur:
                at = now() if callable(now) else now
                state = _load(cur, rate.key) or BucketState()
                start = book(state, rate, charges, at)
                _save(cur, rate.key, state, last_start=start)
            return start, at
        declared = rate.limits()
        given = now() if callable(now) else now
        params: list[Any] = [given, *(declared[d] for d in DIMENSIONS)]
        params += [charges.get(d, 0.0) for d in DIMENSIONS]
        params += [rate.period_s, 1.0 - rate.headroom, rate.burst, rate.key]
        with self.store._autocommit() as cur:
            cur.execute(_PG_BOOK, params)
            row = cur.fetchone()
            if row is None:  # it can never fit: say which limit, from the row
                state = _load(cur, rate.key) or BucketState()
                book(state, rate, charges, 0.0)  # raises the ConfigError
                raise ConfigError(f"a request of {dict(charges)!r} does not fit {rate.key!r}")
        return float(row[0]), float(row[1])

    def settle(
        self,
        rate: RateLimit,
        *,
        delta: Mapping[Dimension, float],
        learned: Mapping[Dimension, float],
        remaining: Mapping[Dimension, float],
        retry_after: float | None,
        input_ratio: float | None,
        output_tokens: int | None,
        now: float | None,
    ) -> None:
        """Correct a booking, learn limits, tighten from headers, record the output."""
        self._ensure(rate.key)
        if not self._pg:
            assert now is not None, "SQLite settles on the caller's clock"
            with self.store._write() as cur:
                state = _load(cur, rate.key) or BucketState()
                state.learned.update(learned)
                settle(state, rate, delta, now)
                tighten(
                    state,
                    rate,
                    learned=learned,
                    remaining=remaining,
                    retry_after=retry_after,
                    now=now,
                )
                _save(cur, rate.key, state)
                if input_ratio is not None:
                    cur.execute(
                        "UPDATE ms_rate_limits SET input_ratio = CASE WHEN ? > input_ratio "
                        "THEN ? ELSE 0.8 * input_ratio + 0.2 * ? END WHERE key = ?",
                        (input_ratio, input_ratio, input_ratio, rate.key),
                    )
                self._record_output(cur, rate.key, output_tokens)
            return
        declared = rate.limits()
        params: list[Any] = [now, *(declared[d] for d in DIMENSIONS)]
        params += [learned.get(d) for d in DIMENSIONS]
        params += [remaining.get(d) for d in DIMENSIONS]
        params += [delta.get(d, 0.0) for d in DIMENSIONS]
        params += [rate.period_s, 1.0 - rate.headroom, retry_after, input_ratio, rate.key]
        with self.store._autocommit() as cur:
            cur.execute(_PG_SETTLE, params)
            self._record_output(cur, rate.key, output_tokens)

    def _record_output(self, cur: Cursor, key: str, tokens: int | None) -> None:
        if tokens is None:
            return
        cur.execute("INSERT INTO ms_rate_outputs (key, tokens) VALUES (?, ?)", (key, tokens))
        if next(self._settled) % 50 == 0:  # now and then, forget old observations
            cur.execute(
                "DELETE FROM ms_rate_outputs WHERE key = ? AND id < (SELECT MIN(id) FROM "
                "(SELECT id FROM ms_rate_outputs WHERE key = ? ORDER BY id DESC LIMIT ?) AS k)",
                (key, key, _KEEP_OUTPUTS),
            )

    def limits(self, rate: RateLimit) -> dict[Dimension, float | None]:
        """The limits in force: declared, tightened by those learned."""
        return effective_limits(rate.limits(), self.state(rate.key).learned)


def _load(cur: Cursor, key: str) -> BucketState | None:
    cur.execute(f"SELECT {_COLUMNS} FROM ms_rate_limits WHERE key = ?", (key,))
    row = cur.fetchone()
    if row is None:
        return None
    return BucketState(
        learned={d: (None if row[i] is None else float(row[i])) for i, d in enumerate(DIMENSIONS)},
        tat={d: float(row[4 + i]) for i, d in enumerate(DIMENSIONS)},
        blocked_until=float(row[8]),
    )


def _save(cur: Cursor, key: str, state: BucketState, *, last_start: float | None = None) -> None:
    sets = [f"lim_{d} = ?, tat_{d} = ?" for d in DIMENSIONS] + ["blocked_until = ?"]
    values: list[Any] = []
    for d in DIMENSIONS:
        values += [state.learned[d], state.tat[d]]
    values.append(state.blocked_until)
    if last_start is not None:
        sets.append("last_start = ?, bookings = bookings + 1")
        values.append(last_start)
    cur.execute(f"UPDATE ms_rate_limits SET {', '.join(sets)} WHERE key = ?", [*values, key])
