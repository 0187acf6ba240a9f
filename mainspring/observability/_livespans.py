"""Spans exported while runs execute: each step attempt as it ends, an agent's turn
when the next one starts, each durable wait as it completes, a "started" root when a
run is first claimed, and a run's root span (with its totals) when it finishes.

A worker that takes a run over (its holder's lease expired: the holder died or
froze) also exports the spans of the journal rows its previous holder may have
journaled but not exported yet: the rows that ended in the last batch interval
before that holder's last row (``OTEL_BSP_SCHEDULE_DELAY``: spans are batched that
long before they are sent, and a killed process takes its batch with it). The ids
derive from the run (see ``_spans``), so a span the old holder did send is the same
span again, which backends keep once.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from ..journal import StepInfo
from ..limits import Price, cost_usd
from ..models import ModelResponse, Usage
from ..storage import RunRecord, RunTransition, StepRecord
from ._backfill import OpenTurn, entry_spans
from ._content import Capture
from ._names import back_pressure, step_kind
from ._otel import run_totals
from ._setup import otel
from ._spans import SpanData, SpanEmitter, exception_type, run_span, started_span, step_span
from ._trace import build_trace

__all__ = ["LiveSpans", "StepsLoader", "lost_window_s"]

log = logging.getLogger("mainspring.observability")

_MAX_TURNS = 10_000  # runs whose open turn is remembered (a run resumed elsewhere leaves one)

#: ``(run id, session)`` -> the rows of that session of the run's journal (``None``:
#: of every session).
StepsLoader = Callable[[str, int | None], list[StepRecord]]


def lost_window_s(environ: dict[str, str] | None = None) -> float:
    """How far before a dead holder's last journal row its spans may not have been
    sent: the batch processor's delay (``OTEL_BSP_SCHEDULE_DELAY``, 5 s by default)
    and two seconds for the export itself."""
    env = os.environ if environ is None else environ
    try:
        delay_ms = float(env.get("OTEL_BSP_SCHEDULE_DELAY", "") or 5000)
    except ValueError:
        delay_ms = 5000.0
    return max(0.0, delay_ms) / 1000 + 2.0


class LiveSpans:
    """Exports spans while runs execute (see the module's docstring)."""

    def __init__(
        self,
        tracer_provider: Any,
        *,
        is_agent: Callable[[str], bool],
        redact: Callable[[str], str] | None = None,
        capture_content: bool = False,
        content_max_chars: int = 2000,
        steps: StepsLoader | None = None,
        prices: Callable[[str], dict[str, Price] | None] | None = None,
    ) -> None:
        self.provider = tracer_provider
        self.emitter = SpanEmitter(tracer_provider)
        self._is_agent = is_agent
        # An exception's text is not journaled yet when its span is exported: it is
        # redacted here like the journal's copy will be.
        self._redact = redact
        self.capture = Capture(redact, content_max_chars) if capture_content else None
        self._steps = steps
        self._prices = prices or (lambda _workflow: None)
        self.window_s = lost_window_s()
        self._lock = threading.Lock()
        self._turns: OrderedDict[str, OpenTurn] = OrderedDict()
        # Journal reads (a takeover's back-fill, a finished run's totals) run here, off
        # the worker's event loop; flush() waits for them.
        self._pool: ThreadPoolExecutor | None = None
        self._pending: set[Future[None]] = set()

    # -- step attempts and turns ------------------------------------------------------------

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
            err = (exception_type(error), self._redact(text) if self._redact else text)
        held = back_pressure(type(error).__name__) if kind == "model" and error else None
        agent = record is not None and self._is_agent(record.workflow)
        turn: int | None = None
        closed: OpenTurn | None = None
        if agent and kind == "model" and held is None:
            turn = info.seq
            closed = self._turn(info.run_id, info.session, info.seq, start, end, tool=False)
        elif agent and kind == "tool" and info.turn is not None:
            turn = info.turn
            closed = self._turn(info.run_id, info.session, info.turn, start, end, tool=True)
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
            held=held,
            turn=turn,
            cost_split=self._split(record, info.name, usage, result) if kind == "model" else None,
        )
        traceparent = record.traceparent if record is not None else None
        if closed is not None:
            self._emit(info.run_id, closed.span(info.run_id), traceparent)
        self._emit(info.run_id, span, traceparent)

    def _turn(
        self, run_id: str, session: int, seq: int, start: float, end: float, *, tool: bool
    ) -> OpenTurn | None:
        """Note a model call (which opens its turn) or a tool call (which extends it);
        the turn this one closes, to export."""
        with self._lock:
            open_ = self._turns.get(run_id)
            if open_ is not None and (open_.session, open_.seq) == (session, seq):
                open_.start, open_.end = min(open_.start, start), max(open_.end, end)
                open_.tool_calls += tool
                return None
            self._turns[run_id] = OpenTurn(session, seq, start, end, int(tool))
            self._turns.move_to_end(run_id)
            while len(self._turns) > _MAX_TURNS:
                self._turns.popitem(last=False)
            return open_

    def _split(
        self, record: RunRecord | None, name: str, usage: tuple[int, int, float], result: Any
    ) -> tuple[float, float] | None:
        """A priced model call's (prompt, completion) cost."""
        if not usage[2] or not isinstance(result, ModelResponse):
            return None
        model_id = name.rsplit(":", 1)[-1]
        prices = self._prices(record.workflow) if record is not None else None
        completion = cost_usd(model_id, Usage(output_tokens=usage[1]), prices)
        return (max(0.0, usage[2] - completion), completion)

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

    # -- claims, commits and the end -----------------------------------------------------------

    def claimed(self, record: RunRecord, now: float) -> None:
        """A worker of this process claimed ``record``: the first claim exports the
        run's "started" root (so the run is listed while it runs); a takeover exports
        it too, and back-fills what the dead holder may not have sent."""
        takeover = record.recoveries > 0
        if record.epoch == 1 or takeover:
            content = self.capture.run(record.input, None) if self.capture is not None else None
            agent = self._is_agent(record.workflow)
            span = started_span(record, agent=agent, at=now, content=content)
            self._emit(record.id, span, record.traceparent)
        if takeover and self._steps is not None:
            self._submit(self._recover, record)

    def _recover(self, record: RunRecord) -> None:
        """Export the spans of the rows the previous holders journaled in the window
        before the last of them (see the module's docstring), and take up the
        agent's turn where it was."""
        assert self._steps is not None
        rows = self._steps(record.id, record.session)
        theirs = [
            r
            for r in rows
            if r.epoch < record.epoch
            and r.finished_at is not None
            and r.status in ("completed", "failed")
        ]
        if not theirs:
            return
        last = max(r.finished_at or 0.0 for r in theirs)
        recent = [
            (r.session, r.seq) for r in theirs if (r.finished_at or 0.0) >= last - self.window_s
        ]
        trace = build_trace(record, rows, self._prices(record.workflow))
        agent = self._is_agent(record.workflow)
        spans, open_turn = entry_spans(trace, agent=agent, capture=None, only=recent)
        for span in spans:
            self._emit(record.id, span, record.traceparent)
        if open_turn is not None:
            with self._lock:  # this worker goes on with it: its span comes at its end
                mine = self._turns.get(record.id)
                if mine is None:
                    self._turns[record.id] = open_turn
                elif (mine.session, mine.seq) == (open_turn.session, open_turn.seq):
                    mine.start = min(mine.start, open_turn.start)
                    mine.tool_calls = max(mine.tool_calls, open_turn.tool_calls)

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
            with self._lock:
                last_turn = self._turns.pop(record.id, None)
            if last_turn is not None:
                self._emit(record.id, last_turn.span(record.id), record.traceparent)
            final = replace(
                record,
                status=transition.status,
                error=transition.error,
                output=transition.output,
                finished_at=now,
            )
            if self._steps is None:
                self._root(final, None)
            else:
                self._submit(self._root, final, self._steps)

    def _root(self, final: RunRecord, steps: StepsLoader | None) -> None:
        """The run's root span, with its totals read from the journal."""
        extra = None
        if steps is not None:
            try:
                rows = steps(final.id, None)  # every session
            except Exception:  # the store is down: the root without its totals
                log.warning("run %s: its journal could not be read for its totals", final.id)
            else:
                extra = run_totals(build_trace(final, rows, self._prices(final.workflow)))
        content = None
        if self.capture is not None:
            content = self.capture.run(final.input, final.output)
        agent = self._is_agent(final.workflow)
        root = run_span(
            final, agent=agent, end=final.finished_at or 0.0, extra=extra, content=content
        )
        self._emit(final.id, root, final.traceparent)

    # -- plumbing -------------------------------------------------------------------------------

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="mainspring-spans")
            future = self._pool.submit(self._guarded, fn, *args)
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # telemetry never fails a run
            log.exception("could not export the spans of a run read back from its journal")

    def flush(self, timeout_s: float = 5.0) -> None:
        """Hand every finished span to the exporter now (a worker that stops must not
        take the last batch with it), the ones read back from journals included."""
        with self._lock:
            pending = list(self._pending)
        for future in pending:
            try:
                future.result(timeout=timeout_s)
            except Exception:
                log.exception("could not export the spans of a run read back from its journal")
        force_flush = getattr(self.provider or otel().get_tracer_provider(), "force_flush", None)
        if force_flush is not None:
            try:
                force_flush(int(timeout_s * 1000))
            except Exception:  # telemetry never fails a worker
                log.exception("could not flush OpenTelemetry spans")

    def _emit(self, run_id: str, span: SpanData, traceparent: str | None) -> None:
        try:
            self.emitter.emit(run_id, span, traceparent=traceparent)
        except Exception:  # telemetry never fails a run
            log.exception("could not export span %r of run %s", span.name, run_id)


def _json(value: Any) -> str:
    try:
        return json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        return _safe_str(ValueError(repr(value)))


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)[:500]
    except Exception:
        return f"<{type(exc).__name__}>"
