"""The rate limiters' shared state (``ms_rate_limits``, ``ms_rate_outputs``).

The arithmetic (the GCRA of :mod:`mainspring.limits`) is not here: the store keeps a
limiter's row and hands it, locked, to the limiter's own function for one short write
transaction (:meth:`RateTables.update_rate_limit`). On SQLite ``BEGIN IMMEDIATE``
serialises every process on the file; on PostgreSQL ``SELECT ... FOR UPDATE`` holds
the row and also reads the database's clock, so that workers on machines whose
clocks disagree still book one timeline.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ._connection import Connection, Cursor

__all__ = ["RATE_DIMENSIONS", "RateRow", "RateTables", "RateTxn"]

T = TypeVar("T")

# The dimensions the table has columns for (``lim_<d>``, ``tat_<d>``).
RATE_DIMENSIONS: tuple[str, ...] = ("rpm", "tpm", "itpm", "otpm")
_COLUMNS = (
    "lim_rpm, lim_tpm, lim_itpm, lim_otpm, tat_rpm, tat_tpm, tat_itpm, tat_otpm, blocked_until, "
    "bookings, barriers, contacted, probe_seq, probe_until, probe_run, holds, outside"
)
# A probe whose run ended (cancelled, failed) gives the gate back at once.
_ENDED = ("succeeded", "failed", "cancelled")
_KEEP_OUTPUTS = 200  # rows per limiter kept in ms_rate_outputs; the quantile reads fewer
_TRIM_EVERY = 50  # outputs recorded between two trims of old ones
_recorded = itertools.count(1)


@dataclass(slots=True, kw_only=True)
class RateRow:
    """One limiter's row of ``ms_rate_limits``, decoded (what each value means is the
    limiter's business: see :class:`mainspring.limits.BucketState`).

    Attributes:
        learned: per dimension, the limit learned from the provider (``None``: none).
        tat: per dimension, the theoretical arrival time.
        bookings: how many bookings were made.
        barriers: per dimension, ``[number, term]`` pairs.
        holds: bookings not settled yet.
        outside / synced_at: other clients' use seen per dimension, and when.
    """

    learned: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(RATE_DIMENSIONS))
    tat: dict[str, float] = field(default_factory=lambda: dict.fromkeys(RATE_DIMENSIONS, 0.0))
    blocked_until: float = 0.0
    bookings: int = 0
    barriers: dict[str, list[list[float]]] = field(
        default_factory=lambda: {d: [] for d in RATE_DIMENSIONS}
    )
    contacted: bool = False
    probe_seq: int = 0
    probe_until: float = 0.0
    probe_run: str | None = None
    holds: list[list[Any]] = field(default_factory=list)
    outside: dict[str, float] = field(default_factory=dict)
    synced_at: dict[str, float] = field(default_factory=dict)


class RateTxn:
    """A limiter's row locked for one write transaction: what the function given to
    :meth:`RateTables.update_rate_limit` reads and writes through.

    Attributes:
        key: the limiter.
        row: its row as it was when locked (``None``: it has none yet).
        at: the time the update runs at: the caller's, or the database's clock.
    """

    def __init__(self, cur: Cursor, key: str, row: RateRow | None, at: float) -> None:
        self._cur = cur
        self.key = key
        self.row = row
        self.at = at

    def ended(self, runs: Collection[str]) -> set[str]:
        """Those of ``runs`` that have finished (or are gone)."""
        if not runs:
            return set()
        ids = sorted(runs)
        self._cur.execute(
            f"SELECT id, status FROM ms_runs WHERE id IN ({', '.join('?' * len(ids))})", ids
        )
        live = {str(r[0]) for r in self._cur.fetchall() if r[1] not in _ENDED}
        return set(runs) - live

    def save(self, row: RateRow, *, last_start: float | None = None) -> None:
        """Write the row back (``last_start``: the start a booking was given)."""
        sets = [f"lim_{d} = ?, tat_{d} = ?" for d in RATE_DIMENSIONS]
        sets += ["blocked_until = ?", "bookings = ?", "barriers = ?"]
        sets += [
            "contacted = ?",
            "probe_seq = ?",
            "probe_until = ?",
            "probe_run = ?",
            "holds = ?",
            "outside = ?",
        ]
        values: list[Any] = []
        for d in RATE_DIMENSIONS:
            values += [row.learned[d], row.tat[d]]
        barriers = {d: b for d, b in row.barriers.items() if b}
        values += [row.blocked_until, row.bookings, json.dumps(barriers) if barriers else None]
        values += [int(row.contacted), row.probe_seq, row.probe_until, row.probe_run]
        values.append(json.dumps(row.holds) if row.holds else None)
        seen = {"outside": row.outside, "synced_at": row.synced_at}
        values.append(json.dumps(seen) if row.synced_at else None)
        if last_start is not None:
            sets.append("last_start = ?")
            values.append(last_start)
        self._cur.execute(
            f"UPDATE ms_rate_limits SET {', '.join(sets)} WHERE key = ?", [*values, self.key]
        )

    def blend_input_ratio(self, ratio: float) -> None:
        """Fold a reported/counted input-token ratio into the limiter's: a higher one
        at once, a lower one slowly."""
        self._cur.execute(
            "UPDATE ms_rate_limits SET input_ratio = CASE WHEN ? > input_ratio "
            "THEN ? ELSE 0.8 * input_ratio + 0.2 * ? END WHERE key = ?",
            (ratio, ratio, ratio, self.key),
        )

    def record_output(self, tokens: int) -> None:
        """Remember a reply's output size (the newest ones estimate the next)."""
        self._cur.execute(
            "INSERT INTO ms_rate_outputs (key, tokens) VALUES (?, ?)", (self.key, tokens)
        )
        if next(_recorded) % _TRIM_EVERY == 0:  # now and then, forget old observations
            self._cur.execute(
                "DELETE FROM ms_rate_outputs WHERE key = ? AND id < (SELECT MIN(id) FROM "
                "(SELECT id FROM ms_rate_outputs WHERE key = ? ORDER BY id DESC LIMIT ?) AS k)",
                (self.key, self.key, _KEEP_OUTPUTS),
            )


class RateTables(Connection):
    """The rate limiters' rows: methods of every :class:`~mainspring.storage.Store`."""

    def ensure_rate_limit(self, key: str) -> None:
        """Create the limiter's row if it has none (before its first update locks it)."""
        with self._autocommit() as cur:
            cur.execute(
                "INSERT INTO ms_rate_limits (key) VALUES (?) ON CONFLICT (key) DO NOTHING", (key,)
            )

    def rate_limit(self, key: str) -> RateRow | None:
        """The limiter's row (``None``: it has none)."""
        with self._read() as cur:
            cur.execute(f"SELECT {_COLUMNS} FROM ms_rate_limits WHERE key = ?", (key,))
            row = cur.fetchone()
        return None if row is None else _rate_row(row)

    def rate_limit_samples(self, key: str, samples: int = 50) -> tuple[float, list[int]]:
        """``(input_ratio, recent output sizes, newest first)`` of a limiter."""
        with self._read() as cur:
            cur.execute("SELECT input_ratio FROM ms_rate_limits WHERE key = ?", (key,))
            row = cur.fetchone()
            cur.execute(
                "SELECT tokens FROM ms_rate_outputs WHERE key = ? ORDER BY id DESC LIMIT ?",
                (key, samples),
            )
            outputs = [int(r[0]) for r in cur.fetchall()]
        return (float(row[0]) if row else 1.0), outputs

    def update_rate_limit(
        self, key: str, now: float | Callable[[], float] | None, change: Callable[[RateTxn], T]
    ) -> T:
        """Lock the limiter's row and call ``change`` with it, in one write
        transaction; returns what ``change`` returns.

        Args:
            now: the time to update at. A callable is read once the lock is held
                (time spent waiting for the lock must not count as refill that was
                never there); ``None``: the database's clock (PostgreSQL only).

        Raises:
            ValueError: ``now`` is ``None`` and this store has no clock of its own.
        """
        with self._write() as cur:
            clock = f", {self._db_now}" if self._db_now is not None else ""
            cur.execute(
                f"SELECT {_COLUMNS}{clock} FROM ms_rate_limits WHERE key = ?{self._row_lock}",
                (key,),
            )
            row = cur.fetchone()
            db_now = float(row[-1]) if row is not None and clock else None
            given = now() if callable(now) else now
            at = given if given is not None else db_now
            if at is None:
                raise ValueError(
                    f"rate limiter {key!r}: a {self.dialect} store has no clock of its own;"
                    " pass `now`"
                )
            return change(RateTxn(cur, key, None if row is None else _rate_row(row), at))


def _rate_row(row: Any) -> RateRow:
    n = len(RATE_DIMENSIONS)
    stored = json.loads(row[10]) if row[10] else {}
    seen = json.loads(row[16]) if row[16] else None
    return RateRow(
        learned={
            d: (None if row[i] is None else float(row[i])) for i, d in enumerate(RATE_DIMENSIONS)
        },
        tat={d: float(row[n + i]) for i, d in enumerate(RATE_DIMENSIONS)},
        blocked_until=float(row[8]),
        bookings=int(row[9]),
        barriers={d: [[float(a), float(b)] for a, b in stored.get(d, [])] for d in RATE_DIMENSIONS},
        contacted=bool(row[11]),
        probe_seq=int(row[12]),
        probe_until=float(row[13]),
        probe_run=row[14],
        holds=json.loads(row[15]) if row[15] else [],
        outside=seen["outside"] if seen else {},
        synced_at=seen["synced_at"] if seen else {},
    )
