"""Rate limiters shared through the store, the registry that makes them, and the
configuration file that declares them."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from pathlib import Path

from .._clock import Clock, SystemClock
from .._config import config_entries
from .._errors import ConfigError, StoreError, StoreUnavailable
from ..models import reset_seconds
from ..storage import Store
from ._rate import (
    DIMENSIONS,
    Booking,
    Cost,
    Dimension,
    RateLimit,
    RateLimiter,
    charges_of,
    quantile,
)
from ._table import RateTable

__all__ = [
    "BoundRateLimits",
    "RateLimits",
    "StoreRateLimiter",
    "load_rate_limits",
    "observed_limits",
    "observed_resets",
]

log = logging.getLogger("mainspring.limits")

#: Observations of output size needed before the quantile replaces ``max_tokens``.
MIN_SAMPLES = 5
#: Until a first reply reports how the provider counts, prompts are booked at this
#: multiple of the tokenizer's count: providers count with tokenizers of their own,
#: and the first bookings of a cold start go out together, before any correction.
COLD_INPUT_RATIO = 2.0

_OPENAI = {"requests": "rpm", "tokens": "tpm"}
_ANTHROPIC = {
    "requests": "rpm",
    "tokens": "tpm",
    "input-tokens": "itpm",
    "output-tokens": "otpm",
}


def observed_limits(
    headers: Mapping[str, str],
) -> tuple[dict[Dimension, float], dict[Dimension, float]]:
    """``(limits, remaining)`` per dimension in a response's rate-limit headers:
    ``x-ratelimit-{limit,remaining}-{requests,tokens}`` (OpenAI) and
    ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining}``.
    Values that are not numbers are ignored."""
    low = {k.lower(): v for k, v in headers.items()}
    limits: dict[Dimension, float] = {}
    remaining: dict[Dimension, float] = {}

    def number(name: str) -> float | None:
        try:
            value = float(low[name])
        except (KeyError, ValueError):
            return None
        return value if math.isfinite(value) and value >= 0 else None

    def put(dim: str, limit_name: str, remaining_name: str) -> None:
        d: Dimension = dim  # type: ignore[assignment]
        limit = number(limit_name)
        left = number(remaining_name)
        if limit is not None and limit > 0:
            limits[d] = limit
        if left is not None:
            remaining[d] = left

    for word, dim in _OPENAI.items():
        put(dim, f"x-ratelimit-limit-{word}", f"x-ratelimit-remaining-{word}")
    for word, dim in _ANTHROPIC.items():
        put(dim, f"anthropic-ratelimit-{word}-limit", f"anthropic-ratelimit-{word}-remaining")
    return limits, remaining


def observed_resets(headers: Mapping[str, str], now: float) -> dict[Dimension, float]:
    """Per dimension, the seconds until the provider's bucket is full again, as a
    response's reset headers say (``x-ratelimit-reset-tokens: 1.2s``,
    ``anthropic-ratelimit-input-tokens-reset: <RFC 3339>``)."""
    words = {**_OPENAI, **_ANTHROPIC}
    out: dict[Dimension, float] = {}
    for word, seconds in reset_seconds(headers, now=now).items():
        dim = words.get(word)
        if dim is not None:
            out[dim] = seconds  # type: ignore[index]
    return out


class StoreRateLimiter(RateLimiter):
    """A :class:`RateLimiter` whose state lives in the store, shared by every worker
    process on every machine that uses that database.

    Args:
        rate: the declared limits (dimensions left ``None`` are learned from headers).
        store: the store, or a function that returns it (opened on first use).
        clock: the time SQLite books on; PostgreSQL books on the database's clock.
    """

    def __init__(
        self,
        rate: RateLimit,
        store: Store | Callable[[], Store],
        *,
        clock: Clock | None = None,
    ) -> None:
        self.rate = rate
        self.clock: Clock = clock or SystemClock()
        self._store = store
        self._table: RateTable | None = None

    @property
    def key(self) -> str:
        return self.rate.key

    @property
    def table(self) -> RateTable:
        if self._table is None:
            store = self._store if isinstance(self._store, Store) else self._store()
            self._table = RateTable(store)
        return self._table

    def _clock(self) -> Callable[[], float] | None:
        """What bookings read the time from; ``None``: the database's clock.

        PostgreSQL: the database's clock, one timeline for every machine, when the
        limiter runs on the real clock. A fake clock (tests) keeps bookings on its own
        time, as leases do, or the runs it wakes would sleep by the wrong calendar."""
        if self.table.store.dialect == "postgresql" and isinstance(self.clock, SystemClock):
            return None
        return self.clock.now

    def _now(self) -> float | None:
        clock = self._clock()
        return None if clock is None else clock()

    def estimate(self, *, prompt_tokens: int, max_tokens: int | None = None) -> Cost:
        """The cost to book for a request of ``prompt_tokens`` (the tokenizer's count,
        tool schemas included): the prompt scaled by the reported/counted ratio learned
        so far, and the output at the configured quantile of recent outputs, or
        ``max_tokens`` until there are enough of them."""
        return self._estimate(prompt_tokens, max_tokens)[0]

    def _estimate(self, prompt_tokens: int, max_tokens: int | None) -> tuple[Cost, float]:
        if prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be >= 0, got {prompt_tokens!r}")
        ratio, outputs = self.table.snapshot(self.key)
        if not outputs:
            ratio = max(ratio, COLD_INPUT_RATIO)
        cap = max_tokens if max_tokens is not None else self.rate.max_output_tokens
        if len(outputs) >= MIN_SAMPLES:
            output = min(cap, quantile(outputs, self.rate.output_quantile))
        else:
            output = cap
        return Cost(input_tokens=math.ceil(prompt_tokens * ratio), output_tokens=output), ratio

    def reserve(
        self,
        *,
        prompt_tokens: int,
        max_tokens: int | None = None,
        run: str | None = None,
        trim_output: bool | None = None,
    ) -> Booking:
        """Estimate a request (see :meth:`estimate`) and book it (see :meth:`acquire`).

        ``trim_output`` (default: when ``max_tokens`` is None): the output reserved is
        only a default, so a token limit smaller than it (one learned from the
        provider's headers, say) caps the reservation instead of refusing the request
        with :class:`~mainspring.ConfigError`; the booking's ``estimate`` says what was
        reserved. A ``max_tokens`` the caller set is reserved whole."""
        cost, ratio = self._estimate(prompt_tokens, max_tokens)
        trim = max_tokens is None if trim_output is None else trim_output
        return self._book(cost, ratio, run, None, cost.output_tokens if trim else 0)

    def acquire(
        self, estimate: Cost, *, input_ratio: float = 1.0, run: str | None = None
    ) -> Booking:
        """Book the earliest start that fits ``estimate``; see :class:`RateLimiter`.
        ``input_ratio``: the ratio the estimate's prompt was scaled by. ``run``: the
        run that books (a cold limiter's probe is given back when that run ends).

        While no limit is known (none declared, no reply yet), one request at a time
        is admitted across every worker: the *probe* (``Booking.probe``). The others
        book nothing and get ``Booking.retry``: ask again at ``wake_at``."""
        return self._book(estimate, input_ratio, run, None)

    def gate(self, *, run: str | None = None) -> float | None:
        """How long ``run`` should wait before it books again, while another run's
        request probes this cold limiter (see :meth:`acquire`); ``None``: a booking
        would go through now. Books nothing and writes nothing: a run turned away
        by a booking (``Booking.retry``) looks here until the gate opens, and only
        then books again, so that its journal holds one refusal per wait, not one per
        look."""
        return self.table.gate(self.rate, self._clock(), run)

    def rebook(self, booking: Booking, *, run: str | None = None) -> Booking:
        """Refund ``booking`` and book its estimate anew, behind the others, in one
        transaction (a request that starts late, a retried one).

        Settling it and then acquiring would leave a moment between the two in which
        another worker books: on a cold limiter, a run waiting behind the probe
        would take it from the run re-sending it, which would then wait in turn."""
        booked: dict[Dimension, float] = {d: booking.charges.get(d, 0.0) for d in DIMENSIONS}
        # The estimate is what was reserved: a capped output stays capped (see reserve).
        return self._book(booking.estimate, booking.input_ratio, run, (booking.seq, booked))

    def _book(
        self,
        estimate: Cost,
        input_ratio: float,
        run: str | None,
        replacing: tuple[int, Mapping[Dimension, float]] | None,
        trimmable: int = 0,
    ) -> Booking:
        charges = charges_of(estimate, self.rate.provider)
        start, now, seq, kind, trimmed = self.table.book(
            self.rate,
            charges,
            self._clock(),
            run=run,
            replacing=replacing,
            trimmable=trimmable,
        )
        if trimmed:
            estimate = dataclasses.replace(
                estimate, output_tokens=estimate.output_tokens - int(trimmed)
            )
            charges = charges_of(estimate, self.rate.provider)
        waited = max(0.0, start - now)
        return Booking(
            key=self.key,
            start=start,
            waited_s=waited,
            wake_at=self.clock.now() + waited,
            charges={} if kind == "retry" else {d: charges[d] for d in DIMENSIONS},
            estimate=estimate,
            input_ratio=input_ratio,
            seq=seq,
            probe=kind == "probe",
            retry=kind == "retry",
        )

    def settle(
        self,
        booking: Booking,
        actual: Cost | None,
        headers: Mapping[str, str] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        """Correct ``booking``; see :class:`RateLimiter`. ``actual=None`` (a 429)
        refunds the reservation and tightens from the refusal's headers."""
        learned, remaining = observed_limits(headers or {})
        # An Anthropic reset is a time of day: seconds from this machine's clock.
        resets = observed_resets(headers or {}, self.clock.now())
        # A refused request charged nothing: refund its whole reservation (a retry
        # books anew, behind the others).
        delta: dict[Dimension, float] = {d: -booking.charges.get(d, 0.0) for d in DIMENSIONS}
        ratio: float | None = None
        output: int | None = None
        if actual is not None:
            # Every reply's "remaining" moves the bucket towards the provider's view:
            # what other clients of the account used, a limit lowered mid-run, a
            # bucket that was not full when we started. It is applied after this
            # reply's own correction, and only ever later (see _rate.tighten).
            used = charges_of(actual, self.rate.provider)
            delta = {d: used[d] - booking.charges.get(d, 0.0) for d in DIMENSIONS}
            counted = booking.estimate.input_tokens / booking.input_ratio
            if counted > 0 and actual.input_tokens > 0:
                ratio = actual.input_tokens / counted
            output = actual.output_tokens
        self.table.settle(
            self.rate,
            delta=delta,
            learned=learned,
            remaining=remaining,
            retry_after=retry_after,
            resets=resets,
            input_ratio=ratio,
            output_tokens=output,
            now=self._now(),
            seq=booking.seq,
            contacted=actual is not None or bool(learned),
            refused=actual is None and (bool(headers) or retry_after is not None),
        )

    def settle_quietly(
        self,
        booking: Booking,
        actual: Cost | None,
        headers: Mapping[str, str] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        """:meth:`settle`, but a store that is down only costs the correction (the
        booking stays as estimated), never the model's reply."""
        try:
            self.settle(booking, actual, headers, retry_after=retry_after)
        except (StoreError, StoreUnavailable) as exc:
            log.warning("rate limiter %s: settlement lost: %s", self.key, exc)


class RateLimits:
    """The rate limits an App knows: declared ones, and defaults for the rest.

    Every ``(provider, model, account)`` gets a limiter: the declared
    :class:`RateLimit` if there is one, else one with no declared limit that learns
    them from the provider's headers at first contact.

    Args:
        limits: declared limits (at most one per provider, model and account).
        period_s / headroom / burst: settings of the limiters that are learned.

    Raises:
        ConfigError: two limits name the same provider, model and account.
    """

    def __init__(
        self,
        limits: Iterable[RateLimit] = (),
        *,
        period_s: float = 60.0,
        headroom: float = 0.02,
        burst: float = 1.0,
    ) -> None:
        self.declared: dict[str, RateLimit] = {}
        for rate in limits:
            if not isinstance(rate, RateLimit):
                raise ConfigError(f"rate limits are RateLimit(...) values, got {rate!r:.100}")
            if rate.key in self.declared:
                raise ConfigError(f"two rate limits for {rate.key!r}: declare each one once")
            self.declared[rate.key] = rate
        self._defaults = {"period_s": period_s, "headroom": headroom, "burst": burst}
        RateLimit(provider="x", model="x", **self._defaults)  # type: ignore[arg-type]  # validates
        self._limiters: dict[tuple[int, str], StoreRateLimiter] = {}

    def declares(self, provider: str, model: str, account: str = "default") -> bool:
        """Whether a limit is declared for this model and account."""
        return f"{provider}:{model}:{account}" in self.declared

    def rate_for(self, provider: str, model: str, account: str = "default") -> RateLimit:
        """The declared limit of this model and account, or a learning one."""
        found = self.declared.get(f"{provider}:{model}:{account}")
        if found is not None:
            return found
        return RateLimit(provider=provider, model=model, account=account, **self._defaults)  # type: ignore[arg-type]

    def limiter(
        self,
        store: Store,
        clock: Clock,
        provider: str,
        model: str,
        account: str = "default",
    ) -> StoreRateLimiter:
        """The shared limiter of a model and account, in ``store``."""
        rate = self.rate_for(provider, model, account)
        cache = (id(store), rate.key)
        found = self._limiters.get(cache)
        if found is None or found.table.store is not store:
            found = self._limiters[cache] = StoreRateLimiter(rate, store, clock=clock)
        return found

    def bind(self, store: Store | Callable[[], Store], clock: Clock) -> BoundRateLimits:
        """These limits bound to the store their state lives in and the clock they
        book on: what a model call books against (``App`` binds its own).

        Args:
            store: the store, or a function that returns it (opened on first use).
            clock: the clock of the runs that book (a ``FakeClock`` in tests).
        """
        return BoundRateLimits(self, store, clock)

    def __repr__(self) -> str:
        return f"RateLimits({list(self.declared.values())!r})"


class BoundRateLimits:
    """:class:`RateLimits` bound to a store and a clock (see :meth:`RateLimits.bind`):
    the shared limiter of any model and account, without knowing where it lives.

    Attributes:
        limits: the limits bound.
        clock: the clock they book on.
    """

    def __init__(
        self, limits: RateLimits, store: Store | Callable[[], Store], clock: Clock
    ) -> None:
        self.limits = limits
        self.clock = clock
        self._store = store

    def applies(self, provider: str, model: str, account: str, *, remote: bool) -> bool:
        """Whether a model's calls book against these limits: a remote model's always
        (declared or learned), a local one's (a scripted model) only if declared."""
        return remote or self.limits.declares(provider, model, account)

    def limiter(self, provider: str, model: str, account: str = "default") -> StoreRateLimiter:
        """The shared limiter of a model and account (see :meth:`RateLimits.limiter`)."""
        store = self._store if isinstance(self._store, Store) else self._store()
        return self.limits.limiter(store, self.clock, provider, model, account)

    def __repr__(self) -> str:
        return f"{self.limits!r}.bind(...)"


_FIELDS = {f.name for f in fields(RateLimit)}


def load_rate_limits(path: str | os.PathLike[str]) -> list[RateLimit]:
    """Read rate limits from a TOML or JSON file.

    TOML::

        [[rate_limit]]
        provider = "openai"
        model = "gpt-4.1-mini"
        rpm = 500
        tpm = 200000

    JSON: ``{"rate_limit": [{"provider": "openai", "model": "gpt-4.1-mini", ...}]}``.
    Each entry takes the arguments of :class:`RateLimit`.

    Raises:
        ConfigError: the file is missing, unreadable, or an entry is wrong (the
            message names the file, the entry and the field).
    """
    file = Path(path)
    entries = config_entries(file, what="rate limits", key="rate_limit")
    out: list[RateLimit] = []
    for i, entry in enumerate(entries, 1):
        where = f"rate limits file {str(file)!r}, entry {i}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a table of fields, got {entry!r:.100}")
        unknown = set(entry) - _FIELDS
        if unknown:
            raise ConfigError(
                f"{where}: unknown field(s) {sorted(unknown)!r}; known: {sorted(_FIELDS)!r}"
            )
        missing = {"provider", "model"} - set(entry)
        if missing:
            raise ConfigError(f"{where}: missing field(s) {sorted(missing)!r}")
        try:
            out.append(RateLimit(**entry))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc.message}") from None
        except TypeError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    RateLimits(out)  # duplicates are an error here too
    return out
