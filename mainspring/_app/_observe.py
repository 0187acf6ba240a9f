"""What an App lets one see of its runs: traces, diagnoses, Prometheus metrics and
live OpenTelemetry export. ``app.observe``, a part of :class:`~mainspring.App`."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import ConfigError, MissingExtra
from ..limits import PRICES
from ..observability import (
    Diagnosis,
    Family,
    MetricsCollector,
    RunTrace,
    Usage,
    build_trace,
    capture_from_environment,
    diagnose,
    exporter_from_environment,
    family_usage,
    usage_by_run,
)
from ..storage import RunRecord, StepRecord
from ._handle import RunHandle, run_id_of
from ._runtime import Part, Runtime

__all__ = ["Observe"]

log = logging.getLogger("mainspring.observability")


class Observe(Part):
    """``app.observe``: traces, usage, diagnoses and metrics of an App's runs, and the
    live export of their spans (OpenTelemetry)."""

    def __init__(
        self, runtime: Runtime, children: Callable[[str | RunHandle], list[RunRecord]]
    ) -> None:
        super().__init__(runtime)
        self._children = children  # a run's child runs (see family)
        self._metrics: MetricsCollector | None = None
        self._usage_cache: dict[tuple[str, float], Usage] = {}  # finished runs' (see usage)

    def trace(self, run_id: str | RunHandle) -> RunTrace:
        """The run's trace: one entry per journaled step with its latency, tokens,
        cost, attempt and error class (redacted like the journal).

        Raises:
            RunNotFound: no such run.
        """
        run_id = run_id_of(run_id)
        record = self._get_run(run_id)
        return build_trace(
            record, self._store.load_steps(run_id), self._runtime.prices(record.workflow)
        )

    def usage(self, runs: Sequence[RunRecord]) -> dict[str, Usage]:
        """Tokens and cost of each of ``runs`` (its own model calls), by run id, read
        in one query: what a list of runs shows."""
        # A finished run's usage never changes while its row does not (a retry or a
        # prune moves updated_at or removes it): kept, so a list that redraws every few
        # seconds reads only the journals of runs still at work.
        cache = self._usage_cache
        out = {r.id: cache[(r.id, r.updated_at)] for r in runs if (r.id, r.updated_at) in cache}
        todo = [r for r in runs if r.id not in out]
        prices = {r.id: self._runtime.prices(r.workflow) for r in todo}
        found = usage_by_run(self._store.model_steps([r.id for r in todo]), prices)
        for r in todo:
            out[r.id] = found.get(r.id, Usage())
            if r.finished:
                if len(cache) >= 10_000:
                    cache.pop(next(iter(cache)))
                cache[(r.id, r.updated_at)] = out[r.id]
        return {r.id: out[r.id] for r in runs}

    def family(self, run_id: str | RunHandle) -> Family:
        """What ``run_id`` spent with and without its children (``ctx.child`` runs,
        and theirs): tokens, cost and duration of each child and the totals.

        Raises:
            RunNotFound: no such run.
        """
        record = self._get_run(run_id_of(run_id))
        return family_usage(record, self._children, self.usage, self._clock.now())

    def diagnose(self, run_id: str | RunHandle, *, stall_after_s: float = 600.0) -> Diagnosis:
        """``mainspring doctor``: match the run against the failure table (stopped
        half-way, looping, stale state, ignored tool error, context bloat, done but
        wrong), with what to check next."""
        run_id = run_id_of(run_id)
        return diagnose(self.trace(run_id), now=self._clock.now(), stall_after_s=stall_after_s)

    def metrics(self) -> MetricsCollector:
        """The Prometheus collector over this App's store (kept, so that finished
        runs are aggregated once). ``app.observe.metrics().render()`` is what ``/metrics``
        serves. Needs the ``[metrics]`` extra."""
        if self._metrics is None:
            prices = dict(PRICES)
            for spec in self._runtime.agents.values():
                prices.update(spec.prices or {})
            self._metrics = MetricsCollector(
                self._store, prices=prices, telemetry=self._runtime.telemetry, clock=self._clock.now
            )
        return self._metrics

    def enable_tracing(
        self,
        tracer_provider: Any = None,
        *,
        capture_content: bool | None = None,
        content_max_chars: int = 2000,
    ) -> None:
        """Export OpenTelemetry spans live from this process's workers: each step
        attempt as it ends, an agent's turns, each wait as it completes, a "started"
        root span when a run is first claimed (so that trace lists show unfinished
        runs) and a run's root span, with its totals, when it finishes. Ids derive
        from the run, so :func:`~mainspring.observability.export_trace` back-fills the
        same spans, and a worker that takes a run over re-sends what its dead holder
        may not have sent.

        Not needed when the standard ``OTEL_*`` variables configure an exporter: a
        starting worker then enables it by itself, unless :meth:`disable_tracing` was
        called.

        Args:
            tracer_provider: where spans go. By default the global provider; if none
                is set, the exporter the standard ``OTEL_*`` variables configure
                (``OTEL_EXPORTER_OTLP_ENDPOINT``: OTLP/HTTP). Where spans go is
                logged once, and so is a missing exporter. Needs the ``[otel]`` extra.
            capture_content: also export what steps took and returned: tool arguments
                and results, the messages sent to a model and its reply (OpenInference
                ``llm.input_messages`` / ``llm.output_messages``, GenAI
                ``gen_ai.input.messages`` / ``gen_ai.output.messages``), ``input.value``
                / ``output.value``, and the run's input and output on its root span,
                each redacted by the App's redactor and capped. ``None`` (the
                default): as the standard ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
                variable says (``true``), else off: spans often leave the trust
                boundary of the journal.
            content_max_chars: the cap of each captured text (a longer one ends in
                "…"); a model span keeps its system prompt and its last 20 messages.
        """
        if content_max_chars < 1:
            raise ConfigError(f"content_max_chars must be >= 1, got {content_max_chars!r}")
        if capture_content is None:
            capture_content = self._runtime.telemetry.capture_content
        if capture_content is None:
            capture_content = capture_from_environment(os.environ)
        redactor = self._redactor
        self._runtime.telemetry.enable_tracing(
            tracer_provider,
            is_agent=lambda workflow: workflow in self._runtime.agents,
            redact=redactor.redact_json if redactor is not None else None,
            capture_content=capture_content,
            content_max_chars=content_max_chars,
            steps=lambda run_id, session: self._store.load_steps(run_id, session),
        )

    def disable_tracing(self) -> None:
        """Export no spans live from this process's workers, even when the ``OTEL_*``
        variables configure an exporter (``mainspring worker --no-otel``)."""
        self._runtime.telemetry.disable_tracing()

    def _trace_from_environment(self) -> None:
        """A worker starts: export live if the ``OTEL_*`` variables configure an
        exporter and nobody enabled or disabled tracing in code."""
        if self._runtime.telemetry.tracing is not None:
            return
        where = exporter_from_environment(os.environ)
        if where is None:
            return  # read again when the next worker starts: a few dict lookups
        try:
            self.enable_tracing()
        except MissingExtra as exc:
            self._runtime.telemetry.tracing = False  # said once
            log.warning(
                "OpenTelemetry: the OTEL_* variables send spans %s, but %s",
                where if where.startswith("the ") else f"over {where}",
                exc,
            )

    def steps(self, run_id: str | RunHandle) -> list[StepRecord]:
        run_id = run_id_of(run_id)
        self._get_run(run_id)
        return self._store.load_steps(run_id)
