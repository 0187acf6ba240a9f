"""Prometheus metrics: store-wide gauges read from the store, and the counters of
what this process executed.

A :class:`MetricsCollector` is a ``prometheus_client`` collector. Each scrape counts
runs by status, the age of the oldest queued and waiting runs, and the journal's
steps, tokens and cost: **gauges**, because they describe the store (pruning lowers
them, and N server replicas report the same value, not N times it). The collector
keeps every run's aggregate and their sums, so a scrape reads only the rows changed
since the last one and the journals of running runs (see ``_refresh``).

Counters (steps, attempts, retries, 429s, tokens, cost, claims, takeovers) and
histograms (step execution time, wait time, run duration) come from the process's
:class:`~mainspring.observability.Telemetry`, counted as events happen: they never go
down while the process lives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, get_args

from .._errors import MissingExtra
from ..limits import Price
from ..storage import FINISHED, RunStatus, Store
from ._names import back_pressure, journaled_error_type, model_of, rate_model
from ._trace import trace_entries
from ._workers import worker_families

if TYPE_CHECKING:
    from prometheus_client.registry import Collector
else:
    Collector = object

__all__ = ["LATENCY_BUCKETS", "MetricsCollector", "metrics_text"]

#: Buckets of step execution time (seconds).
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
    """One run's (or the sum of all runs') journal aggregates."""

    steps: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, status)
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    dead_lettered: int = 0
    rate_limited: dict[str, int] = field(default_factory=dict)  # 429s by logical model
    rate_waits: dict[str, tuple[int, float]] = field(default_factory=dict)  # (n, seconds)

    runs: int = 0

    def add(self, other: _Totals, sign: int = 1) -> None:
        for key, n in other.steps.items():
            left = self.steps.get(key, 0) + sign * n
            if left:
                self.steps[key] = left
            else:
                self.steps.pop(key, None)  # a kind/status no run has any more
        for model, n in other.rate_limited.items():
            left = self.rate_limited.get(model, 0) + sign * n
            if left:
                self.rate_limited[model] = left
            else:
                self.rate_limited.pop(model, None)
        for model, (n, secs) in other.rate_waits.items():
            had, waited = self.rate_waits.get(model, (0, 0.0))
            if had + sign * n:
                self.rate_waits[model] = (had + sign * n, waited + sign * secs)
            else:
                self.rate_waits.pop(model, None)
        self.runs += sign * other.runs
        self.dead_lettered += sign * other.dead_lettered
        self.tokens_in += sign * other.tokens_in
        self.tokens_out += sign * other.tokens_out
        self.cost_usd += sign * other.cost_usd
        if not self.runs:
            self.cost_usd = 0.0  # no float residue once the last run is gone

    def sub(self, other: _Totals) -> None:
        self.add(other, -1)


@dataclass(slots=True)
class _Entry:
    """What a collector keeps of one run between scrapes."""

    workflow: str
    status: str
    updated: float
    finished: float | None
    wait_reason: str | None
    totals: _Totals


class MetricsCollector(Collector):
    """A ``prometheus_client`` collector over a store (register it, or call
    :meth:`render`).

    Args:
        store: the database every worker writes to.
        prices: USD per million tokens by model id (default: ``limits.PRICES``).
        telemetry: the process's :class:`~mainspring.observability.Telemetry`,
            whose counters (what this process executed) are served beside the
            store-wide gauges.

    Store-wide values are **gauges** named ``mainspring_store_*`` (and
    ``mainspring_runs``): every replica reading one store reports the same value, so
    aggregate them with ``max``, never ``sum``. Counters and histograms come from
    ``telemetry`` only: monotonic per process, summed across processes.
    """

    def __init__(
        self,
        store: Store,
        *,
        prices: dict[str, Price] | None = None,
        telemetry: _Families | None = None,
        clock: Callable[[], float] = time.time,
        full_every_s: float = 300.0,
        lookback_s: float = 60.0,
    ) -> None:
        _prometheus()
        self.store = store
        self.prices = prices
        self.telemetry = telemetry
        self._clock = clock
        self.full_every_s = full_every_s
        self.lookback_s = lookback_s
        self._lock = threading.Lock()
        # Every run's aggregate, and their sums kept as runs come, change and go: a
        # scrape adds and takes away what changed instead of summing every run.
        self._runs: dict[str, _Entry] = {}
        self._unfinished: set[str] = set()
        self._counts: dict[str, int] = {}
        self._by_workflow: dict[str, _Totals] = {}
        self._total = _Totals()
        self._watermark: float | None = None  # the latest updated_at seen
        self._full_at = 0.0
        self._oldest_finished: float | None = None

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """``(body, content type)``: what ``/metrics`` serves. ``accept``: the scrape's
        ``Accept`` header; Prometheus asks for OpenMetrics, whose counters carry
        ``_created`` (when the process started counting), else the classic text
        format (where ``_created`` is a gauge of its own)."""
        prom = _prometheus()
        registry = prom.CollectorRegistry(auto_describe=False)
        registry.register(self)
        encode, content_type = prom.exposition.choose_encoder(accept or "")
        return encode(registry), content_type

    def describe(self) -> list[Any]:
        return []  # no fixed description: the values come from the store per scrape

    def collect(self) -> Iterator[Any]:
        core = _prometheus().core
        with self._lock:
            counts, oldest, waiting, by_workflow, total = self._aggregate()
        now = self._clock()
        yield from _run_families(core, counts, oldest, waiting, total, now)
        yield from _store_families(core, self.store, now)
        yield from _journal_families(core, total, by_workflow)
        yield from worker_families(core, self.store, now)
        if self.telemetry is not None:
            yield from self.telemetry.collect()

    def _aggregate(
        self,
    ) -> tuple[
        dict[str, int], dict[str, float], dict[str, tuple[int, float]], dict[str, _Totals], _Totals
    ]:
        self._refresh()
        oldest: dict[str, float] = {}
        waiting: dict[str, tuple[int, float]] = {}
        for run_id in self._unfinished:  # kept in memory: no query
            entry = self._runs[run_id]
            if entry.status in ("queued", "waiting", "sleeping"):
                oldest[entry.status] = min(oldest.get(entry.status, entry.updated), entry.updated)
            if entry.status in ("waiting", "sleeping"):
                reason = wait_reason_label(entry.wait_reason)
                n, since = waiting.get(reason, (0, entry.updated))
                waiting[reason] = (n + 1, min(since, entry.updated))
        counts = {k: n for k, n in self._counts.items() if n}
        by_workflow = {wf: t for wf, t in self._by_workflow.items() if t.runs}
        return counts, oldest, waiting, by_workflow, self._total

    def _refresh(self) -> None:
        """Bring the kept aggregates up to date with what changed since the last scrape.

        A scrape reads the rows changed since the last one (``updated_at``, with a
        look-back for commits that land late or come from a skewed clock), re-reads
        the journals of running runs (their steps commit without touching the row)
        and checks for pruning with one indexed ``MIN``: its cost follows the runs
        that changed or run, not the runs stored. Every ``full_every_s`` it reads
        every row once more (no journal that did not change), a backstop for
        deletions :meth:`Store.prune` did not make oldest first."""
        mono = time.monotonic()
        if self._watermark is None or mono - self._full_at >= self.full_every_s:
            rows = self.store.run_changes()
            seen = {r[0] for r in rows}
            for run_id in [r for r in self._runs if r not in seen]:
                self._drop(run_id)
            self._full_at = mono
        else:
            rows = self.store.run_changes(self._watermark - self.lookback_s)
            oldest = self.store.oldest_finished_at()
            if oldest != self._oldest_finished:
                # Pruned (oldest first): a run finished before the oldest left is gone.
                gone = [
                    run_id
                    for run_id, e in self._runs.items()
                    if e.finished is not None and (oldest is None or e.finished < oldest)
                ]
                for run_id in gone:
                    self._drop(run_id)
        changed = {r[0] for r in rows}
        for run_id, workflow, status, updated, finished, reason in rows:
            self._put(run_id, workflow, status, updated, finished, reason)
            if self._watermark is None or updated > self._watermark:
                self._watermark = updated
        for run_id in [r for r in self._unfinished if r not in changed]:
            entry = self._runs[run_id]
            if entry.status == "running":  # its journal moves while its row stands still
                self._put(run_id, entry.workflow, "running", entry.updated, None, None, force=True)
        self._oldest_finished = self.store.oldest_finished_at()

    def _put(
        self,
        run_id: str,
        workflow: str,
        status: str,
        updated: float,
        finished: float | None,
        wait_reason: str | None,
        *,
        force: bool = False,
    ) -> None:
        entry = self._runs.get(run_id)
        if entry is not None and not force and (entry.updated, entry.status) == (updated, status):
            entry.finished, entry.wait_reason = finished, wait_reason
            return  # unchanged: a queued, waiting or finished run's journal stands still
        if entry is not None:
            self._drop(run_id)
        totals = self._run_totals(run_id, dead_letter_check=status == "failed")
        totals.runs = 1
        self._runs[run_id] = _Entry(workflow, status, updated, finished, wait_reason, totals)
        self._counts[status] = self._counts.get(status, 0) + 1
        self._by_workflow.setdefault(workflow, _Totals()).add(totals)
        self._total.add(totals)
        if status in FINISHED:
            self._unfinished.discard(run_id)
        else:
            self._unfinished.add(run_id)

    def _drop(self, run_id: str) -> None:
        entry = self._runs.pop(run_id)
        self._counts[entry.status] -= 1
        self._by_workflow[entry.workflow].sub(entry.totals)
        self._total.sub(entry.totals)
        self._unfinished.discard(run_id)

    def _run_totals(self, run_id: str, *, dead_letter_check: bool = False) -> _Totals:
        t = _Totals()
        if dead_letter_check:  # once per failed run: finished runs are cached
            record = self.store.get_run(run_id)
            if record is not None and journaled_error_type(record.error) == "DeadLettered":
                t.dead_lettered = 1
        for e in trace_entries(self.store.load_steps(run_id), self.prices):
            kind = e.kind if e.kind in _KINDS else "step"
            status = e.status
            if status == "failed" and kind == "model":
                status = back_pressure(e.error_class) or status  # a 429 is no failure
            t.steps[(kind, status)] = t.steps.get((kind, status), 0) + 1
            t.tokens_in += e.tokens_in  # 0 for a fork's copied steps: spent by the source
            t.tokens_out += e.tokens_out
            t.cost_usd += e.cost_usd
            if e.copied:
                continue  # a fork's copy: the source run was refused and waited
            if e.rate_limited:
                model = model_of(e.name)
                t.rate_limited[model] = t.rate_limited.get(model, 0) + 1
            if e.rate_wait_s > 0:
                model = rate_model(e.journal_role, e.name)
                n, secs = t.rate_waits.get(model, (0, 0.0))
                t.rate_waits[model] = (n + 1, secs + e.rate_wait_s)
        return t


#: What ``mainspring_runs_waiting`` reports (always, 0 when none).
WAIT_REASONS = (
    "sleep", "retry", "rate_limit", "signal", "approval", "question", "budget", "replay",
)  # fmt: skip
_REQUESTS = ("approval", "question", "budget", "checkpoint", "resume")


def wait_reason_label(reason: str | None) -> str:
    """A suspended run's ``wait_reason`` (``"signal:approval:send"``, ``"retry:charge"``,
    ``"sleep | signal:go"``) as a label of few values: its first wait's kind."""
    first = (reason or "").split(" | ", 1)[0]
    head, _, rest = first.partition(":")
    if head == "signal":
        request = rest.split(":", 1)[0]
        return request if request in _REQUESTS else "signal"
    return head or "unknown"


class _Families(Protocol):
    def collect(self) -> Iterator[Any]: ...


def metrics_text(store: Store, *, prices: dict[str, Price] | None = None) -> str:
    """The store-wide Prometheus gauges of ``store`` once (a long-lived server keeps
    one :class:`MetricsCollector` instead, which caches finished runs)."""
    body, _ = MetricsCollector(store, prices=prices).render()
    return body.decode()


def _run_families(
    core: Any,
    counts: dict[str, int],
    oldest: dict[str, float],
    waiting: dict[str, tuple[int, float]],
    total: _Totals,
    now: float,
) -> Iterator[Any]:
    """The runs in the store: by status, how long the oldest has been there, what the
    suspended ones wait for, and the dead-lettered."""
    runs = core.GaugeMetricFamily(
        "mainspring_runs", "Runs in the store by status (store-wide gauge).", labels=["status"]
    )
    for status in sorted(set(get_args(RunStatus)) | set(counts)):
        runs.add_metric([status], counts.get(status, 0))  # 0, not absent
    yield runs
    age = core.GaugeMetricFamily(
        "mainspring_store_oldest_run_age_seconds",
        "Seconds since the oldest run in this status entered it (queued: waiting for a"
        " worker; waiting/sleeping: suspended); 0 when there is none (store-wide gauge).",
        labels=["status"],
    )
    for status in ("queued", "waiting", "sleeping"):
        since = oldest.get(status)
        age.add_metric([status], 0.0 if since is None else max(0.0, now - since))
    yield age
    by_reason = core.GaugeMetricFamily(
        "mainspring_runs_waiting",
        "Waiting and sleeping runs by what they wait for (store-wide gauge).",
        labels=["reason"],
    )
    reason_age = core.GaugeMetricFamily(
        "mainspring_store_oldest_wait_age_seconds",
        "Seconds the oldest run waiting for this reason has waited (store-wide gauge).",
        labels=["reason"],
    )
    for reason in sorted(set(WAIT_REASONS) | set(waiting)):
        n, since = waiting.get(reason, (0, now))
        by_reason.add_metric([reason], n)
        reason_age.add_metric([reason], max(0.0, now - since))
    yield by_reason
    yield reason_age
    dead = core.GaugeMetricFamily(
        "mainspring_store_dead_lettered_runs",
        "Failed runs that were dead-lettered: recovery failed too often (store-wide gauge).",
    )
    dead.add_metric([], total.dead_lettered)
    yield dead


def _store_families(core: Any, store: Store, now: float) -> Iterator[Any]:
    """The store's own health: the SQLite log and the webhook outbox."""
    wal = store.wal_size()
    if wal is not None:  # SQLite: a reader left open lets the log grow without bound
        for name, doc, value in (
            ("wal_bytes", "Bytes of the SQLite write-ahead log file now.", wal[0]),
            (
                "wal_limit_bytes",
                "The size the SQLite write-ahead log is truncated to when it starts"
                " over (journal_size_limit); far past it, a read transaction left open"
                " holds checkpoints back.",
                wal[1],
            ),
        ):
            family = core.GaugeMetricFamily(f"mainspring_store_{name}", doc)
            family.add_metric([], value)
            yield family
    pending, oldest_pending, given_up = store.outbox_backlog()
    backlog = core.GaugeMetricFamily(
        "mainspring_store_webhook_backlog",
        "Webhook deliveries not yet delivered: pending (due again) or given up (store-wide gauge).",
        labels=["state"],
    )
    backlog.add_metric(["pending"], pending)
    backlog.add_metric(["given_up"], given_up)
    yield backlog
    backlog_age = core.GaugeMetricFamily(
        "mainspring_store_webhook_oldest_pending_age_seconds",
        "Age of the oldest pending webhook delivery, 0 when none (store-wide gauge).",
    )
    backlog_age.add_metric([], 0.0 if oldest_pending is None else max(0.0, now - oldest_pending))
    yield backlog_age


def _journal_families(core: Any, total: _Totals, by_workflow: dict[str, _Totals]) -> Iterator[Any]:
    """What the journals in the store hold: steps, tokens and spend, rate-limit
    refusals and waits."""
    steps = core.GaugeMetricFamily(
        "mainspring_store_steps",
        "Journal steps in the store by kind and status (store-wide gauge: pruning lowers it).",
        labels=["kind", "status"],
    )
    for (kind, status), n in sorted(total.steps.items()):
        steps.add_metric([kind, status], n)
    yield steps
    tokens = core.GaugeMetricFamily(
        "mainspring_store_tokens",
        "Model tokens journaled by the runs in the store, a fork's copied steps not"
        " counted again (store-wide gauge).",
        labels=["workflow", "direction"],
    )
    cost = core.GaugeMetricFamily(
        "mainspring_store_cost_usd",
        "Spend of the runs in the store, copied steps not counted (store-wide gauge).",
        labels=["workflow"],
    )
    for wf in sorted(by_workflow):
        t = by_workflow[wf]
        tokens.add_metric([wf, "input"], t.tokens_in)
        tokens.add_metric([wf, "output"], t.tokens_out)
        cost.add_metric([wf], round(t.cost_usd, 9))  # no residue of the sums kept
    yield tokens
    yield cost
    refused = core.GaugeMetricFamily(
        "mainspring_store_rate_limited",
        "Model calls refused for rate (HTTP 429) journaled by the runs in the store,"
        " by logical model (store-wide gauge; mainspring_rate_limited_total counts"
        " this process's).",
        labels=["model"],
    )
    for model, n in sorted(total.rate_limited.items()):
        refused.add_metric([model], n)
    yield refused
    waits = core.GaugeMetricFamily(
        "mainspring_store_rate_limit_waits",
        "Waits for a rate limit journaled by the runs in the store (a slot not yet"
        " free, a refusal's retry-after), by logical model (store-wide gauge).",
        labels=["model"],
    )
    waited = core.GaugeMetricFamily(
        "mainspring_store_rate_limit_wait_seconds",
        "Seconds the runs in the store waited for a rate limit, by logical model"
        " (store-wide gauge).",
        labels=["model"],
    )
    for model, (n, secs) in sorted(total.rate_waits.items()):
        waits.add_metric([model], n)
        waited.add_metric([model], secs)
    yield waits
    yield waited
