"""OpenTelemetry export of a run's trace, following the GenAI semantic conventions.

One OpenTelemetry trace per run: a root span for the run (``invoke_agent`` for an
agent, ``workflow`` otherwise) and a child span per journaled step attempt, with the
journal's own start and end times. Model calls are ``chat`` spans carrying
``gen_ai.request.model`` and ``gen_ai.usage.input_tokens/output_tokens``; tool calls
are ``execute_tool`` spans carrying ``gen_ai.tool.name``.

Ids are derived from the run id and the step (see ``_spans``): exporting a run twice,
or back-filling a run a worker already exported live, gives the same spans. Steps
that have not ended are not exported (a running step is not a 0 ms span), nor is the
root span of an unfinished run.

Needs the ``[otel]`` extra (``opentelemetry-api`` and ``opentelemetry-sdk``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ._content import Capture
from ._names import step_kind
from ._spans import SpanData, SpanEmitter, run_span, step_span
from ._trace import RunTrace

__all__ = ["export_trace"]

_RECORDED = ("now", "uuid", "random", "patch")
_SUMMARY_CHARS = 2000  # the run's input and output; step summaries are shorter already


def export_trace(
    trace: RunTrace,
    *,
    tracer_provider: Any = None,
    agent: bool | None = None,
    capture_content: bool = False,
) -> None:
    """Emit ``trace`` as OpenTelemetry spans through ``tracer_provider`` (default: the
    global one). Its span processors export them (batching, OTLP, ...). For back-filling
    runs that ran without live export (see :meth:`App.enable_tracing`).

    Args:
        trace: from :meth:`App.trace`.
        tracer_provider: an ``opentelemetry.sdk.trace.TracerProvider``.
        agent: whether the run is an agent's (root span ``invoke_agent``); by default
            a run with model calls is taken for one.
        capture_content: add each step's input and output summaries (redacted when
            journaled, 160 characters at most) as ``input.value`` / ``output.value``
            (and a tool's as ``gen_ai.tool.call.arguments`` / ``.result``), and the
            run's input and output on its root span. Off by default, as live: tool
            arguments are content too.
    """
    emitter = SpanEmitter(tracer_provider)
    # The journal's summaries were redacted when journaled: capped, not redacted again.
    capture = Capture(None, _SUMMARY_CHARS) if capture_content else None
    run = trace.run
    entries = trace.entries
    for e in entries:
        if e.finished_at is None or e.status not in ("completed", "failed"):
            continue  # still running (or backing off): not a finished span yet
        if e.kind in _RECORDED:
            continue  # a recorded value, not work: live export has no span for it either
        failed = e.status == "failed"
        span = step_span(
            kind=step_kind(e.journal_role) if e.kind == "step" else e.kind,
            name=e.name,
            session=e.session,
            seq=e.seq,
            attempt=e.attempt,
            start=e.started_at,
            end=e.finished_at,
            status=e.status,
            error=(e.error_class or "Error", e.error_message or "") if failed else None,
            tokens=(e.tokens_in, e.tokens_out, e.cost_usd) if e.kind == "model" else None,
            copied=e.copied,
            run_id=run.id,
            content=capture.io(e.input_summary, e.output_summary, kind=e.kind) if capture else None,
        )
        if not failed and e.attempt > 1 and e.error_class:
            # The journal keeps the last attempt only, with why the one before failed:
            # say so on the span rather than leave an unexplained gap.
            span = _with_event(
                span,
                "previous_attempt_failed",
                e.started_at,
                {
                    "exception.type": e.error_class,
                    "exception.message": e.error_message or "",
                    "mainspring.step.attempt": e.attempt - 1,
                },
            )
        emitter.emit(run.id, span, traceparent=run.traceparent)
    if run.finished_at is None:
        return  # the root span is exported when the run ends
    is_agent = agent if agent is not None else any(e.kind == "model" for e in entries)
    extra = {
        "gen_ai.usage.input_tokens": trace.tokens_in,
        "gen_ai.usage.output_tokens": trace.tokens_out,
        "mainspring.cost_usd": trace.cost_usd,
    }
    content = capture.run(run.input, run.output) if capture is not None else None
    root = run_span(run, agent=is_agent, end=run.finished_at, extra=extra, content=content)
    emitter.emit(run.id, root, root=True, traceparent=run.traceparent)


def _with_event(span: SpanData, name: str, at: float, attrs: dict[str, Any]) -> SpanData:
    return replace(span, events=(*span.events, (name, at, attrs)))
