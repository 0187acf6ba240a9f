"""The API's views of runs, steps and requests (what ``_api`` answers with)."""

from __future__ import annotations

from typing import Any

from ..hitl import Request as HumanRequest
from ..observability import Family, Usage
from ..serde import loads, public_error
from ..storage import RunRecord, StepRecord
from ._schemas import CurrentStep, RequestOut, RunOut, RunUsageOut, StepOut, UsageOut

__all__ = ["decode", "error_out", "family_out", "request_out", "run_out", "step_out", "usage_out"]


def decode(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return loads(text)
    except Exception:  # a journal row that is not JSON: show it as text
        return text


def error_out(text: str | None, *, admin: bool) -> Any:
    """A journaled error as a caller may see it: whole for an admin key, else only its
    public part (no traceback, no locals), wherever the API shows one."""
    error = decode(text)
    return error if admin else public_error(error)


def step_out(s: StepRecord, *, admin: bool) -> StepOut:
    return StepOut(
        session=s.session,
        seq=s.seq,
        kind=s.kind,
        name=s.name,
        status=s.status,
        attempt=s.attempt,
        started_at=s.started_at,
        finished_at=s.finished_at,
        output=decode(s.output),
        error=error_out(s.error, admin=admin),
    )


def request_out(r: HumanRequest) -> RequestOut:
    return RequestOut(**r.to_json(), url=f"/runs/{r.run_id}/requests/{r.id}")


def run_out(
    r: RunRecord,
    current: StepRecord | None,
    pending: list[HumanRequest],
    *,
    full: bool = False,
    admin: bool = False,
    summary: bool = False,
) -> RunOut:
    """A run for the API: ``full`` adds its input; ``admin`` keeps a failure's
    traceback; ``summary`` (lists) leaves out the output, which the run's URL serves."""
    suspended = r.status in ("sleeping", "waiting")
    return RunOut(
        id=r.id,
        workflow=r.workflow,
        key=r.key,
        status=r.status,
        session=r.session,
        recoveries=r.recoveries,
        parent=r.parent,
        parent_step=r.parent_step,
        version=r.version,
        schedule=r.schedule,
        queue=r.queue,
        queue_key=r.queue_key,
        priority=r.priority,
        parent_kind=r.parent_kind,
        parent_close=r.parent_close,
        created_at=r.created_at,
        updated_at=r.updated_at,
        finished_at=r.finished_at,
        wait_reason=r.wait_reason if suspended else None,
        wake_at=r.wake_at if suspended and r.wake_at else None,
        input=decode(r.input) if full else None,
        output=None if summary else decode(r.output),
        error=error_out(r.error, admin=admin),
        current_step=(
            None if current is None else CurrentStep.model_validate(current, from_attributes=True)
        ),
        pending_requests=[request_out(p) for p in pending],
        worker=r.owner if r.status == "running" else None,
        lease_until=r.lease_until if r.status == "running" else None,
    )


def usage_out(u: Usage) -> UsageOut:
    return UsageOut(**u.to_json())  # type: ignore[arg-type]


def family_out(f: Family) -> RunUsageOut:
    return RunUsageOut(
        own=usage_out(f.own),
        children=usage_out(f.children_total),
        with_children=usage_out(f.with_children),
        duration_s=round(f.duration_s, 3),
        truncated=f.truncated,
    )
