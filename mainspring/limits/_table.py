"""The rate limiters' shared state in the store (``ms_rate_limits``, ``ms_rate_outputs``).

Booking and settling read the limiter's row, run the GCRA of ``_rate.py`` and write it
back in one short write transaction: on SQLite ``BEGIN IMMEDIATE`` (the write lock
serialises every process on the file), on PostgreSQL ``SELECT ... FOR UPDATE``, which
also reads the database's clock, so workers on machines whose clocks disagree still book
one timeline. ``now`` may be given explicitly (tests); ``None`` means the store's clock.
(The arithmetic once ran as one SQL ``UPDATE`` on PostgreSQL; the barriers that keep
refunds honest, a short list per dimension, are plain Python instead of SQL twice.)
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

from ..storage import Store
from ..storage._base import Cursor
from ._rate import (
    DIMENSIONS,
    BucketState,
    Dimension,
    RateLimit,
    book,
    effective_limits,
    fit_output,
    give_back,
    hold,
    note_refusal,
    probe_gate,
    release_probe,
    settle,
    tighten,
    unhold,
    waiting_runs,
)

__all__ = ["RateTable"]

_COLUMNS = (
    "lim_rpm, lim_tpm, lim_itpm, lim_otpm, tat_rpm, tat_tpm, tat_itpm, tat_otpm, blocked_until, "
    "bookings, barriers, contacted, probe_seq, probe_until, probe_run, holds, outside"
)
# A probe whose run ended (cancelled, failed) gives the gate back at once.
_ENDED = ("succeeded", "failed", "cancelled")
_KEEP_OUTPUTS = 200  # rows per limiter kept in ms_rate_outputs; the quantile reads fewer
_PG_NOW = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


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
        *,
        run: str | None = None,
        replacing: tuple[int, Mapping[Dimension, float]] | None = None,
        trimmable: float = 0.0,
    ) -> tuple[float, float, int, Literal["slot", "probe", "retry"], float]:
        """Book ``charges``; ``(start, now, booking number, kind)`` on the clock the
        booking used. A callable ``now`` is read once the write lock is held: time
        spent waiting for the lock must not count as refill that was never there.
        On a cold limiter (no limit known) one booking at a time is the ``"probe"``;
        the others book nothing (``"retry"``, number 0) and ask again at ``start``.
        ``replacing``: ``(number, charges)`` of a booking to refund first, in the
        same transaction, so that no other booking comes between the two (a probe
        given back and booked anew stays with its run). ``trimmable``: output tokens
        of ``charges`` that may be dropped to fit a learned limit (see
        :func:`fit_output`); how many were is the tuple's last value.

        Raises:
            ConfigError: the request can never fit one of the limits.
        """
        self._ensure(rate.key)
        with self.store._write() as cur:
            state, at = self._lock(cur, rate.key, now)
            if replacing is not None:
                seq, booked = replacing
                release_probe(state, seq)
                unhold(state, seq)
                settle(state, rate, {d: -v for d, v in booked.items()}, at, seq)
            ended = _ended(cur, waiting_runs(state, at))
            if state.probe_run in ended:
                release_probe(state, state.probe_seq)
            give_back(state, rate, at, ended)
            again = probe_gate(state, rate, at, run)
            if again is not None:
                _save(cur, rate.key, state)
                return again, at, 0, "retry", 0.0
            probing = state.probe_seq == state.seq + 1
            trimmed = fit_output(state, rate, charges, trimmable)
            if trimmed:
                charges = {
                    d: v - trimmed if d in ("tpm", "otpm") else v for d, v in charges.items()
                }
            start = book(state, rate, charges, at)
            if run is not None:
                hold(state, run, start, charges)
            _save(cur, rate.key, state, last_start=start)
        return start, at, state.seq, "probe" if probing else "slot", trimmed

    def _lock(
        self, cur: Cursor, key: str, now: float | Callable[[], float] | None
    ) -> tuple[BucketState, float]:
        """The row, locked for this transaction, and the time to use."""
        if self._pg:
            cur.execute(
                f"SELECT {_COLUMNS}, {_PG_NOW} FROM ms_rate_limits WHERE key = ? FOR UPDATE",
                (key,),
            )
            row = cur.fetchone()
            db_now = float(row[-1]) if row is not None else None
        else:
            cur.execute(f"SELECT {_COLUMNS} FROM ms_rate_limits WHERE key = ?", (key,))
            row = cur.fetchone()
            db_now = None
        state = _state(row) if row is not None else BucketState()
        given = now() if callable(now) else now
        at = given if given is not None else db_now
        assert at is not None, "SQLite books on the caller's clock"
        return state, at

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
        seq: int = 0,
        contacted: bool = False,
        refused: bool = False,
    ) -> None:
        """Correct a booking, learn limits, tighten from headers, record the output;
        ``contacted``: a reply came back (its limits, if any, are now known);
        ``refused``: it was a 429 (the pace was too fast for the account)."""
        self._ensure(rate.key)
        with self.store._write() as cur:
            state, at = self._lock(cur, rate.key, now)
            release_probe(state, seq)
            unhold(state, seq)
            if contacted:
                state.contacted = True
            settle(state, rate, delta, at, seq)
            if refused:
                note_refusal(state, rate, {d: -v for d, v in delta.items()}, at)
            tighten(
                state,
                rate,
                learned=learned,
                remaining=remaining,
                retry_after=retry_after,
                now=at,
            )
            _save(cur, rate.key, state)
            if input_ratio is not None:
                cur.execute(
                    "UPDATE ms_rate_limits SET input_ratio = CASE WHEN ? > input_ratio "
                    "THEN ? ELSE 0.8 * input_ratio + 0.2 * ? END WHERE key = ?",
                    (input_ratio, input_ratio, input_ratio, rate.key),
                )
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
    return None if row is None else _state(row)


def _state(row: Any) -> BucketState:
    state = BucketState(
        learned={d: (None if row[i] is None else float(row[i])) for i, d in enumerate(DIMENSIONS)},
        tat={d: float(row[4 + i]) for i, d in enumerate(DIMENSIONS)},
        blocked_until=float(row[8]),
        seq=int(row[9]),
    )
    stored = json.loads(row[10]) if row[10] else {}
    for d in DIMENSIONS:
        state.barriers[d] = [[float(n), float(t)] for n, t in stored.get(d, [])]
    state.contacted = bool(row[11])
    state.probe_seq, state.probe_until, state.probe_run = int(row[12]), float(row[13]), row[14]
    state.holds = json.loads(row[15]) if row[15] else []
    if row[16]:
        seen = json.loads(row[16])
        state.outside, state.synced_at = seen["outside"], seen["synced_at"]
    return state


def _ended(cur: Cursor, runs: set[str]) -> set[str]:
    """Those of ``runs`` that ended (or are gone)."""
    if not runs:
        return set()
    ids = sorted(runs)
    cur.execute(f"SELECT id, status FROM ms_runs WHERE id IN ({', '.join('?' * len(ids))})", ids)
    live = {str(r[0]) for r in cur.fetchall() if r[1] not in _ENDED}
    return runs - live


def _save(cur: Cursor, key: str, state: BucketState, *, last_start: float | None = None) -> None:
    sets = [f"lim_{d} = ?, tat_{d} = ?" for d in DIMENSIONS]
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
    for d in DIMENSIONS:
        values += [state.learned[d], state.tat[d]]
    barriers = {d: b for d, b in state.barriers.items() if b}
    values += [state.blocked_until, state.seq, json.dumps(barriers) if barriers else None]
    values += [int(state.contacted), state.probe_seq, state.probe_until, state.probe_run]
    values.append(json.dumps(state.holds) if state.holds else None)
    seen = {"outside": state.outside, "synced_at": state.synced_at}
    values.append(json.dumps(seen) if state.synced_at else None)
    if last_start is not None:
        sets.append("last_start = ?")
        values.append(last_start)
    cur.execute(f"UPDATE ms_rate_limits SET {', '.join(sets)} WHERE key = ?", [*values, key])
