"""OpenTelemetry spans with ids derived from the run, shared by live export and
back-fill.

A run's trace id is a hash of its run id; the run's root span id a hash of
``(run id, "run")``; a step attempt's span id a hash of ``(run id, session, seq,
attempt)``. So the spans a worker exports live and the spans :func:`export_trace`
back-fills later are the *same* spans (a backend de-duplicates or overwrites them),
and a step span can name its run's root span as parent long before the run ends and
the root span itself is exported.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from typing import Any

from ..storage import RunRecord
from ._names import model_of, public_error_type, tool_of_name
from ._setup import otel, unconfigured, warn_no_exporter
from ._traceparent import parse_traceparent

__all__ = [
    "SpanData",
    "SpanEmitter",
    "child_traceparent",
    "fork_traceparent",
    "run_span",
    "span_id_of",
    "started_span",
    "step_span",
    "trace_id_of",
    "turn_span",
]

_NS = 1_000_000_000


def trace_id_of(run_id: str) -> int:
    """The OpenTelemetry trace id of a run submitted without a ``traceparent`` (128
    bits, never 0); a run submitted with one is in the caller's trace."""
    return int.from_bytes(hashlib.sha256(f"mainspring:{run_id}".encode()).digest()[:16]) or 1


def span_id_of(run_id: str, key: str) -> int:
    """The span id of ``key`` (``"run"`` or ``"session:seq:attempt"``) in a run."""
    digest = hashlib.sha256(f"mainspring:{run_id}:{key}".encode()).digest()
    return int.from_bytes(digest[:8]) or 1


def child_traceparent(parent_id: str, parent_traceparent: str | None, step: str) -> str:
    """The W3C ``traceparent`` a child run started at ``step`` (``"session:seq"``) of
    run ``parent_id`` is given: the parent's trace, the span of that step (its first
    attempt) as the parent span, so that the child's spans nest under it."""
    caller = parse_traceparent(parent_traceparent)
    trace_id = caller.trace_id if caller is not None else trace_id_of(parent_id)
    flags = caller.flags & 1 if caller is not None else 1
    return f"00-{trace_id:032x}-{span_id_of(parent_id, f'{step}:1'):016x}-{flags:02x}"


def fork_traceparent(source_id: str, source_traceparent: str | None) -> str:
    """The W3C ``traceparent`` a fork of run ``source_id`` is given: the source's
    trace, the source's root span as the parent span. So a fork's spans sit in its
    source's trace, its root span beside the source's steps: the branch shows where it
    left the source (its ``mainspring.run.parent_step``) in the same tree."""
    caller = parse_traceparent(source_traceparent)
    trace_id = caller.trace_id if caller is not None else trace_id_of(source_id)
    flags = caller.flags & 1 if caller is not None else 1
    return f"00-{trace_id:032x}-{span_id_of(source_id, 'run'):016x}-{flags:02x}"


class _NextIds:
    """An SDK ``IdGenerator`` that hands out the ids set just before a span starts."""

    trace_id = 1
    span_id = 1

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_id

    def is_trace_id_random(self) -> bool:
        return False  # a hash of the run id: W3C's "random" trace flag stays off


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanData:
    """One span to emit: its place in the run, times (seconds), what it is.
    ``parent``: the key of its parent span in the run (``None``: a root, under the
    caller's span when the run was submitted with a ``traceparent``). ``ok=False``
    with no ``error``: status unset (a call held back, neither a success nor an
    error)."""

    key: str
    name: str
    start: float
    end: float
    attributes: dict[str, Any]
    parent: str | None = "run"
    client: bool = False
    ok: bool = True
    error: tuple[str, str] | None = None  # (type, message): a failed span's exception
    events: tuple[tuple[str, float, dict[str, Any]], ...] = ()


class SpanEmitter:
    """Starts and ends spans with derived ids through a tracer provider (the global
    one by default). One lock: the ids are handed to the SDK through the tracer."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self._trace = otel()
        if tracer_provider is None and unconfigured(self._trace.get_tracer_provider()):
            warn_no_exporter()
        self._tracer = self._trace.get_tracer("mainspring", tracer_provider=tracer_provider)
        self._ids = _NextIds()
        # The SDK's Tracer reads its id generator per span; without the SDK (a no-op
        # provider) there is nothing to export and no ids to choose.
        if hasattr(self._tracer, "id_generator"):
            self._tracer.id_generator = self._ids
        self._lock = threading.Lock()

    def emit(self, run_id: str, span: SpanData, *, traceparent: str | None = None) -> None:
        """Start and end ``span`` of ``run_id``. ``traceparent``: the W3C trace context
        the run was submitted with; the run's spans then belong to the caller's trace,
        its root span a child of the caller's span."""
        t = self._trace
        caller = parse_traceparent(traceparent)
        trace_id = caller.trace_id if caller is not None else trace_id_of(run_id)
        # The caller's sampling decision holds for the whole run.
        flags = t.TraceFlags(caller.flags & 1 if caller is not None else t.TraceFlags.SAMPLED)
        with self._lock:
            self._ids.trace_id = trace_id
            self._ids.span_id = span_id_of(run_id, span.key)
            context = None
            if span.parent is not None:
                parent = t.SpanContext(
                    trace_id, span_id_of(run_id, span.parent), is_remote=False, trace_flags=flags
                )
                context = t.set_span_in_context(t.NonRecordingSpan(parent))
            elif caller is not None:
                parent = t.SpanContext(trace_id, caller.span_id, is_remote=True, trace_flags=flags)
                context = t.set_span_in_context(t.NonRecordingSpan(parent))
            otel_span = self._tracer.start_span(
                span.name,
                context=context,
                start_time=_ns(span.start),
                attributes=span.attributes,
                kind=t.SpanKind.CLIENT if span.client else t.SpanKind.INTERNAL,
            )
        for name, at, attrs in span.events:
            otel_span.add_event(name, attrs, timestamp=_ns(at))
        if span.error is not None:
            kind, message = span.error
            otel_span.add_event(
                "exception",
                {"exception.type": kind, "exception.message": message},
                timestamp=_ns(span.end),
            )
            otel_span.set_status(t.Status(t.StatusCode.ERROR, message or kind))
        elif span.ok:
            otel_span.set_status(t.Status(t.StatusCode.OK))
        otel_span.end(end_time=_ns(max(span.end, span.start)))  # never a negative span


def _model_attributes(
    attrs: dict[str, Any],
    name: str,
    tokens: tuple[int, int, float] | None,
    cost_split: tuple[float, float] | None,
) -> str:
    """Add a model call's GenAI and OpenInference attributes; its span's name."""
    logical = model_of(name)
    provider, _, model = logical.rpartition(":")
    attrs.update(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "llm.model_name": model,
        }
    )
    if provider:
        attrs["gen_ai.provider.name"] = attrs["gen_ai.system"] = provider
        attrs["llm.provider"] = attrs["llm.system"] = provider
    attrs["mainspring.step.name"] = f"model:{logical}"  # never the endpoint URL
    if tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = attrs["llm.token_count.prompt"] = tokens[0]
        attrs["gen_ai.usage.output_tokens"] = attrs["llm.token_count.completion"] = tokens[1]
        attrs["llm.token_count.total"] = tokens[0] + tokens[1]
        attrs["mainspring.cost_usd"] = tokens[2]
        if tokens[2] or cost_split is not None:
            attrs.update(_cost(tokens[2], cost_split))
    return f"chat {model}"


def _tool_attributes(attrs: dict[str, Any], name: str) -> str:
    """Add a tool call's GenAI and OpenInference attributes; its span's name."""
    tool = tool_of_name(name)
    attrs.update(
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "tool.name": tool,
            "mainspring.step.name": name,
        }
    )
    return f"execute_tool {tool}"


def step_span(
    *,
    kind: str,
    name: str,
    session: int,
    seq: int,
    attempt: int,
    start: float,
    end: float,
    status: str,
    error: tuple[str, str] | None = None,
    tokens: tuple[int, int, float] | None = None,
    copied: bool = False,
    run_id: str | None = None,
    content: dict[str, Any] | None = None,
    held: str | None = None,
    turn: int | None = None,
    cost_split: tuple[float, float] | None = None,
) -> SpanData:
    """The span of one step attempt, the same whether exported live or back-filled.
    ``content``: the attributes of what it took and returned (see ``_content``),
    redacted and capped, when capture is on. ``held``: the back-pressure a model call
    met (``rate_limited``, ``overloaded``, ``lapsed``): no error, status unset.
    ``turn``: the seq of the model call whose turn the span belongs to (its parent).
    ``cost_split``: a model call's (prompt, completion) cost, when its price is known."""
    end = max(end, start)  # clocks of two writers: never a negative duration
    attrs: dict[str, Any] = {
        "mainspring.step.position": f"{session}:{seq}",
        "mainspring.step.kind": kind,
        "mainspring.step.status": held or status,
        "mainspring.step.attempt": attempt,
        "openinference.span.kind": _OPENINFERENCE.get(kind, "CHAIN"),
    }
    events: tuple[tuple[str, float, dict[str, Any]], ...] = ()
    if held is not None:
        # back-pressure: the run waits and calls again; an alert on errors must not fire
        attrs["mainspring.step.back_pressure"] = held
        message = error[1] if error is not None else ""
        events = ((held, end, {"message": message}),)
        error = None
    if run_id is not None:
        # Phoenix and Langfuse group a session's traces by it; GenAI's name for it
        attrs["session.id"] = attrs["gen_ai.conversation.id"] = run_id
    if copied:
        attrs["mainspring.step.copied"] = True
    if content:
        attrs.update(content)
    if error is not None:
        attrs["error.type"] = error[0]  # only on the span of the attempt that failed
    client = kind == "model"
    if kind == "model":
        span_name = _model_attributes(attrs, name, tokens, cost_split)
    elif kind == "tool":
        span_name = _tool_attributes(attrs, name)
    else:
        attrs["mainspring.step.name"] = name
        span_name = f"{kind} {name}"
    return SpanData(
        key=f"{session}:{seq}:{attempt}",
        name=span_name,
        start=start,
        end=end,
        attributes=attrs,
        parent="run" if turn is None else f"turn:{session}:{turn}",
        client=client,
        ok=error is None and held is None,
        error=error,
        events=events,
    )


def _cost(total: float, split: tuple[float, float] | None) -> dict[str, Any]:
    """A model call's spend where tracing backends read it: OpenInference's
    ``llm.cost.*`` (Phoenix), GenAI's ``gen_ai.usage.cost`` and Langfuse's
    ``langfuse.observation.cost_details``, in USD."""
    attrs: dict[str, Any] = {"llm.cost.total": total, "gen_ai.usage.cost": total}
    details = {"total": total}
    if split is not None:
        attrs["llm.cost.prompt"], attrs["llm.cost.completion"] = split
        details.update(input=split[0], output=split[1])
    attrs["langfuse.observation.cost_details"] = json.dumps(details)
    return attrs


def turn_span(
    *, run_id: str, session: int, seq: int, start: float, end: float, tool_calls: int
) -> SpanData:
    """The span of an agent's turn: its model call (at ``seq``) and the tool calls that
    reply asked for, which are its children."""
    return SpanData(
        key=f"turn:{session}:{seq}",
        name=f"turn {session}:{seq}",
        start=start,
        end=max(start, end),
        attributes={
            "openinference.span.kind": "CHAIN",
            "session.id": run_id,
            "gen_ai.conversation.id": run_id,
            "mainspring.turn.position": f"{session}:{seq}",
            "mainspring.turn.tool_calls": tool_calls,
        },
        ok=True,
    )


#: OpenInference span kinds of step kinds (anything else is a CHAIN: glue).
_OPENINFERENCE = {"model": "LLM", "tool": "TOOL"}


def run_span(
    record: RunRecord,
    *,
    agent: bool,
    end: float,
    extra: dict[str, Any] | None = None,
    content: dict[str, Any] | None = None,
) -> SpanData:
    """The root span of a finished run. ``content``: its task and answer, when
    capture is on."""
    op = "invoke_agent" if agent else "workflow"
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": op,
        "openinference.span.kind": "AGENT" if agent else "CHAIN",
        "session.id": record.id,
        "gen_ai.conversation.id": record.id,
        "mainspring.run.id": record.id,
        "mainspring.run.status": record.status,
        "mainspring.workflow": record.workflow,
        **(extra or {}),
        **(content or {}),
    }
    if agent:
        attrs["gen_ai.agent.name"] = record.workflow
    if record.parent is not None:
        attrs["mainspring.run.parent"] = record.parent
        attrs["mainspring.run.parent_kind"] = record.parent_kind or ""
        attrs["mainspring.run.parent_step"] = record.parent_step or ""
    error = None
    if record.status in ("failed", "cancelled"):
        error = _run_error(record.status, record.error)
        attrs["error.type"] = error[0]
    return SpanData(
        key="run",
        name=f"{op} {record.workflow}",
        start=record.created_at,
        end=end,
        attributes=attrs,
        parent=None,
        ok=error is None,
        error=error,
    )


def started_span(
    record: RunRecord, *, agent: bool, at: float, content: dict[str, Any] | None = None
) -> SpanData:
    """A root span that says a run has started, exported when a worker first claims
    it (and again, the same span, by a worker that takes it over).

    A run's own root span can only be exported once the run ends (a span is sent when
    it ends, and backends keep the first copy of a span id: Phoenix ignores a repeat),
    and trace lists show traces by their root span: without this one, a running,
    sleeping or waiting run would not be listed at all. It spans from submission to
    the first claim (the time queued), in the run's trace beside its steps."""
    op = "invoke_agent" if agent else "workflow"
    attrs: dict[str, Any] = {
        "openinference.span.kind": "AGENT" if agent else "CHAIN",
        "session.id": record.id,
        "gen_ai.conversation.id": record.id,
        "mainspring.run.id": record.id,
        "mainspring.run.status": "running",
        "mainspring.run.phase": "started",
        "mainspring.workflow": record.workflow,
        **(content or {}),
    }
    if agent:
        attrs["gen_ai.agent.name"] = record.workflow
    if record.owner:
        attrs["mainspring.run.worker"] = record.owner
    return SpanData(
        key="run:started",
        name=f"{op} {record.workflow} (started)",
        start=record.created_at,
        end=max(record.created_at, at),
        attributes=attrs,
        parent=None,
        ok=False,  # unset: the run's outcome is its root span's
    )


def _run_error(status: str, error: str | None) -> tuple[str, str]:
    """A failed or cancelled run's ``(error type, message)``, the type by its public
    name (``mainspring.StepFailed``)."""
    if not error:
        return ("mainspring.Cancelled" if status == "cancelled" else "Error", "")
    try:
        value = json.loads(error)
    except ValueError:
        return ("Error", error)
    if isinstance(value, dict):
        kind = public_error_type(str(value.get("type") or "Error"))
        return (kind, str(value.get("message", "")))
    return ("Error", str(value))


def exception_type(exc: BaseException) -> str:
    """The public name of an exception's class (see :func:`public_error_type`)."""
    cls = type(exc)
    return public_error_type(f"{getattr(cls, '__module__', '')}.{cls.__qualname__}")


def _ns(seconds: float) -> int:
    whole = int(seconds)  # apart, so the fraction keeps its precision
    return whole * _NS + round((seconds - whole) * _NS)
