"""The rate limiters' shared state, kept by the store (``ms_rate_limits``,
``ms_rate_outputs``).

Booking and settling lock the limiter's row, run the GCRA of ``_rate.py`` and write
it back in one short write transaction of the store
(:meth:`~mainspring.storage.Store.update_rate_limit`): on PostgreSQL it also reads the
database's clock, so workers on machines whose clocks disagree still book one
timeline. ``now`` may be given explicitly (tests); ``None`` means the store's clock.
(The arithmetic once ran as one SQL ``UPDATE`` on PostgreSQL; the barriers that keep
refunds honest, a short list per dimension, are plain Python instead of SQL twice.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Literal

from ..storage import RateRow, RateTxn, Store
from ._rate import (
    BucketState,
    Dimension,
    RateLimit,
    book,
    effective_limits,
    fit_output,
    gate_wait,
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

_Booked = tuple[float, float, int, Literal["slot", "probe", "retry"], float]


class RateTable:
    """Reads and writes the limiters' rows in one store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._known: set[str] = set()

    def _ensure(self, key: str) -> None:
        if key in self._known:
            return
        self.store.ensure_rate_limit(key)
        self._known.add(key)

    def state(self, key: str) -> BucketState:
        """The limiter's row as a :class:`BucketState` (a fresh one if it has none)."""
        row = self.store.rate_limit(key)
        return BucketState() if row is None else _state(row)

    def snapshot(self, key: str, samples: int = 50) -> tuple[float, list[int]]:
        """``(input_ratio, recent output sizes, newest first)`` of a limiter."""
        return self.store.rate_limit_samples(key, samples)

    def book(
        self,
        rate: RateLimit,
        charges: Mapping[Dimension, float],
        now: float | Callable[[], float] | None,
        *,
        run: str | None = None,
        replacing: tuple[int, Mapping[Dimension, float]] | None = None,
        trimmable: float = 0.0,
    ) -> _Booked:
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

        def booking(txn: RateTxn) -> _Booked:
            state, at = _locked(txn), txn.at
            if replacing is not None:
                seq, booked = replacing
                release_probe(state, seq)
                unhold(state, seq)
                settle(state, rate, {d: -v for d, v in booked.items()}, at, seq)
            ended = txn.ended(waiting_runs(state, at))
            if state.probe_run in ended:
                release_probe(state, state.probe_seq)
            give_back(state, rate, at, ended)
            again = probe_gate(state, rate, at, run)
            if again is not None:
                txn.save(_row(state))
                return again, at, 0, "retry", 0.0
            probing = state.probe_seq == state.seq + 1
            fitted: Mapping[Dimension, float] = charges
            trimmed = fit_output(state, rate, charges, trimmable)
            if trimmed:
                fitted = {d: v - trimmed if d in ("tpm", "otpm") else v for d, v in charges.items()}
            start = book(state, rate, fitted, at)
            if run is not None:
                hold(state, run, start, fitted)
            txn.save(_row(state), last_start=start)
            return start, at, state.seq, "probe" if probing else "slot", trimmed

        self._ensure(rate.key)
        return self.store.update_rate_limit(rate.key, now, booking)

    def gate(
        self, rate: RateLimit, now: float | Callable[[], float] | None, run: str | None
    ) -> float | None:
        """Seconds until ``run`` should book again while another run's probe holds
        the cold limiter's gate; ``None``: a booking would be let through now. Looks
        only: writes nothing (a probe whose run ended is given back by the booking)."""

        def looking(txn: RateTxn) -> float | None:
            state, at = _locked(txn), txn.at
            ahead = gate_wait(state, rate, at, run)
            if ahead is None:
                return None
            held_by = state.probe_run
            if held_by is not None and txn.ended({held_by}):
                return None  # the prober's run ended: the next booking takes the gate
            return max(0.0, ahead - at)

        self._ensure(rate.key)
        return self.store.update_rate_limit(rate.key, now, looking)

    def settle(
        self,
        rate: RateLimit,
        *,
        delta: Mapping[Dimension, float],
        learned: Mapping[Dimension, float],
        remaining: Mapping[Dimension, float],
        retry_after: float | None,
        input_ratio: float | None,
        resets: Mapping[Dimension, float] | None = None,
        output_tokens: int | None,
        now: float | None,
        seq: int = 0,
        contacted: bool = False,
        refused: bool = False,
    ) -> None:
        """Correct a booking, learn limits, tighten from headers, record the output;
        ``contacted``: a reply came back (its limits, if any, are now known);
        ``refused``: it was a 429 (the pace was too fast for the account)."""

        def settling(txn: RateTxn) -> None:
            state, at = _locked(txn), txn.at
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
                resets=resets or {},
                now=at,
            )
            txn.save(_row(state))
            if input_ratio is not None:
                txn.blend_input_ratio(input_ratio)
            if output_tokens is not None:
                txn.record_output(output_tokens)

        self._ensure(rate.key)
        self.store.update_rate_limit(rate.key, now, settling)

    def limits(self, rate: RateLimit) -> dict[Dimension, float | None]:
        """The limits in force: declared, tightened by those learned."""
        return effective_limits(rate.limits(), self.state(rate.key).learned)


def _locked(txn: RateTxn) -> BucketState:
    return BucketState() if txn.row is None else _state(txn.row)


def _state(row: RateRow) -> BucketState:
    """The limiter's state from the store's row. The two hold the same fields (one
    added to only one of them fails here, loudly), but the row calls the booking
    count ``bookings``; ``asdict`` copies deeply, so a state never shares a list with
    the row it came from."""
    fields = asdict(row)
    fields["seq"] = fields.pop("bookings")
    return BucketState(**fields)


def _row(state: BucketState) -> RateRow:
    """The store's row from the limiter's state: :func:`_state` the other way."""
    fields = asdict(state)
    fields["bookings"] = fields.pop("seq")
    return RateRow(**fields)
