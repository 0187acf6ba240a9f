"""OpenTelemetry export of a run's trace, following the GenAI semantic conventions.

One OpenTelemetry trace per run: a root span for the run (``invoke_agent`` for an
agent, ``workflow`` otherwise) and a child span per journaled step, with the
journal's own start and end times. Model calls are ``chat`` spans carrying
``gen_ai.request.model`` and ``gen_ai.usage.input_tokens/output_tokens``; tool calls
are ``execute_tool`` spans carrying ``gen_ai.tool.name``. Exporting reads the
journal (already redacted), so it can run anywhere: after a run finishes, from a
cron job, or for a run from last week.

Needs the ``[otel]`` extra (``opentelemetry-api`` and ``opentelemetry-sdk``).
"""

from __future__ import annotations

from typing import Any

from .._errors import MissingExtra
from ._trace import RunTrace, TraceEntry

__all__ = ["export_trace"]

_NS = 1_000_000_000


def _otel() -> tuple[Any, Any]:
    try:
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode
    except ImportError as exc:
        raise MissingExtra("OpenTelemetry export", "otel", exc.name) from None
    return trace, (Status, StatusCode)


def export_trace(
    trace: RunTrace, *, tracer_provider: Any = None, agent: bool | None = None
) -> None:
    """Emit ``trace`` as OpenTelemetry spans through ``tracer_provider`` (default: the
    global one). Its span processors export them (batching, OTLP, ...).

    Args:
        trace: from :meth:`App.trace`.
        tracer_provider: an ``opentelemetry.sdk.trace.TracerProvider``.
        agent: whether the run is an agent's (root span ``invoke_agent``); by default
            a run with model calls is taken for one.
    """
    otel_trace, (Status, StatusCode) = _otel()
    tracer = otel_trace.get_tracer("mainspring", tracer_provider=tracer_provider)
    run = trace.run
    entries = trace.entries
    is_agent = agent if agent is not None else any(e.kind == "model" for e in entries)
    op = "invoke_agent" if is_agent else "workflow"
    end = run.finished_at or max(
        [run.updated_at, *(e.finished_at or e.started_at for e in entries)]
    )
    root_attrs: dict[str, Any] = {
        "gen_ai.operation.name": op,
        "mainspring.run.id": run.id,
        "mainspring.run.status": run.status,
        "mainspring.workflow": run.workflow,
        "gen_ai.usage.input_tokens": trace.tokens_in,
        "gen_ai.usage.output_tokens": trace.tokens_out,
        "mainspring.cost_usd": trace.cost_usd,
    }
    if is_agent:
        root_attrs["gen_ai.agent.name"] = run.workflow
    root = tracer.start_span(
        f"{op} {run.workflow}",
        start_time=_ns(run.created_at),
        attributes=root_attrs,
        kind=otel_trace.SpanKind.INTERNAL,
    )
    parent = otel_trace.set_span_in_context(root)
    for e in entries:
        name, attrs = _span_of(e)
        span = tracer.start_span(
            name,
            context=parent,
            start_time=_ns(e.started_at),
            attributes=attrs,
            kind=otel_trace.SpanKind.CLIENT if e.kind == "model" else otel_trace.SpanKind.INTERNAL,
        )
        if e.status == "failed":
            span.set_status(Status(StatusCode.ERROR, e.error_message or e.error_class or ""))
        span.end(end_time=_ns(e.finished_at or end))
    if run.status in ("failed", "cancelled"):
        root.set_status(Status(StatusCode.ERROR, run.status))
    root.end(end_time=_ns(end))


def _span_of(e: TraceEntry) -> tuple[str, dict[str, Any]]:
    attrs: dict[str, Any] = {
        "mainspring.step.position": e.position,
        "mainspring.step.name": e.name,
        "mainspring.step.status": e.status,
        "mainspring.step.attempt": e.attempt,
    }
    if e.error_class:
        attrs["error.type"] = e.error_class
    if e.kind == "model":
        provider = e.name.split(":")[1] if e.name.count(":") >= 2 else None
        attrs.update(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": e.model or "",
                "gen_ai.usage.input_tokens": e.tokens_in,
                "gen_ai.usage.output_tokens": e.tokens_out,
                "mainspring.cost_usd": e.cost_usd,
            }
        )
        if provider:
            attrs["gen_ai.provider.name"] = provider
        return f"chat {e.model}", attrs
    if e.kind == "tool":
        attrs.update({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": e.tool or ""})
        if e.input_summary:
            attrs["gen_ai.tool.call.arguments"] = e.input_summary
        return f"execute_tool {e.tool}", attrs
    return f"{e.kind} {e.name}", attrs


def _ns(seconds: float) -> int:
    whole = int(seconds)  # apart, so the fraction keeps its precision
    return whole * _NS + round((seconds - whole) * _NS)
