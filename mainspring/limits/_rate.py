"""Rate limits of a provider account: the declared values and the GCRA that books them.

One limiter per ``(provider, model, account)`` keeps, for each limited dimension (RPM,
TPM, ITPM, OTPM), a *theoretical arrival time* (TAT): the moment its bucket would be
empty again if nothing more were booked. A dimension of limit ``L`` per period ``P``
frees one unit every ``T = P / L`` seconds and tolerates a burst of ``burst * P``
seconds' worth of units, which is the token bucket the providers document (capacity
``L``, refilled continuously). Booking a request of cost ``c``:

    start  = max(now, blocked_until, max_d(TAT_d + c_d * T_d - burst * P))
    TAT_d  = max(TAT_d, start) + c_d * T_d

so every caller gets the earliest start that fits every dimension, in the order it
booked, and sleeps until then instead of trying and backing off. Settlement moves each
TAT by the difference between the booked and the reported usage; a provider's headers
(remaining units, ``retry-after``) can only push TATs and ``blocked_until`` later.

A refund cannot always move the TAT back by all it returns. The TAT is the end of a
chain of bookings, each no earlier than its own start: taking one out lets the later
ones close up only until one of them reaches its start, since the run holding that
slot sleeps until then. So every booking is a *barrier* to the refunds of those booked
before it: its *term*, its start plus the units booked from it on, is a TAT they cannot
go below (the capacity before it was time that passed unused). Each dimension keeps
the terms that can still bind: the highest from each booking number on, falling with
the numbers, and none in the past (a short list; beyond 64 the two closest merge,
erring on the side of refunding less). Without this, refunds of requests that started late or
were refused gave back capacity that had already lapsed, and the limiter booked more
than the provider's bucket held (the two-worker test drew 429s).

The functions here are pure (time is a parameter). SQLite runs them in one short
transaction; PostgreSQL runs the same arithmetic as one ``UPDATE`` (``_table.py``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._errors import ConfigError

__all__ = [
    "DIMENSIONS",
    "Booking",
    "BucketState",
    "Cost",
    "Dimension",
    "RateLimit",
    "RateLimiter",
    "book",
    "charges_of",
    "fit_output",
    "gate_wait",
    "give_back",
    "hold",
    "is_cold",
    "note_refusal",
    "probe_gate",
    "release_probe",
    "settle",
    "tighten",
    "unhold",
    "waiting_runs",
]

Dimension = Literal["rpm", "tpm", "itpm", "otpm"]
DIMENSIONS: tuple[Dimension, ...] = ("rpm", "tpm", "itpm", "otpm")


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """The rate limits of one provider account for one model.

    Args:
        provider: ``"openai"``, ``"anthropic"``, ... (a model's ``provider``).
        model: the provider's model id (``"gpt-4.1-mini"``).
        account: which account or key the limits belong to (an agent's
            ``rate_account``); ``"default"`` unless you use several.
        rpm / tpm / itpm / otpm: requests, tokens, input tokens and output tokens per
            period; ``None`` leaves the dimension unlimited (or learned from headers).
        period_s: the length of the provider's "minute" (60 s; shorter for fakes).
        headroom: the share of each limit left unused, against other clients of the
            account and estimates that fall short (0.02 = 2 %).
        burst: the share of a period's capacity that may go at once (1.0: a full
            bucket, as the providers allow).
        output_quantile: output tokens are reserved at this quantile of the model's
            recent outputs (0.9 = p90).
        max_output_tokens: what a request reserves for its output while there are too
            few observations and the request sets no ``max_tokens``.

    Raises:
        ConfigError: a value is out of range (the message names it).
    """

    provider: str
    model: str
    account: str = "default"
    rpm: float | None = None
    tpm: float | None = None
    itpm: float | None = None
    otpm: float | None = None
    period_s: float = 60.0
    headroom: float = 0.02
    burst: float = 1.0
    output_quantile: float = 0.9
    max_output_tokens: int = 4096

    def __post_init__(self) -> None:
        where = f"RateLimit({self.provider!r}, {self.model!r}, account={self.account!r})"
        for name in ("provider", "model", "account"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"{where}: {name} must be a non-empty string, got {value!r}")
        for dim in DIMENSIONS:
            value = getattr(self, dim)
            if value is not None and (not isinstance(value, int | float) or value <= 0):
                raise ConfigError(f"{where}: {dim} must be a positive number, got {value!r}")
        if not self.period_s > 0:
            raise ConfigError(f"{where}: period_s must be > 0, got {self.period_s!r}")
        if not 0 <= self.headroom < 1:
            raise ConfigError(f"{where}: headroom must be in [0, 1), got {self.headroom!r}")
        if not 0 < self.burst <= 1:
            raise ConfigError(
                f"{where}: burst must be in (0, 1] (a provider's bucket holds one period's "
                f"limit), got {self.burst!r}"
            )
        if not 0 < self.output_quantile <= 1:
            raise ConfigError(
                f"{where}: output_quantile must be in (0, 1], got {self.output_quantile!r}"
            )
        if self.max_output_tokens < 1:
            raise ConfigError(
                f"{where}: max_output_tokens must be >= 1, got {self.max_output_tokens!r}"
            )

    @property
    def key(self) -> str:
        """``"provider:model:account"``, the limiter's name in the store."""
        return f"{self.provider}:{self.model}:{self.account}"

    def limits(self) -> dict[Dimension, float | None]:
        values = {d: getattr(self, d) for d in DIMENSIONS}
        return {d: (None if v is None else float(v)) for d, v in values.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    """What one request uses (estimated before, reported after).

    ``input_tokens`` is the whole prompt, cached tokens included; ``cached_tokens`` of
    them were read from the provider's cache (Anthropic does not count those toward
    its input-token limits).
    """

    requests: int = 1
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0


def charges_of(cost: Cost, provider: str) -> dict[Dimension, float]:
    """What ``cost`` takes from each dimension of ``provider``'s limits."""
    uncached = max(0, cost.input_tokens - cost.cached_tokens)
    # Anthropic's cache reads count toward no input limit; OpenAI counts every prompt token.
    counted = uncached if provider == "anthropic" else cost.input_tokens
    return {
        "rpm": float(cost.requests),
        "tpm": float(counted + cost.output_tokens),
        "itpm": float(counted),
        "otpm": float(cost.output_tokens),
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Booking:
    """A booked slot: when the request may start, and what it reserved.

    Attributes:
        key: the limiter (``"provider:model:account"``).
        start: the booked start, on the limiter's clock (the database's on PostgreSQL).
        waited_s: how long after booking the start is (0: at once).
        wake_at: the start on the caller's clock (what a run sleeps until).
        charges: units reserved per dimension, corrected by settlement.
        estimate: the request's estimated cost.
        input_ratio: reported over counted prompt tokens, as learned so far (the
            estimate's prompt is the tokenizer's count times this).
        seq: the booking's number in its limiter (0: unknown, as for bookings made
            before it was recorded; their refunds stop at every barrier).
        probe: this request is the one request in flight while the limiter learns
            the provider's limits (a cold start); its settlement releases the probe.
        retry: no slot was booked: another request is probing the limits of a cold
            limiter. Book again at ``wake_at``.
    """

    key: str
    start: float
    waited_s: float
    wake_at: float
    charges: dict[str, float] = field(default_factory=dict)
    estimate: Cost = field(default_factory=Cost)
    input_ratio: float = 1.0
    seq: int = 0
    probe: bool = False
    retry: bool = False


class RateLimiter(ABC):
    """One rate limit shared by every worker: book a slot, then settle it.

    ``acquire`` books the earliest start at which the estimated request fits every
    limited dimension; ``settle`` corrects the booking once the provider reported the
    usage (and tightens the limiter from its headers).
    """

    @abstractmethod
    def acquire(self, estimate: Cost, *, input_ratio: float = 1.0) -> Booking:
        """Book the earliest start that fits ``estimate``.

        Raises:
            ConfigError: the request can never fit (larger than a limit's bucket).
        """

    @abstractmethod
    def settle(
        self,
        booking: Booking,
        actual: Cost | None,
        headers: Mapping[str, str] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        """Correct ``booking`` by the ``actual`` usage (``None``: the provider refused
        it and charged nothing, so the reservation is refunded) and tighten from the
        response's rate-limit headers and ``retry_after``."""


@dataclass(slots=True, kw_only=True)
class BucketState:
    """The shared state of one limiter (a row of ``ms_rate_limits``).

    Attributes:
        learned: limits read from the provider's headers.
        tat: theoretical arrival time per dimension (seconds since the epoch).
        blocked_until: no start before this (a 429's ``retry-after``).
        seq: bookings made so far (each booking's number).
        barriers: per dimension, ``[number, term]`` of barrier bookings, numbers
            rising and terms falling: each term is the highest of the barriers from
            that number on (see the module's docstring).
        contacted: a reply has been settled: the provider's limits are known (they
            may be "none": a reply without rate-limit headers).
        probe_seq / probe_until / probe_run: the booking that probes a cold limiter,
            when its hold lapses (a run that died without settling), and its run.
        holds: bookings not settled yet, ``[number, run, start, {dimension:
            units}]``: a run that ends while it sleeps for its slot (cancelled) gives
            its units back at the next booking (see :func:`give_back`).
        outside / synced_at: per dimension, the units per period other clients of
            the account are seen to use (smoothed; taken off this limiter's pace),
            and when a reply's ``remaining`` last said so.
    """

    learned: dict[Dimension, float | None] = field(
        default_factory=lambda: dict.fromkeys(DIMENSIONS)
    )
    tat: dict[Dimension, float] = field(default_factory=lambda: dict.fromkeys(DIMENSIONS, 0.0))
    blocked_until: float = 0.0
    seq: int = 0
    barriers: dict[Dimension, list[list[float]]] = field(
        default_factory=lambda: {d: [] for d in DIMENSIONS}
    )
    contacted: bool = False
    probe_seq: int = 0
    probe_until: float = 0.0
    probe_run: str | None = None
    holds: list[list[Any]] = field(default_factory=list)
    outside: dict[str, float] = field(default_factory=dict)
    synced_at: dict[str, float] = field(default_factory=dict)


def hold(state: BucketState, run: str, start: float, charges: Mapping[Dimension, float]) -> None:
    """Remember the booking just made (number ``state.seq``) until it is settled."""
    state.holds.append([state.seq, run, start, {d: float(v) for d, v in charges.items()}])


def unhold(state: BucketState, seq: int) -> None:
    """Booking ``seq`` was settled (or refunded): forget it."""
    state.holds = [h for h in state.holds if h[0] != seq]


def give_back(state: BucketState, rate: RateLimit, now: float, ended: set[str]) -> None:
    """Refund the bookings of runs that ended before their slot came (``ended``), and
    forget holds long past their start (their requests went; a worker that died
    mid-request hands its booking to the run's next owner, whose retry refunds it)."""
    kept: list[list[Any]] = []
    for entry in state.holds:
        seq, run, start, charges = entry
        if run in ended and start > now:
            settle(state, rate, {d: -v for d, v in charges.items()}, now, int(seq))
        elif start > now - _HOLD_FORGET_S:
            kept.append(entry)
    state.holds = kept


def waiting_runs(state: BucketState, now: float) -> set[str]:
    """The runs whose booked slots are still ahead (sleeping for them), and the probe's."""
    runs = {str(h[1]) for h in state.holds if h[2] > now}
    if state.probe_seq and state.probe_run:
        runs.add(state.probe_run)
    return runs


def is_cold(state: BucketState, rate: RateLimit) -> bool:
    """No limit is known yet (none declared, none learned, no reply settled)."""
    if state.contacted:
        return False
    return all(v is None for v in effective_limits(rate.limits(), state.learned).values())


def probe_gate(state: BucketState, rate: RateLimit, now: float, run: str | None) -> float | None:
    """On a cold limiter, admit one request at a time: ``None`` when this booking may
    go (it becomes the probe, held until ``now + PROBE_HOLD_S``), else when to ask
    again. A warm limiter admits everyone (``None``).

    The run that holds the probe is admitted again (its old probe given back): a
    booking it makes while holding the gate is its own probe booked anew, as when the
    worker that takes a run over re-runs a booking whose end a crash kept out of the
    journal. Turned away, it would wait for its own probe's hold to lapse (60 s),
    and every run behind it with it."""
    ahead = gate_wait(state, rate, now, run)
    if ahead is not None:
        return ahead
    if not is_cold(state, rate):
        return None
    if state.probe_seq and run is not None and state.probe_run == run:
        unhold(state, state.probe_seq)  # its own probe, booked anew: the old one is given back
    state.probe_seq = state.seq + 1  # the number book() gives this booking
    state.probe_until = now + PROBE_HOLD_S
    state.probe_run = run
    return None


def gate_wait(state: BucketState, rate: RateLimit, now: float, run: str | None) -> float | None:
    """When ``run`` should ask again because another run's probe holds a cold
    limiter's gate; ``None``: the gate would let it book now (see :func:`probe_gate`)."""
    if not is_cold(state, rate) or not (state.probe_seq and state.probe_until > now):
        return None
    if run is not None and state.probe_run == run:
        return None
    return min(state.probe_until, now + COLD_POLL_S)


def release_probe(state: BucketState, seq: int) -> None:
    """The probe with booking number ``seq`` ended (settled or refunded)."""
    if seq and state.probe_seq == seq:
        state.probe_seq, state.probe_until, state.probe_run = 0, 0.0, None


def effective_limits(
    declared: Mapping[Dimension, float | None], learned: Mapping[Dimension, float | None]
) -> dict[Dimension, float | None]:
    """The limit of each dimension: the lower of the declared and the learned one."""
    out: dict[Dimension, float | None] = {}
    for d in DIMENSIONS:
        known = [v for v in (declared.get(d), learned.get(d)) if v is not None]
        out[d] = min(known) if known else None
    return out


def _interval(limit: float, rate: RateLimit, outside: float = 0.0) -> float:
    """Seconds per unit: the period over the limit less its headroom and less what
    other clients of the account are seen to use (``outside``, units per period;
    this limiter keeps at least a tenth of the limit)."""
    ours = max(limit * (1.0 - rate.headroom) - outside, 0.1 * limit)
    return rate.period_s / ours


def fit_output(
    state: BucketState, rate: RateLimit, charges: Mapping[Dimension, float], trimmable: float
) -> float:
    """How many of the ``trimmable`` output tokens of ``charges`` (a default output
    reservation, not a ``max_tokens`` the caller set) to drop so that the request fits
    the token limits' buckets: a limit learned from the provider's headers may be
    smaller than the default reservation, and a reservation is only a guess (settling
    charges what the reply used). 0 when it fits, or when dropping cannot make it."""
    if trimmable <= 0:
        return 0.0
    limits = effective_limits(rate.limits(), state.learned)
    trim = 0.0
    for d in ("tpm", "otpm"):
        limit = limits[d]
        if limit is not None:
            capacity = math.floor(rate.burst * limit * (1.0 - rate.headroom))
            trim = max(trim, charges.get(d, 0.0) - capacity)
    return min(float(math.ceil(trim)), trimmable) if trim > 0 else 0.0


def book(
    state: BucketState, rate: RateLimit, charges: Mapping[Dimension, float], now: float
) -> float:
    """Book a request of ``charges`` in ``state`` and return its start.

    Raises:
        ConfigError: a charge exceeds what that dimension's bucket can ever hold.
    """
    limits = effective_limits(rate.limits(), state.learned)
    start = max(now, state.blocked_until)
    for d in DIMENSIONS:
        limit = limits[d]
        if limit is None:
            continue
        capacity = rate.burst * limit * (1.0 - rate.headroom)
        if charges.get(d, 0.0) > capacity:
            raise ConfigError(
                f"a request of {charges[d]:g} {_UNITS[d]} can never fit the {d.upper()} limit "
                f"of {rate.key!r}: {limit:g} per {rate.period_s:g}s leaves room for "
                f"{math.floor(capacity):g} at once (burst={rate.burst:g}, "
                f"headroom={rate.headroom:g}); shorten the prompt or lower max_tokens"
            )
        t = _interval(limit, rate, state.outside.get(d, 0.0))
        # Others' share of the account is also left in the bucket, for their bursts.
        shared = 1.0 - min(0.9, state.outside.get(d, 0.0) / limit)
        window = rate.burst * rate.period_s * shared
        start = max(start, state.tat[d] + charges.get(d, 0.0) * t - window)
    state.seq += 1
    for d in DIMENSIONS:
        limit = limits[d]
        if limit is None:
            continue
        step = charges.get(d, 0.0) * _interval(limit, rate, state.outside.get(d, 0.0))
        barriers = state.barriers[d]
        for entry in barriers:  # every booking so far is before this one: its terms grow
            entry[1] += step
        _add_barrier(barriers, state.seq, start + step)
        _forget_past(barriers, now)
        state.tat[d] = max(state.tat[d], start) + step
    return start


def _add_barrier(barriers: list[list[float]], number: float, term: float) -> None:
    """Append a barrier after every booking listed, dropping those it dominates."""
    while barriers and barriers[-1][1] <= term:
        barriers.pop()
    barriers.append([number, term])
    if len(barriers) > _MAX_BARRIERS:
        # Merge the two neighbours whose terms are closest into one with the higher
        # term and the later number: refunds of the bookings between them then stop a
        # little early, never late, and by the least. (Merging the oldest instead
        # clipped the refunds that come first: those of the oldest bookings.)
        i = min(range(len(barriers) - 1), key=lambda k: barriers[k][1] - barriers[k + 1][1])
        first = barriers.pop(i)
        barriers[i][1] = max(first[1], barriers[i][1])


def _forget_past(barriers: list[list[float]], now: float) -> None:
    """Drop barriers whose term has passed: a TAT below ``now`` books as ``now``."""
    while barriers and barriers[-1][1] <= now:
        barriers.pop()


def settle(
    state: BucketState,
    rate: RateLimit,
    delta: Mapping[Dimension, float],
    now: float,
    seq: int = 0,
) -> None:
    """Move each TAT by ``delta`` units (actual minus booked) of booking number
    ``seq``: a refund frees capacity for later bookings, down to the term of the
    barriers booked after it; an overrun pushes them back."""
    limits = effective_limits(rate.limits(), state.learned)
    for d in DIMENSIONS:
        limit, change = limits[d], delta.get(d, 0.0)
        if limit is None or change == 0:
            continue
        step = change * _interval(limit, rate, state.outside.get(d, 0.0))
        barriers = state.barriers[d]
        later = next((term for number, term in barriers if number > seq), None)
        for entry in barriers:  # the terms of the booking and those before it move
            if entry[0] <= seq:
                entry[1] += step
        if change > 0 and now > state.tat[d]:
            # Charged on an idle chain: a barrier to every booking so far.
            state.tat[d] = now + step
            _add_barrier(barriers, state.seq + 0.5, state.tat[d])
        elif change > 0:
            state.tat[d] += step
        else:
            state.tat[d] = state.tat[d] + step if later is None else max(state.tat[d] + step, later)
        # Keep the terms falling: a term that fell to the next one's is dominated.
        kept: list[list[float]] = []
        for entry in reversed(barriers):
            if not kept or entry[1] > kept[-1][1]:
                kept.append(entry)
        barriers[:] = reversed(kept)
        _forget_past(barriers, now)


def tighten(
    state: BucketState,
    rate: RateLimit,
    *,
    learned: Mapping[Dimension, float],
    remaining: Mapping[Dimension, float],
    retry_after: float | None,
    now: float,
    resets: Mapping[Dimension, float] | None = None,
) -> None:
    """Apply what the provider said: its limits, what remains, when to come back.

    A remaining count below what the limiter believes moves the TAT so that the
    bucket holds no more than that; more remaining than believed changes nothing
    (other bookings may be in flight that the provider has not seen yet). The used
    capacity drains at the limiter's pace, but never for longer than the provider's
    reset horizon (``resets``: when its bucket is full again) says: a 429 answering
    "0 of 500 requests left, full again in 1s" holds the bucket for a second, not the
    minute that 500 requests at 500 a minute would take.
    """
    before = effective_limits(rate.limits(), state.learned)
    for d, value in learned.items():
        state.learned[d] = value
    limits = effective_limits(rate.limits(), state.learned)
    for d in DIMENSIONS:
        old, new = before[d], limits[d]
        if old is not None and new is not None and old != new:
            # A limit changed (a tier change): the units booked ahead of now take
            # old / new times as long at the new pace.
            _rescale(state, d, now, old / new)
    for d, left in remaining.items():
        limit = limits[d]
        if limit is None:
            continue
        provider_limit = learned.get(d, limit)
        used = max(0.0, provider_limit - left)
        interval = _interval(limit, rate, state.outside.get(d, 0.0))
        drain = used * interval
        if resets is not None and d in resets:
            drain = min(drain, resets[d])
        told = now + drain
        # Capacity the provider saw used and this limiter did not book: other clients
        # of the account. Its rate, smoothed, is taken off this limiter's pace.
        # A leaky sum: what others used, forgotten over one period. (Not when the
        # limit was just learned: nothing was booked against it yet.)
        unseen = max(0.0, told - max(state.tat[d], now)) / interval
        if before[d] is None:
            unseen = 0.0
        since = max(now - state.synced_at.get(d, now), 0.0)
        kept = max(0.0, 1.0 - since / rate.period_s)
        state.outside[d] = min(limit, state.outside.get(d, 0.0) * kept + unseen)
        state.synced_at[d] = now
        if told > state.tat[d]:  # the provider's word is a barrier to every booking so far
            state.tat[d] = told
            _add_barrier(state.barriers[d], state.seq + 0.5, told)
    if retry_after is not None and retry_after > 0:
        state.blocked_until = max(state.blocked_until, now + retry_after)


def _rescale(state: BucketState, d: Dimension, now: float, factor: float) -> None:
    """Stretch dimension ``d``'s time ahead of ``now`` by ``factor``."""
    if state.tat[d] > now:
        state.tat[d] = now + (state.tat[d] - now) * factor
    for entry in state.barriers[d]:
        if entry[1] > now:
            entry[1] = now + (entry[1] - now) * factor


def note_refusal(
    state: BucketState, rate: RateLimit, charges: Mapping[Dimension, float], now: float
) -> None:
    """A 429: the account had less room than this limiter thought, so someone else
    uses it. Count the refused request's units as others' use (leaking away over a
    period like the rest of ``outside``)."""
    limits = effective_limits(rate.limits(), state.learned)
    for d in DIMENSIONS:
        limit = limits[d]
        if limit is None or charges.get(d, 0.0) <= 0:
            continue
        since = max(now - state.synced_at.get(d, now), 0.0)
        kept = max(0.0, 1.0 - since / rate.period_s)
        state.outside[d] = min(
            0.9 * limit, state.outside.get(d, 0.0) * kept + _REFUSAL_WEIGHT * charges[d]
        )
        state.synced_at[d] = now


def quantile(values: Sequence[int], q: float) -> int:
    """The ``q`` quantile of ``values`` (nearest rank), 0 for none."""
    if not values:
        return 0
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


#: How long a cold limiter's probe holds the gate at most: a probe whose run died
#: and was never taken over (cancelled, dead-lettered) lets the next one go then.
PROBE_HOLD_S = 60.0
#: How often requests waiting on a cold limiter's probe ask again.
COLD_POLL_S = 0.25
#: A booking that was never settled is forgotten this long after its start.
_HOLD_FORGET_S = 600.0
#: The share of a refused request counted as other clients' use.
_REFUSAL_WEIGHT = 0.25

#: Barriers kept per dimension (beyond, the closest merge, erring on the side of
#: refunding less). One per booking still ahead, so more than the runs that book at
#: once: with 16, twenty runs' bookings merged and refunds were clipped (10 % of the
#: refill lost in bench/rate_limit.py).
_MAX_BARRIERS = 64

_UNITS: dict[Dimension, str] = {
    "rpm": "requests",
    "tpm": "tokens",
    "itpm": "input tokens",
    "otpm": "output tokens",
}
