"""Rate-limit enforcement of the fake provider servers: continuously refilled token
buckets, one per limited dimension, as OpenAI and Anthropic document theirs.

Each dimension holds at most its limit and refills at ``limit / period_s`` per second
(``period_s`` is the provider's minute; tests and benchmarks shorten it). A request is
admitted when every bucket can pay for it: one request from RPM, its input tokens from
TPM and ITPM, and OTPM must not be in debt. Its output tokens are charged when the
reply is rendered (to TPM and OTPM), which may leave a bucket in debt that the refill
pays back. A request larger than a bucket can ever hold is refused as "too large".
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Refusal", "TokenBuckets", "format_duration"]

Dim = Literal["rpm", "tpm", "itpm", "otpm"]
DIMS: tuple[Dim, ...] = ("rpm", "tpm", "itpm", "otpm")


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Why a request was refused: the dimension, its numbers, and when to come back."""

    dim: Dim
    limit: float
    used: float
    requested: float
    retry_after: float
    too_large: bool


@dataclass(slots=True)
class _Bucket:
    limit: float
    level: float
    at: float


class TokenBuckets:
    """The buckets of one fake account (thread-safe).

    Args:
        limits: the limit of each enforced dimension per period.
        period_s: seconds per "minute".
        clock: monotonic seconds (``time.monotonic``); tests may drive their own.
    """

    def __init__(
        self,
        limits: dict[Dim, float],
        *,
        period_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s!r}")
        for dim, value in limits.items():
            if dim not in DIMS or not value > 0:
                raise ValueError(f"a rate limit is one of {DIMS} > 0, got {dim}={value!r}")
        self.period_s = period_s
        self.clock = clock
        now = clock()
        self._buckets = {d: _Bucket(float(v), float(v), now) for d, v in limits.items()}
        self._lock = threading.Lock()

    @property
    def limits(self) -> dict[Dim, float]:
        return {d: b.limit for d, b in self._buckets.items()}

    def _refill(self, now: float) -> None:
        for b in self._buckets.values():
            b.level = min(b.limit, b.level + (now - b.at) * b.limit / self.period_s)
            b.at = now

    def admit(self, charges: dict[Dim, float]) -> Refusal | None:
        """Take ``charges`` from every bucket, or take nothing and say why not."""
        with self._lock:
            now = self.clock()
            self._refill(now)
            refusals: list[Refusal] = []
            for d, b in self._buckets.items():
                need = charges.get(d, 0.0)
                too_large = need > b.limit
                # OTPM is paid after the reply: admission only needs it out of debt.
                short = (b.level <= 0) if d == "otpm" else (need > b.level)
                if too_large or short:
                    wanted = 0.0 if d == "otpm" else need
                    wait = max(0.0, (wanted - b.level) * self.period_s / b.limit)
                    refusals.append(
                        Refusal(
                            dim=d,
                            limit=b.limit,
                            used=b.limit - b.level,
                            requested=need,
                            retry_after=wait,
                            too_large=too_large,
                        )
                    )
            if refusals:
                return max(refusals, key=lambda r: (r.too_large, r.retry_after))
            for d, b in self._buckets.items():
                b.level -= charges.get(d, 0.0)
            return None

    def charge(self, charges: dict[Dim, float]) -> None:
        """Take ``charges`` after the fact (output tokens): buckets may go into debt."""
        with self._lock:
            self._refill(self.clock())
            for d, b in self._buckets.items():
                b.level -= charges.get(d, 0.0)

    def drain(self, share: float) -> dict[Dim, float]:
        """An outside consumer of the same account takes ``share`` of each bucket's
        limit, or what is left if that is less; returns what it took."""
        with self._lock:
            self._refill(self.clock())
            taken: dict[Dim, float] = {}
            for d, b in self._buckets.items():
                take = max(0.0, min(b.level, share * b.limit))
                b.level -= take
                taken[d] = take
            return taken

    def set_limit(self, dim: Dim, limit: float) -> None:
        """Change a limit mid-run (a tier change): the bucket keeps what it used."""
        if not limit > 0:
            raise ValueError(f"a rate limit is > 0, got {dim}={limit!r}")
        with self._lock:
            self._refill(self.clock())
            b = self._buckets[dim]
            used = b.limit - b.level
            b.limit = float(limit)
            b.level = min(b.limit, b.limit - used)

    def state(self) -> dict[Dim, tuple[float, float, float]]:
        """``(limit, remaining, seconds until full)`` of each bucket."""
        with self._lock:
            self._refill(self.clock())
            return {
                d: (
                    b.limit,
                    max(0.0, b.level),
                    max(0.0, (b.limit - b.level) * self.period_s / b.limit),
                )
                for d, b in self._buckets.items()
            }


def format_duration(seconds: float) -> str:
    """A duration as OpenAI's reset headers write it: ``"20ms"``, ``"1.5s"``, ``"6m0s"``."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    rest = round(rest, 3)
    if minutes < 1:
        return f"{rest:g}s"
    return f"{int(minutes)}m{rest:g}s"
