"""The statistics of the lab: Wilson intervals, pass^k and the theory curves."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["pass_hat_k", "theory_success", "wilson"]

_Z = {0.90: 1.6448536269514722, 0.95: 1.959963984540054, 0.99: 2.5758293035489004}


def wilson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a success rate (good near 0 and 1, unlike p ± z·se).

    Raises:
        ValueError: ``confidence`` is not 0.90, 0.95 or 0.99, or the counts are impossible.
    """
    if confidence not in _Z:
        raise ValueError(f"confidence must be one of {sorted(_Z)}, got {confidence!r}")
    if trials < 0 or not 0 <= successes <= max(trials, 0):
        raise ValueError(f"impossible counts: {successes!r} successes in {trials!r} trials")
    if trials == 0:
        return 0.0, 1.0
    z = _Z[confidence]
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_hat_k(per_task: Sequence[tuple[int, int]], k: int) -> float | None:
    """tau-bench's pass^k: the chance that k trials of one task all succeed.

    ``per_task`` holds ``(successes c, trials n)`` per task; the estimate is
    ``C(c, k) / C(n, k)`` averaged over the tasks. ``None`` when a task has fewer
    than ``k`` trials (the estimator needs n >= k).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k!r}")
    if not per_task or any(n < k for _, n in per_task):
        return None
    return sum(math.comb(c, k) / math.comb(n, k) for c, n in per_task) / len(per_task)


def theory_success(error_rate: float, steps: int, retries: int = 0) -> float:
    """Success of ``steps`` independent steps that each fail with ``error_rate`` per
    attempt, with ``retries`` retries per step: ``(1 - e^(r+1))^n``, which is
    ``p^n`` (p = 1 - e) with no retries."""
    return float((1.0 - error_rate ** (retries + 1)) ** steps)
