"""The runs: submit one, list them, read one and its journal (``/runs``)."""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations.
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response

from .. import App
from ._context import Ctx, Read, Submit, responses
from ._schemas import ChildOut, RunList, RunOut, RunStatusName, StepList, SubmitIn, SubmitOut
from ._views import family_out, run_out, step_out, usage_out

__all__ = ["accepted", "router"]

router = APIRouter()


def accepted(app: App, run_id: str, response: Response, *, created: bool = True) -> SubmitOut:
    """The 202 answer for a run just queued (submitted, forked, retried): where to
    follow it, and whether an idempotency key found it already there."""
    record = app.get_run(run_id)
    url = f"/runs/{run_id}"
    response.headers["Location"] = url
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    return SubmitOut(
        id=record.id, workflow=record.workflow, status=record.status, created=created, url=url
    )


@router.post(
    "/runs",
    status_code=202,
    response_model=SubmitOut,
    tags=["runs"],
    responses=responses(409, 413),
)
def submit_run(
    body: SubmitIn,
    response: Response,
    _key: Submit,
    ctx: Ctx,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    traceparent: Annotated[str | None, Header(max_length=200)] = None,
) -> SubmitOut:
    """Start a run; returns at once with its id (202) and its URL in Location.
    An idempotency key (body or header) makes retries of this request safe. A W3C
    ``traceparent`` header puts the run's spans in the caller's trace."""
    handle = ctx.app.enqueue(
        body.workflow,
        body.args,
        body.kwargs,
        key=body.key or idempotency_key or None,
        traceparent=traceparent,
        queue=body.queue,
        queue_key=body.queue_key,
        priority=body.priority,
    )
    return accepted(ctx.app, handle.run_id, response, created=handle.created)


@router.get("/runs", response_model=RunList, tags=["runs"], responses=responses())
def list_runs(
    request: Request,
    _key: Read,
    ctx: Ctx,
    status: Annotated[list[RunStatusName] | None, Query()] = None,
    workflow: Annotated[str | None, Query(max_length=200)] = None,
    version: Annotated[str | None, Query(max_length=200)] = None,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> RunList:
    """Runs, newest first, filtered by status (repeatable), workflow, queue and the
    code version that submitted them (``App(version=...)``)."""
    records = ctx.app.list_runs(
        status=status,
        queue=queue,
        workflow=workflow,
        limit=limit,
        offset=offset,
        summary=True,
        versions=None if version is None else [version],
    )
    current = ctx.app.store.last_steps([r.id for r in records])
    nxt = None
    if len(records) == limit:
        nxt = str(request.url.include_query_params(offset=offset + limit))
    return RunList(
        runs=[run_out(r, current.get(r.id), [], summary=True) for r in records], next=nxt
    )


@router.get("/runs/{run_id}", response_model=RunOut, tags=["runs"], responses=responses(404))
def get_run(run_id: str, key: Read, ctx: Ctx) -> RunOut:
    """A run: status, current step, pending requests, and its result or error
    (with the traceback of a failure for admin keys only)."""
    app = ctx.app
    record = app.get_run(run_id)
    current = app.store.last_steps([run_id]).get(run_id)
    pending = [] if record.finished else app.requests(run_id)
    out = run_out(record, current, pending, full=True, admin=key.allows("admin"))
    family = app.observe.family(run_id)
    out.usage = family_out(family)
    out.children = [
        ChildOut(
            id=c.run.id,
            workflow=c.run.workflow,
            status=c.run.status,
            parent_step=c.run.parent_step,
            parent_close=c.run.parent_close,
            url=f"/runs/{c.run.id}",
            duration_s=round(c.duration_s, 3),
            usage=usage_out(c.total),
        )
        for c in family.children
    ]
    return out


@router.get(
    "/runs/{run_id}/steps", response_model=StepList, tags=["runs"], responses=responses(404)
)
def get_steps(
    run_id: str,
    key: Read,
    ctx: Ctx,
    after_session: Annotated[int, Query(ge=-1, le=1_000_000)] = -1,
    after_seq: Annotated[int, Query(ge=-1, le=1_000_000_000)] = -1,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> StepList:
    """The run's journal in order, after a position if given (for paging)."""
    ctx.app.get_run(run_id)
    steps = ctx.app.store.steps_after(run_id, after_session, after_seq, limit=limit)
    return StepList(steps=[step_out(s, admin=key.allows("admin")) for s in steps])
