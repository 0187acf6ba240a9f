"""The spans of journal rows, read back: what :func:`export_trace` sends, and what a
worker that takes a run over sends for the rows its previous holder may not have.

The spans are the ones live export makes (same ids, see ``_spans``): a step attempt
per ended row, and for an agent a turn span per model call with the tool calls that
reply asked for beneath it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from ._content import Capture
from ._names import back_pressure, public_error_type, step_kind
from ._spans import SpanData, step_span, turn_span
from ._trace import RunTrace, TraceEntry

__all__ = ["OpenTurn", "entry_spans"]

_RECORDED = ("now", "uuid", "random", "patch")


@dataclass(slots=True)
class OpenTurn:
    """An agent's turn as far as it went: its model call's seq, first start, last end
    and tool calls."""

    session: int
    seq: int
    start: float
    end: float
    tool_calls: int = 0

    def span(self, run_id: str) -> SpanData:
        return turn_span(
            run_id=run_id,
            session=self.session,
            seq=self.seq,
            start=self.start,
            end=self.end,
            tool_calls=self.tool_calls,
        )


def entry_spans(
    trace: RunTrace,
    *,
    agent: bool,
    capture: Capture | None,
    only: Iterable[tuple[int, int]] | None = None,
) -> tuple[list[SpanData], OpenTurn | None]:
    """The spans of ``trace``'s ended steps (``only``: of these ``(session, seq)``
    positions, with the turns they belong to), and the agent's last turn when the run
    has not ended (it may go on: not exported, its span is the live export's)."""
    run = trace.run
    wanted = None if only is None else set(only)
    spans: list[SpanData] = []
    turns: list[tuple[OpenTurn, bool]] = []  # each turn, and whether it is wanted
    turn: OpenTurn | None = None
    for e in trace.entries:
        ended = e.finished_at is not None and e.status in ("completed", "failed")
        held = back_pressure(e.error_class) if e.kind == "model" and e.status == "failed" else None
        pick = wanted is None or (e.session, e.seq) in wanted
        parent: int | None = None
        if agent and e.kind == "model" and held is None:
            turn = OpenTurn(e.session, e.seq, e.started_at, e.finished_at or e.started_at)
            turns.append((turn, pick))
            parent = e.seq
        elif agent and e.kind == "tool" and turn is not None and turn.session == e.session:
            turn.end = max(turn.end, e.finished_at or e.started_at)
            turn.tool_calls += 1
            parent = turn.seq
            if pick:
                turns[-1] = (turn, True)
        if not ended or e.kind in _RECORDED or not pick:
            continue  # still running, a recorded value (no work), or not asked for
        spans.append(_span(trace, e, capture, held, parent))
    last_open = turns[-1][0] if turns and run.finished_at is None else None
    for t, pick in turns:
        if pick and t is not last_open:
            spans.append(t.span(run.id))
    return spans, last_open


def _span(
    trace: RunTrace, e: TraceEntry, capture: Capture | None, held: str | None, turn: int | None
) -> SpanData:
    failed = e.status == "failed"
    error = None
    if failed:
        error = (public_error_type(e.error_type or e.error_class), e.error_message or "")
    span = step_span(
        kind=step_kind(e.journal_role) if e.kind == "step" else e.kind,
        name=e.name,
        session=e.session,
        seq=e.seq,
        attempt=e.attempt,
        start=e.started_at,
        end=e.finished_at or e.started_at,
        status=e.status,
        error=error,
        tokens=(e.tokens_in, e.tokens_out, e.cost_usd) if e.kind == "model" else None,
        copied=e.copied,
        run_id=trace.run.id,
        content=capture.io(e.input_summary, e.output_summary, kind=e.kind) if capture else None,
        held=held,
        turn=turn,
    )
    if not failed and e.attempt > 1 and e.error_class:
        # The journal keeps the last attempt only, with why the one before failed:
        # say so on the span rather than leave an unexplained gap.
        span = _with_event(
            span,
            "previous_attempt_failed",
            e.started_at,
            {
                "exception.type": public_error_type(e.error_type or e.error_class),
                "exception.message": e.error_message or "",
                "mainspring.step.attempt": e.attempt - 1,
            },
        )
    return span


def _with_event(span: SpanData, name: str, at: float, attrs: dict[str, Any]) -> SpanData:
    return replace(span, events=(*span.events, (name, at, attrs)))
