"""The runs list as an operator triages it: what each run is doing, since when, what
it spent, why it failed and where it came from.

``updated_at`` of a run row moves only when its status does (a step commit does not
touch the run row: that is the step-overhead budget), so a busy run's "updated" time
would stay at its claim. Its *last activity* is the later of that and its newest
journal row's start or end, which moves with every step.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from ..observability import Usage, run_duration
from ..serde import public_error
from ..storage import RunRecord, StepRecord

__all__ = ["RunRow", "ago", "error_line", "run_rows", "stamp"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRow:
    """One line of the runs list.

    Attributes:
        step: the run's newest journal row (its current step), if any.
        last_activity: the latest of the run row's change and its newest step's.
        age_s: since submission; duration_s: submission to end (to now while open).
        usage: its own model calls' tokens and cost.
        error: the first line of its error (type: message), for a failed run.
        marks: where it came from and what happened to it, as short labels with a
            title each (``child``, ``fork``, ``scheduled``, ``retried 1×``,
            ``recovered 2×``, ``attempt 3``).
    """

    run: RunRecord
    step: StepRecord | None
    last_activity: float
    age_s: float
    duration_s: float
    usage: Usage
    error: str | None
    marks: tuple[tuple[str, str], ...]


def error_line(text: str | None, limit: int = 160) -> str | None:
    """``Type: message`` from a run's stored error (JSON), its first line only."""
    if not text:
        return None
    try:
        value = public_error(json.loads(text))
    except ValueError:
        value = text
    if isinstance(value, dict):
        kind = str(value.get("type", "Error")).rsplit(".", 1)[-1]
        message = str(value.get("message", "")).strip()
        line = f"{kind}: {message}" if message else kind
    else:
        line = str(value)
    line = line.strip().splitlines()[0] if line.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _marks(run: RunRecord, step: StepRecord | None) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    if run.parent and run.parent_kind == "child":
        out.append(("child", f"a child run of {run.parent} (at step {run.parent_step})"))
    elif run.parent:
        out.append(("fork", f"forked from {run.parent} at step {run.parent_step}"))
    if run.schedule:
        out.append(("scheduled", f"started by the schedule ({run.schedule})"))
    if run.retries:
        out.append((f"retried {run.retries}×", f"retried {run.retries} time(s) after it failed"))
    if run.recoveries:
        out.append(
            (
                f"recovered {run.recoveries}×",
                f"taken over {run.recoveries} time(s) after its worker stopped beating",
            )
        )
    if step is not None and step.attempt > 1 and not run.finished:
        out.append((f"attempt {step.attempt}", f"its current step {step.name!r} is retrying"))
    return tuple(out)


def run_rows(
    runs: Sequence[RunRecord],
    steps: Mapping[str, StepRecord],
    usage: Mapping[str, Usage],
    now: float,
) -> list[RunRow]:
    """The rows of the runs list."""
    out = []
    for r in runs:
        step = steps.get(r.id)
        last = r.updated_at
        if step is not None:
            last = max(last, step.finished_at or step.started_at)
        out.append(
            RunRow(
                run=r,
                step=step,
                last_activity=last,
                age_s=max(0.0, now - r.created_at),
                duration_s=run_duration(r, now),
                usage=usage.get(r.id, Usage()),
                error=error_line(r.error) if r.status == "failed" else None,
                marks=_marks(r, step),
            )
        )
    return out


def stamp(ts: float | None) -> str:
    """An absolute time for a title: ``2026-12-07 18:04:05 UTC``."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(seconds: float) -> str:
    """A relative time: ``just now``, ``42 s ago``, ``5 min ago``, ``3 h ago``, ``2 d ago``
    (the page's script keeps the same wording as time passes)."""
    s = max(0.0, seconds)
    if s < 5:
        return "just now"
    if s < 60:
        return f"{int(s)} s ago"
    if s < 3600:
        return f"{int(s // 60)} min ago"
    if s < 86_400:
        return f"{int(s // 3600)} h ago"
    return f"{int(s // 86_400)} d ago"
