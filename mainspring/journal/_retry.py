"""Retry policies: exponential back-off with full jitter, driven by the error tree."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .._errors import MainspringError

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """When and how long to wait before a failed step is tried again.

    The n-th retry waits a uniformly random time in ``[0, min(max_s, initial_s *
    multiplier ** (n - 1))]`` ("full jitter", so that failing runs do not return in a
    herd), and at least the ``retry_after`` an error carries (a 429's, say).

    Never retried: errors whose class says ``retryable = False`` (see
    :mod:`mainspring._errors`) and the types in ``non_retryable``. Other exceptions
    are retried, up to ``max_attempts`` attempts in all.
    """

    max_attempts: int = 3
    initial_s: float = 0.5
    multiplier: float = 2.0
    max_s: float = 60.0
    jitter: bool = True
    non_retryable: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts!r}")
        if self.initial_s < 0 or self.max_s < 0 or self.multiplier < 1:
            raise ValueError(
                f"back-off needs initial_s >= 0, max_s >= 0 and multiplier >= 1, got "
                f"{self.initial_s!r}, {self.max_s!r}, {self.multiplier!r}"
            )

    @classmethod
    def never(cls) -> RetryPolicy:
        """One attempt only."""
        return cls(max_attempts=1)

    def next_delay(self, failures: int, error: BaseException, rng: random.Random) -> float | None:
        """Seconds to wait after the ``failures``-th failure, or ``None`` to give up."""
        if failures >= self.max_attempts or not self.retryable(error):
            return None
        cap = min(self.max_s, self.initial_s * self.multiplier ** (failures - 1))
        delay = rng.uniform(0, cap) if self.jitter else cap
        retry_after = getattr(error, "retry_after", None)
        if isinstance(retry_after, int | float) and retry_after > delay:
            delay = float(retry_after)
        return delay

    def retryable(self, error: BaseException) -> bool:
        if self.non_retryable and isinstance(error, self.non_retryable):
            return False
        return not (isinstance(error, MainspringError) and not error.retryable)
