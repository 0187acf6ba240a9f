"""Process telemetry counted as events happen: what this process's workers executed.

:class:`Telemetry` is fed by the worker while runs execute: as the outermost step
interceptor it sees every *executed* attempt (a replayed or fork-copied step runs
nothing, so it is never counted as work or spend again), and as a commit observer it
sees every journal row and run transition this process made durable. Its counters
therefore only ever go up for the life of the process (pruning, ``retry`` and
``fork`` cannot lower them), as Prometheus expects of a counter; a restart is a
counter reset, as for any process.

Execution time (the step function running) and waiting time (sleeps, signals,
approvals, retry back-offs) are kept apart: a step that waited two days for a human
does not make model calls look slow.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import threading
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .._clock import Clock
from ..journal import StepCall, StepInfo, StepInterceptor
from ..limits import Booking, Price, cost_usd
from ..models import ModelResponse
from ..storage import FINISHED, RunRecord, RunWrite, StepRecord, WriteResult
from ._livespans import LiveSpans, StepsLoader
from ._metrics import LATENCY_BUCKETS, _prometheus, wait_reason_label
from ._names import back_pressure, journaled_error_type, model_of, step_kind
from ._setup import configured_provider

__all__ = ["Catalog", "Telemetry", "serve_metrics"]

#: What a process can run, for the counters it reports at 0: its workflows, and the
#: ``(workflow, logical model)`` of each agent.
Catalog = tuple[Iterable[str], Iterable[tuple[str, str]]]

#: Buckets of waits and run durations: seconds to days.
WAIT_BUCKETS: tuple[float, ...] = (
    0.1, 1.0, 5.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 86400.0, 7 * 86400.0,
)  # fmt: skip
_WAIT_KINDS = ("sleep", "signal")
_MAX_BACKOFFS = 10_000  # runs whose failed attempt's end is remembered
# Labels made once, not per step: the kind of the plain role, and of each
# (role, status) that a step's journal row can end with.
_KINDS = {"step": step_kind("step")}
_STEPS_LABELS: dict[tuple[str, str], tuple[str, str]] = {}


@dataclass(slots=True)
class _Histogram:
    bounds: tuple[float, ...]
    counts: dict[tuple[str, ...], list[int]] = field(default_factory=dict)
    sums: dict[tuple[str, ...], float] = field(default_factory=dict)

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        counts = self.counts.get(labels)
        if counts is None:
            counts = self.counts[labels] = [0] * (len(self.bounds) + 1)
        counts[bisect_left(self.bounds, value)] += 1  # the first bound >= value
        self.sums[labels] = self.sums.get(labels, 0.0) + value

    def family(self, core: Any, name: str, doc: str, labels: list[str]) -> Any:
        fam = core.HistogramMetricFamily(name, doc, labels=labels)
        for key in sorted(self.counts):
            cumulative, acc = [], 0
            for bound, n in zip([*map(str, self.bounds), "+Inf"], self.counts[key], strict=True):
                acc += n
                cumulative.append((bound, acc))
            fam.add_metric(list(key), cumulative, sum_value=self.sums[key])
        return fam


class Telemetry(StepInterceptor):
    """Counters, histograms and live spans of what this process executes.

    Every :class:`~mainspring.App` has one (``app.telemetry``); its workers feed it.
    ``app.observe.metrics()`` serves it beside the store-wide gauges. You rarely need this
    class directly: call ``app.observe.enable_tracing()`` to export spans live.
    """

    def __init__(self, clock: Clock, *, prices: Callable[[str], dict[str, Price] | None]) -> None:
        self.clock = clock
        self._prices = prices
        # When the counters started counting (OpenMetrics ``_created``): every series
        # of this process counts from here, those first seen later included.
        self.started_at = clock.now()
        # What the process can run: its workflows, and (workflow, logical model) of its
        # agents. Their counters are reported at 0 before their first event, so that
        # a series exists before it moves and increase() sees the first event.
        self.catalog: Callable[[], Catalog] | None = None
        self._lock = threading.Lock()
        self._runs: dict[str, RunRecord] = {}
        self._counters: dict[str, dict[tuple[str, ...], float]] = {}
        self._step_seconds = _Histogram(LATENCY_BUCKETS)
        self._model_seconds = _Histogram(LATENCY_BUCKETS)
        self._wait_seconds = _Histogram(WAIT_BUCKETS)
        self._run_seconds = _Histogram(WAIT_BUCKETS)
        self._workers: dict[str, tuple[int, int]] = {}  # worker id -> (active, concurrency)
        # worker id -> when its heartbeat last succeeded (the App's clock): liveness
        self._beats: dict[str, float] = {}
        # run -> (session, seq) -> when its last failed attempt ended: the back-off to
        # the next attempt is a wait ("retry"), not step time. Kept while the run sleeps
        # through a long back-off (it comes back to this process, mostly), dropped when
        # it finishes, and capped: a run resumed elsewhere leaves an entry behind.
        self._failed_at: dict[str, dict[tuple[int, int], float]] = {}
        self.spans: LiveSpans | None = None
        # Live export: True (enabled), False (turned off, or its set-up cannot work),
        # None (not decided: a starting worker follows the OTEL_* variables).
        self.tracing: bool | None = None
        # Content capture when tracing starts from the environment: True/False (a
        # worker's --capture-content / --no-capture-content), None (the standard
        # OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT variable decides).
        self.capture_content: bool | None = None
        # The per-step work is a few dict updates under the lock: label tuples of a
        # step name are made once (names are few: the code's step functions).
        self._ok_labels: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}

    def enable_tracing(
        self,
        tracer_provider: Any = None,
        *,
        is_agent: Callable[[str], bool],
        redact: Callable[[str], str] | None,
        capture_content: bool = False,
        content_max_chars: int = 2000,
        steps: StepsLoader | None = None,
    ) -> None:
        """Export spans live through ``tracer_provider`` (see ``app.observe.enable_tracing()``).
        ``steps``: reads a run's journal, for a finished run's totals and a takeover's
        back-fill (off the event loop)."""
        self.tracing = True
        self.spans = LiveSpans(
            configured_provider(tracer_provider, os.environ),
            is_agent=is_agent,
            redact=redact,
            capture_content=capture_content,
            content_max_chars=content_max_chars,
            steps=steps,
            prices=self._prices,
        )

    def disable_tracing(self) -> None:
        """Export no spans, whatever the environment says."""
        self.tracing = False
        self.flush()
        self.spans = None

    def flush(self) -> None:
        """Export the spans still batched (a stopping worker calls it)."""
        if self.spans is not None:
            self.spans.flush()

    # -- what the worker tells us ---------------------------------------------------------

    def run_claimed(self, record: RunRecord) -> None:
        """A worker of this process claimed ``record`` (a takeover when the run had
        been running under a lease that expired)."""
        with self._lock:
            self._runs[record.id] = record
            self._inc("runs_claimed", (record.workflow,))
            if record.recoveries > 0:
                self._inc("lease_takeovers", (record.workflow,))
        spans = self.spans
        if spans is not None:
            spans.claimed(record, self.clock.now())

    def run_dead_lettered(self, workflow: str) -> None:
        """A claim of this process's workers dead-lettered a run of ``workflow``: its
        recoveries ran out, and it was moved to ``failed`` instead of claimed."""
        with self._lock:
            self._inc("dead_letters", (workflow,))

    def run_refused(self, workflow: str) -> None:
        """A worker of this process could not replay a run of ``workflow`` with its
        code (a newer or older deployment's journal) and left it for another."""
        with self._lock:
            self._inc("replays_refused", (workflow,))

    def run_released(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def http_request(self, method: str, route: str, status: int) -> None:
        """The HTTP API answered a request (counted by route template)."""
        with self._lock:
            self._inc("http_requests", (method, route, str(status)))

    def worker_load(self, worker_id: str, active: int, concurrency: int | None) -> None:
        """``concurrency=None``: the worker stopped."""
        with self._lock:
            if concurrency is None:
                self._workers.pop(worker_id, None)
                self._beats.pop(worker_id, None)
            else:
                self._workers[worker_id] = (active, concurrency)
                # a starting worker counts as alive until its first beat is due
                self._beats.setdefault(worker_id, self.clock.now())

    def worker_alive(self, worker_id: str, now: float) -> None:
        """The heartbeat of ``worker_id`` succeeded at ``now`` (from its heartbeat
        thread)."""
        with self._lock:
            if worker_id in self._workers:  # not after the worker stopped
                self._beats[worker_id] = now

    # -- events -----------------------------------------------------------------------------

    async def execute_step(self, call: StepCall, proceed: Callable[[], Awaitable[Any]]) -> Any:
        info = call.info
        kind = _KINDS.get(info.role) or step_kind(info.role)
        start = self.clock.now()
        try:
            result = await proceed()
        except BaseException as exc:
            self._attempt(call, kind, start, None, exc)
            raise
        if (
            kind == "step"
            and info.attempt == 1
            and self.spans is None
            and info.run_id not in self._failed_at
            and not isinstance(result, Booking | ModelResponse)
        ):
            self._first_ok(kind, max(0.0, self.clock.now() - start))
        else:
            self._attempt(call, kind, start, result, None)
        return result

    def _first_ok(self, kind: str, seconds: float) -> None:
        """What :meth:`_attempt` counts for a plain step's first attempt that returned
        (the common case), without the rest of its work."""
        labels = self._ok_labels.get(kind)
        if labels is None:
            labels = self._ok_labels[kind] = ((kind, "ok"), (kind,))
        with self._lock:
            fam = self._counters.get("step_attempts")
            if fam is None:
                fam = self._counters["step_attempts"] = {}
            fam[labels[0]] = fam.get(labels[0], 0) + 1
            self._step_seconds.observe(labels[1], seconds)

    def _attempt(
        self, call: StepCall, kind: str, start: float, result: Any, error: BaseException | None
    ) -> None:
        info = call.info
        end = self.clock.now()
        record = self._runs.get(info.run_id)
        workflow = record.workflow if record is not None else ""
        model = model_of(info.name) if kind == "model" else ""
        tokens_in = tokens_out = 0
        cost = 0.0
        booked: tuple[str, float] | None = None
        if isinstance(result, Booking):
            # "provider:model:account" -> the logical model the wait was for
            booked = (result.key.rsplit(":", 1)[0], max(0.0, result.waited_s))
        elif isinstance(result, ModelResponse):
            tokens_in, tokens_out = result.usage.input_tokens, result.usage.output_tokens
            cost = cost_usd(model.split(":", 1)[-1], result.usage, self._prices(workflow))
        with self._lock:
            self._backoff(info, start, end, error)
            held = back_pressure(type(error).__name__) if error is not None else None
            # A model call held back waits and calls again without spending an
            # attempt: no error. (A plain step's 429 is retried by its policy.)
            outcome = held if held and kind == "model" else "ok" if error is None else "error"
            self._inc("step_attempts", (kind, outcome))
            if info.attempt > 1:
                self._inc("step_retries", (kind,))
            # A slot that lapsed before its request left (agent._call.SlotLapsed) was
            # refused by nobody: not a 429.
            if held == "rate_limited":
                self._inc("rate_limited", (kind, model))
            self._step_seconds.observe((kind,), max(0.0, end - start))
            if kind == "model":
                self._model_seconds.observe((model,), max(0.0, end - start))
            if booked is not None:
                self._inc("rate_limit_bookings", (booked[0],))
                self._inc("rate_limit_wait_seconds", (booked[0],), booked[1])
            if tokens_in or tokens_out:
                self._inc("tokens", (workflow, model, "input"), tokens_in)
                self._inc("tokens", (workflow, model, "output"), tokens_out)
                self._inc("cost_usd", (workflow, model), cost)
        spans = self.spans
        if spans is not None:
            spans.attempt(
                record,
                info,
                kind=kind,
                start=start,
                end=end,
                error=error,
                usage=(tokens_in, tokens_out, cost),
                arguments=(call.args, call.kwargs),
                result=result,
            )

    def _backoff(
        self, info: StepInfo, start: float, end: float, error: BaseException | None
    ) -> None:
        """The retry wait of a step: from the end of its failed attempt to the start of
        the next one. The caller holds the lock."""
        step = (info.session, info.seq)
        failed_at = self._failed_at.get(info.run_id, {}).pop(step, None)
        if failed_at is not None:
            self._wait_seconds.observe(("retry",), max(0.0, start - failed_at))
        if error is not None:
            if info.run_id not in self._failed_at and len(self._failed_at) >= _MAX_BACKOFFS:
                del self._failed_at[next(iter(self._failed_at))]  # the oldest
            self._failed_at.setdefault(info.run_id, {})[step] = end

    def committed(self, write: RunWrite, result: WriteResult) -> None:
        """A write of this process was made durable (``result.ok``) or refused."""
        if not result.ok or result.already:
            return
        record = self._runs.get(write.run_id)
        workflow = record.workflow if record is not None else ""
        ended: list[StepRecord] = []
        with self._lock:
            for row in write.steps:
                if row.status not in ("completed", "failed") or row.finished_at is None:
                    continue
                ended.append(row)
                if row.kind in _WAIT_KINDS:
                    wait = _wait_reason(row)
                    self._wait_seconds.observe((wait,), max(0.0, row.finished_at - row.started_at))
                elif row.kind == "step":
                    self._count_step(row)
            t = write.transition
            if t is not None and t.kind == "finish" and t.status is not None:
                self._finished(write.run_id, t.status, workflow, record)
        spans = self.spans
        if spans is not None and record is not None:
            spans.committed(record, ended, write.transition, self.clock.now())

    def _count_step(self, row: StepRecord) -> None:
        """One ended step in ``steps`` by kind and status. The caller holds the lock."""
        status: str = row.status
        if status == "failed" and row.role == "model":
            # a 429 or an overload is back-pressure, never a failed step
            status = back_pressure(journaled_error_type(row.error)) or status
        labels = _STEPS_LABELS.get((row.role, status))
        if labels is None:
            labels = _STEPS_LABELS[row.role, status] = (step_kind(row.role), status)
        counts = self._counters.get("steps")
        if counts is None:
            counts = self._counters["steps"] = {}
        counts[labels] = counts.get(labels, 0) + 1

    def _finished(self, run_id: str, status: str, workflow: str, record: RunRecord | None) -> None:
        """A run this process finished. The caller holds the lock."""
        self._failed_at.pop(run_id, None)
        self._inc("runs_finished", (workflow, status))
        if record is not None:
            self._run_seconds.observe((workflow,), self.clock.now() - record.created_at)

    # -- Prometheus -------------------------------------------------------------------------

    def _inc(self, name: str, labels: tuple[str, ...], by: float = 1) -> None:
        fam = self._counters.setdefault(name, {})
        fam[labels] = fam.get(labels, 0) + by

    def collect(self) -> Iterator[Any]:
        """The process's metric families (``prometheus_client`` core objects)."""
        core = _prometheus().core
        zeros = self._zeros()
        created = self.started_at
        with self._lock:
            for name, doc, labels in _COUNTERS:
                fam = core.CounterMetricFamily(f"mainspring_{name}", doc, labels=labels)
                counts = self._counters.get(name, {})
                for key in sorted(zeros.get(name, set()) | counts.keys()):
                    fam.add_metric(list(key), counts.get(key, 0), created=created)
                yield fam
            yield self._step_seconds.family(
                core,
                "mainspring_step_seconds",
                "Execution time of each executed step attempt (no waits, no back-off).",
                ["kind"],
            )
            yield self._model_seconds.family(
                core,
                "mainspring_model_seconds",
                "Execution time of each model call attempt, by logical model.",
                ["model"],
            )
            yield self._wait_seconds.family(
                core,
                "mainspring_wait_seconds",
                "How long durable waits lasted: sleeps, signals, approvals.",
                ["reason"],
            )
            yield self._run_seconds.family(
                core,
                "mainspring_run_duration_seconds",
                "From submission to the end, for runs this process finished.",
                ["workflow"],
            )
            active = core.GaugeMetricFamily(
                "mainspring_worker_active_runs", "Runs this process's workers execute now."
            )
            active.add_metric([], sum(a for a, _ in self._workers.values()))
            yield active
            cap = core.GaugeMetricFamily(
                "mainspring_worker_concurrency", "Runs this process's workers may execute at once."
            )
            cap.add_metric([], sum(c for _, c in self._workers.values()))
            yield cap
            beat = core.GaugeMetricFamily(
                "mainspring_worker_heartbeat_age_seconds",
                "Seconds since each running worker of this process last renewed its leases "
                "(or, idle, last found its loop alive): it grows when the worker is stuck.",
                labels=["worker"],
            )
            now = self.clock.now()
            for worker_id, at in sorted(self._beats.items()):
                beat.add_metric([worker_id], max(0.0, now - at))
            yield beat
        info = core.GaugeMetricFamily(
            "mainspring_build_info", "Always 1: the versions serving.", labels=["version", "python"]
        )
        info.add_metric(list(_build_info()), 1)
        yield info

    def _zeros(self) -> dict[str, set[tuple[str, ...]]]:
        """The series every process reports from its start, 0 until they move: each
        closed label set, and the workflows and agent models of :attr:`catalog`."""
        workflows: list[str] = []
        pairs: list[tuple[str, str]] = []
        if self.catalog is not None:
            try:
                found, agents = self.catalog()
                workflows, pairs = sorted(found), sorted(agents)
            except Exception:  # a scrape never fails for it
                workflows, pairs = [], []
        models = sorted({m for _, m in pairs})
        kinds = ("step", "model", "tool", "rate")
        held = ("rate_limited", "overloaded")
        out: dict[str, set[tuple[str, ...]]] = {
            "steps": {(k, s) for k in kinds for s in ("completed", "failed")}
            | {("model", s) for s in held},
            "step_attempts": {(k, o) for k in kinds for o in ("ok", "error")}
            | {("model", o) for o in held},
            "step_retries": {(k,) for k in kinds},
            "rate_limited": {("model", m) for m in models},
            "rate_limit_bookings": {(m,) for m in models},
            "rate_limit_wait_seconds": {(m,) for m in models},
            "tokens": {(w, m, d) for w, m in pairs for d in ("input", "output")},
            "cost_usd": set(pairs),
            "runs_finished": {(w, s) for w in workflows for s in FINISHED},
        }
        for name in ("runs_claimed", "lease_takeovers", "dead_letters", "replays_refused"):
            out[name] = {(w,) for w in workflows}
        return out


def _wait_reason(row: StepRecord) -> str:
    if row.kind == "sleep":
        return "sleep"
    # approvals, questions and budget checks are signals named "<reason>:..."
    return wait_reason_label(f"signal:{row.name}")


_COUNTERS: tuple[tuple[str, str, list[str]], ...] = (
    (
        "steps",
        "Steps (ctx.step, model and tool calls) that ended in this process; a model call"
        " held back by a 429 or an overload is status rate_limited or overloaded, never"
        " failed.",
        ["kind", "status"],
    ),
    (
        "step_attempts",
        "Executed step attempts by outcome (ok, error; a model call's rate_limited or"
        " overloaded: back-pressure, no attempt spent).",
        ["kind", "outcome"],
    ),
    ("step_retries", "Executed attempts beyond the first.", ["kind"]),
    ("rate_limited", "Attempts that ended in a rate limit (HTTP 429).", ["kind", "model"]),
    ("tokens", "Model tokens of executed calls.", ["workflow", "model", "direction"]),
    ("cost_usd", "Spend of executed model calls (price table).", ["workflow", "model"]),
    ("rate_limit_bookings", "Rate-limiter slots booked before model calls.", ["model"]),
    (
        "rate_limit_wait_seconds",
        "Seconds runs were told to wait for their rate-limit slot (rate(): runs waiting).",
        ["model"],
    ),
    ("runs_claimed", "Runs claimed by this process's workers.", ["workflow"]),
    (
        "lease_takeovers",
        "Claims of a run whose previous holder's lease had expired.",
        ["workflow"],
    ),
    (
        "dead_letters",
        "Runs a claim of this process dead-lettered (recovery failed too often).",
        ["workflow"],
    ),
    (
        "replays_refused",
        "Runs this process's code could not replay (a journal from another deployment's"
        " code), left for a worker whose code can.",
        ["workflow"],
    ),
    ("http_requests", "HTTP API requests answered.", ["method", "route", "status"]),
    ("runs_finished", "Runs this process finished, by final status.", ["workflow", "status"]),
)


def _build_info() -> tuple[str, str]:
    try:
        version = importlib.metadata.version("mainspring")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return version, platform.python_version()


def serve_metrics(telemetry: Telemetry, host: str, port: int) -> None:
    """Serve ``telemetry``'s counters at ``http://host:port/metrics`` from a daemon
    thread: how a worker without the HTTP API is scraped. The store-wide gauges are
    left to the server (every replica would report the same values)."""
    prom = _prometheus()
    registry = prom.CollectorRegistry(auto_describe=False)
    registry.register(telemetry)
    prom.start_http_server(port, addr=host, registry=registry)
