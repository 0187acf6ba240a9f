"""OpenTelemetry export of a run's trace, following the GenAI semantic conventions.

One OpenTelemetry trace per run: a root span for the run (``invoke_agent`` for an
agent, ``workflow`` otherwise, with the run's totals) and a child span per journaled
step attempt, with the journal's own start and end times; an agent's model call and
the tool calls it asked for sit under a ``turn`` span. Model calls are ``chat`` spans carrying
``gen_ai.request.model`` and ``gen_ai.usage.input_tokens/output_tokens``; tool calls
are ``execute_tool`` spans carrying ``gen_ai.tool.name``.

Ids are derived from the run id and the step (see ``_spans``): exporting a run twice,
or back-filling a run a worker already exported live, gives the same spans. Steps
that have not ended are not exported (a running step is not a 0 ms span), nor is the
root span of an unfinished run.

Needs the ``[otel]`` extra (``opentelemetry-api`` and ``opentelemetry-sdk``).
"""

from __future__ import annotations

from typing import Any

from ._backfill import entry_spans
from ._content import Capture
from ._spans import SpanEmitter, run_span
from ._trace import RunTrace

__all__ = ["export_trace", "run_totals"]
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
    runs that ran without live export (see ``app.observe.enable_tracing()``).

    Args:
        trace: from ``app.observe.trace``.
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
    is_agent = agent if agent is not None else any(e.kind == "model" for e in trace.entries)
    spans, _ = entry_spans(trace, agent=is_agent, capture=capture)
    for span in spans:
        emitter.emit(run.id, span, traceparent=run.traceparent)
    if run.finished_at is None:
        return  # the root span is exported when the run ends
    content = capture.run(run.input, run.output) if capture is not None else None
    root = run_span(
        run, agent=is_agent, end=run.finished_at, extra=run_totals(trace), content=content
    )
    emitter.emit(run.id, root, traceparent=run.traceparent)


def run_totals(trace: RunTrace) -> dict[str, Any]:
    """A run's totals on its root span. Not as ``llm.token_count.*`` / ``llm.cost.*``:
    Phoenix adds a span's own counts to its children's, and the model spans already
    carry them, so the run's would count twice."""
    entries = trace.entries
    return {
        "gen_ai.usage.input_tokens": trace.tokens_in,
        "gen_ai.usage.output_tokens": trace.tokens_out,
        "mainspring.cost_usd": trace.cost_usd,
        "mainspring.run.tokens_in": trace.tokens_in,
        "mainspring.run.tokens_out": trace.tokens_out,
        "mainspring.run.cost_usd": trace.cost_usd,
        "mainspring.run.steps": len(entries),
        "mainspring.run.model_calls": sum(1 for e in entries if e.kind == "model"),
        "mainspring.run.tool_calls": sum(1 for e in entries if e.kind == "tool"),
        "mainspring.run.rate_limited": trace.rate_limited,
        **({"mainspring.run.duration_s": d} if (d := trace.duration_s) is not None else {}),
    }
