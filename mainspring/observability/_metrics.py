"""Prometheus metrics read from the store: what every worker journaled, in one place.

A :class:`MetricsCollector` is a ``prometheus_client`` collector. Each scrape counts
runs by status and aggregates the journal: step latency, tokens, cost, retries and
rate-limit errors. Workers need no metrics port of their own and the numbers agree
with ``mainspring trace``. A finished run's aggregate is cached until the run
changes (a retry, a fork, pruning), so a scrape reads the journals of unfinished
and newly changed runs only.

Counters are totals over the runs the store holds: pruning old runs lowers them,
which Prometheus reads as a counter reset (as it does a process restart).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._errors import MissingExtra
from ..limits import Price
from ..storage import FINISHED, Store
from ._trace import trace_entries

if TYPE_CHECKING:
    from prometheus_client.registry import Collector
else:
    Collector = object

__all__ = ["LATENCY_BUCKETS", "MetricsCollector", "metrics_text"]

LATENCY_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
_KINDS = ("model", "tool", "step")


def _prometheus() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core
    except ImportError as exc:
        raise MissingExtra("mainspring's Prometheus metrics", "metrics", exc.name) from None
    return prometheus_client


@dataclass(slots=True)
class _Totals:
    """One run's (or the sum of all runs') step aggregates."""

    # (kind) -> counts per bucket (cumulative at render), sum of latencies
    buckets: dict[str, list[int]] = field(default_factory=dict)
    latency_sum: dict[str, float] = field(default_factory=dict)
    steps: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, status)
    retries: dict[str, int] = field(default_factory=dict)
    rate_limited: dict[str, int] = field(default_factory=dict)
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0

    def add(self, other: _Totals) -> None:
        for kind, counts in other.buckets.items():
            mine = self.buckets.setdefault(kind, [0] * (len(LATENCY_BUCKETS) + 1))
            for i, n in enumerate(counts):
                mine[i] += n
        for kind, s in other.latency_sum.items():
            self.latency_sum[kind] = self.latency_sum.get(kind, 0.0) + s
        for key, n in other.steps.items():
            self.steps[key] = self.steps.get(key, 0) + n
        for kind, n in other.retries.items():
            self.retries[kind] = self.retries.get(kind, 0) + n
        for kind, n in other.rate_limited.items():
            self.rate_limited[kind] = self.rate_limited.get(kind, 0) + n
        self.tokens_in += other.tokens_in
        self.tokens_out += other.tokens_out
        self.cost_usd += other.cost_usd


class MetricsCollector(Collector):
    """A ``prometheus_client`` collector over a store (register it, or call
    :meth:`render`).

    Args:
        store: the database every worker writes to.
        prices: USD per million tokens by model id (default: ``limits.PRICES``).

    Metrics: ``mainspring_runs{status}``, ``mainspring_steps_total{kind,status}``,
    ``mainspring_step_latency_seconds{kind}`` (histogram of a step's last attempt),
    ``mainspring_step_retries_total{kind}``, ``mainspring_rate_limited_total{kind}``
    (steps whose journaled error is a rate limit, a 429), ``mainspring_tokens_total
    {workflow,direction}`` and ``mainspring_cost_usd_total{workflow}``.
    """

    def __init__(self, store: Store, *, prices: dict[str, Price] | None = None) -> None:
        _prometheus()
        self.store = store
        self.prices = prices
        self._cache: dict[str, tuple[float, str, _Totals]] = {}
        self._lock = threading.Lock()

    def render(self) -> tuple[bytes, str]:
        """``(body, content type)`` of the Prometheus text format: what ``/metrics``
        serves."""
        prom = _prometheus()
        registry = prom.CollectorRegistry(auto_describe=False)
        registry.register(self)
        return prom.generate_latest(registry), prom.CONTENT_TYPE_LATEST

    def describe(self) -> list[Any]:
        return []  # no fixed description: the values come from the store per scrape

    def collect(self) -> Iterator[Any]:
        core = _prometheus().core
        with self._lock:
            counts, by_workflow, total = self._aggregate()
        runs = core.GaugeMetricFamily("mainspring_runs", "Runs by status.", labels=["status"])
        for status in sorted(counts):
            runs.add_metric([status], counts[status])
        yield runs
        steps = core.CounterMetricFamily(
            "mainspring_steps", "Journaled steps by kind and status.", labels=["kind", "status"]
        )
        for (kind, status), n in sorted(total.steps.items()):
            steps.add_metric([kind, status], n)
        yield steps
        latency = core.HistogramMetricFamily(
            "mainspring_step_latency_seconds",
            "Latency of a step's last attempt.",
            labels=["kind"],
        )
        for kind in sorted(total.buckets):
            cumulative, acc = [], 0
            for bound, n in zip(
                [*map(str, LATENCY_BUCKETS), "+Inf"], total.buckets[kind], strict=True
            ):
                acc += n
                cumulative.append((bound, acc))
            latency.add_metric([kind], cumulative, sum_value=total.latency_sum.get(kind, 0.0))
        yield latency
        retries = core.CounterMetricFamily(
            "mainspring_step_retries", "Attempts beyond the first.", labels=["kind"]
        )
        limited = core.CounterMetricFamily(
            "mainspring_rate_limited",
            "Steps whose journaled error is a rate limit (HTTP 429).",
            labels=["kind"],
        )
        for kind in _KINDS:
            retries.add_metric([kind], total.retries.get(kind, 0))
            limited.add_metric([kind], total.rate_limited.get(kind, 0))
        yield retries
        yield limited
        tokens = core.CounterMetricFamily(
            "mainspring_tokens", "Model tokens.", labels=["workflow", "direction"]
        )
        cost = core.CounterMetricFamily(
            "mainspring_cost_usd", "Model spend in USD (price table).", labels=["workflow"]
        )
        for wf in sorted(by_workflow):
            t = by_workflow[wf]
            tokens.add_metric([wf, "input"], t.tokens_in)
            tokens.add_metric([wf, "output"], t.tokens_out)
            cost.add_metric([wf], t.cost_usd)
        yield tokens
        yield cost

    def _aggregate(self) -> tuple[dict[str, int], dict[str, _Totals], _Totals]:
        stamps = self.store.run_stamps()
        counts: dict[str, int] = {}
        by_workflow: dict[str, _Totals] = {}
        total = _Totals()
        seen: set[str] = set()
        for run_id, workflow, status, updated_at in stamps:
            seen.add(run_id)
            counts[status] = counts.get(status, 0) + 1
            cached = self._cache.get(run_id)
            if cached is not None and cached[0] == updated_at and cached[1] == status:
                totals = cached[2]
            else:
                totals = self._run_totals(run_id)
                if status in FINISHED:
                    self._cache[run_id] = (updated_at, status, totals)
                else:
                    self._cache.pop(run_id, None)
            by_workflow.setdefault(workflow, _Totals()).add(totals)
            total.add(totals)
        for gone in self._cache.keys() - seen:  # pruned
            del self._cache[gone]
        return counts, by_workflow, total

    def _run_totals(self, run_id: str) -> _Totals:
        t = _Totals()
        for e in trace_entries(self.store.load_steps(run_id), self.prices):
            kind = e.kind if e.kind in _KINDS else "step"
            t.steps[(kind, e.status)] = t.steps.get((kind, e.status), 0) + 1
            if e.latency_s is not None:
                counts = t.buckets.setdefault(kind, [0] * (len(LATENCY_BUCKETS) + 1))
                i = next(
                    (i for i, b in enumerate(LATENCY_BUCKETS) if e.latency_s <= b),
                    len(LATENCY_BUCKETS),
                )
                counts[i] += 1
                t.latency_sum[kind] = t.latency_sum.get(kind, 0.0) + e.latency_s
            if e.retries:
                t.retries[kind] = t.retries.get(kind, 0) + e.retries
            if e.error_class == "RateLimited":
                t.rate_limited[kind] = t.rate_limited.get(kind, 0) + 1
            t.tokens_in += e.tokens_in
            t.tokens_out += e.tokens_out
            t.cost_usd += e.cost_usd
        return t


def metrics_text(store: Store, *, prices: dict[str, Price] | None = None) -> str:
    """The Prometheus text of ``store`` once (a long-lived server keeps one
    :class:`MetricsCollector` instead, which caches finished runs)."""
    body, _ = MetricsCollector(store, prices=prices).render()
    return body.decode()
