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
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..journal import StepInfo
from ..models import ModelResponse
from ..storage import RunRecord, RunTransition, StepRecord
from ._content import Capture
from ._names import model_of, step_kind, tool_of_name
from ._setup import otel, unconfigured, warn_no_exporter
from ._traceparent import parse_traceparent

__all__ = [
    "LiveSpans",
    "SpanEmitter",
    "child_traceparent",
    "fork_traceparent",
    "span_id_of",
    "trace_id_of",
]

log = logging.getLogger("mainspring.observability")

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
    """One span to emit: its place in the run, times (seconds), what it is."""

    key: str
    name: str
    start: float
    end: float
    attributes: dict[str, Any]
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

    def emit(
        self, run_id: str, span: SpanData, *, root: bool = False, traceparent: str | None = None
    ) -> None:
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
            if not root:
                parent = t.SpanContext(
                    trace_id, span_id_of(run_id, "run"), is_remote=False, trace_flags=flags
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
        otel_span.end(end_time=_ns(span.end))


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
) -> SpanData:
    """The span of one step attempt, the same whether exported live or back-filled.
    ``content``: the attributes of what it took and returned (see ``_content``),
    redacted and capped, when capture is on."""
    attrs: dict[str, Any] = {
        "mainspring.step.position": f"{session}:{seq}",
        "mainspring.step.kind": kind,
        "mainspring.step.status": status,
        "mainspring.step.attempt": attempt,
        "openinference.span.kind": _OPENINFERENCE.get(kind, "CHAIN"),
    }
    if run_id is not None:
        # Phoenix and Langfuse group a session's traces by it; GenAI's name for it
        attrs["session.id"] = attrs["gen_ai.conversation.id"] = run_id
    if copied:
        attrs["mainspring.step.copied"] = True
    if content:
        attrs.update(content)
    if error is not None:
        attrs["error.type"] = error[0]  # only on the span of the attempt that failed
    span_name = f"{kind} {name}"
    client = False
    if kind == "model":
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
        span_name, client = f"chat {model}", True
    elif kind == "tool":
        tool = tool_of_name(name)
        attrs.update(
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "tool.name": tool,
                "mainspring.step.name": name,
            }
        )
        span_name = f"execute_tool {tool}"
    else:
        attrs["mainspring.step.name"] = name
    return SpanData(
        key=f"{session}:{seq}:{attempt}",
        name=span_name,
        start=start,
        end=end,
        attributes=attrs,
        client=client,
        ok=error is None,
        error=error,
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
        error = (record.status, _error_text(record.error))
    return SpanData(
        key="run",
        name=f"{op} {record.workflow}",
        start=record.created_at,
        end=end,
        attributes=attrs,
        ok=error is None,
        error=error,
    )


class LiveSpans:
    """Exports spans while runs execute: each step attempt as it ends, each durable
    wait as it completes, and a run's root span when it finishes."""

    def __init__(
        self,
        tracer_provider: Any,
        *,
        is_agent: Callable[[str], bool],
        redact: Callable[[str], str] | None = None,
        capture_content: bool = False,
        content_max_chars: int = 2000,
    ) -> None:
        self.provider = tracer_provider
        self.emitter = SpanEmitter(tracer_provider)
        self._is_agent = is_agent
        # An exception's text is not journaled yet when its span is exported: it is
        # redacted here like the journal's copy will be.
        self._redact = redact
        self.capture = Capture(redact, content_max_chars) if capture_content else None

    def attempt(
        self,
        record: RunRecord | None,
        info: StepInfo,
        *,
        kind: str,
        start: float,
        end: float,
        error: BaseException | None,
        usage: tuple[int, int, float],
        arguments: tuple[tuple[Any, ...], dict[str, Any]] = ((), {}),
        result: Any = None,
    ) -> None:
        err = None
        if error is not None:
            text = _safe_str(error)
            err = (type(error).__name__, self._redact(text) if self._redact else text)
        span = step_span(
            kind=kind,
            name=info.name,
            session=info.session,
            seq=info.seq,
            attempt=info.attempt,
            start=start,
            end=end,
            status="failed" if err else "completed",
            error=err,
            tokens=usage if kind == "model" else None,
            run_id=info.run_id,
            content=self._content(kind, arguments, result, err is None),
        )
        self._emit(info.run_id, span, record.traceparent if record is not None else None)

    def _content(
        self,
        kind: str,
        arguments: tuple[tuple[Any, ...], dict[str, Any]],
        result: Any,
        ok: bool,
    ) -> dict[str, Any] | None:
        capture = self.capture
        if capture is None:
            return None
        args, kwargs = arguments
        if kind == "model":
            # the model step is given the conversation it sends (agent._call)
            sent = (
                args[0]
                if len(args) == 1 and not kwargs and isinstance(args[0], list | tuple)
                else ()
            )
            reply = result if ok and isinstance(result, ModelResponse) else None
            return capture.model(sent, reply)
        if kind == "tool" and len(args) == 1 and not kwargs:
            given: Any = args[0]  # a tool step is given the arguments the model chose
        else:
            given = kwargs or list(args) or None
        out = _json(result) if ok and result is not None else None
        return capture.io(None if given is None else _json(given), out, kind=kind)

    def committed(
        self,
        record: RunRecord,
        ended: list[StepRecord],
        transition: RunTransition | None,
        now: float,
    ) -> None:
        for row in ended:
            # Rows that ran no step function, so execute_step saw none of them: waits,
            # and the starts of child runs (whose spans the children's nest under).
            child = row.kind == "step" and row.role == "child"
            if (row.kind in ("sleep", "signal") or child) and row.finished_at is not None:
                span = step_span(
                    kind=step_kind(row.role) if child else row.kind,
                    name=row.name,
                    session=row.session,
                    seq=row.seq,
                    attempt=row.attempt,
                    start=row.started_at,
                    end=row.finished_at,
                    status=row.status,
                    run_id=record.id,
                )
                self._emit(record.id, span, record.traceparent)
        if transition is not None and transition.kind == "finish" and transition.status:
            final = replace(
                record, status=transition.status, error=transition.error, finished_at=now
            )
            content = None
            if self.capture is not None:
                content = self.capture.run(record.input, transition.output)
            root = run_span(final, agent=self._is_agent(record.workflow), end=now, content=content)
            self._emit(record.id, root, record.traceparent)

    def flush(self, timeout_s: float = 5.0) -> None:
        """Hand every finished span to the exporter now (a worker that stops must not
        take the last batch with it)."""
        force_flush = getattr(self.provider or otel().get_tracer_provider(), "force_flush", None)
        if force_flush is not None:
            try:
                force_flush(int(timeout_s * 1000))
            except Exception:  # telemetry never fails a worker
                log.exception("could not flush OpenTelemetry spans")

    def _emit(self, run_id: str, span: SpanData, traceparent: str | None) -> None:
        try:
            self.emitter.emit(run_id, span, root=span.key == "run", traceparent=traceparent)
        except Exception:  # telemetry never fails a run
            log.exception("could not export span %r of run %s", span.name, run_id)


def _json(value: Any) -> str:
    try:
        return json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        return _safe_str(ValueError(repr(value)))


def _error_text(error: str | None) -> str:
    if not error:
        return ""
    try:
        value = json.loads(error)
    except ValueError:
        return error
    if isinstance(value, dict):
        return f"{value.get('type', 'Error')}: {value.get('message', '')}"
    return str(value)


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)[:500]
    except Exception:
        return f"<{type(exc).__name__}>"


def _ns(seconds: float) -> int:
    whole = int(seconds)  # apart, so the fraction keeps its precision
    return whole * _NS + round((seconds - whole) * _NS)
