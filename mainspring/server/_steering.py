"""Steering runs from outside: signals, answers to the requests waiting for a human,
cancellation, forks and retries."""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations.
from fastapi import APIRouter, Response

from .. import RunConflict
from ..storage import FINISHED
from ._context import Approve, Ctx, Read, Submit, refuse, responses
from ._runs import accepted
from ._schemas import (
    AnswerIn,
    CancelIn,
    CancelOut,
    ForkIn,
    RequestOut,
    SignalIn,
    SignalOut,
    SubmitOut,
)
from ._views import request_out

__all__ = ["router"]

router = APIRouter(tags=["steering"])


@router.post(
    "/runs/{run_id}/signals",
    status_code=202,
    response_model=SignalOut,
    responses=responses(404, 409, 413),
)
def send_signal(run_id: str, body: SignalIn, _key: Submit, ctx: Ctx) -> SignalOut:
    """Send a signal; a ``ctx.wait_for(name)`` takes it, even one not reached yet.
    Names reserved for requests to humans (``approval:…``, ``question:…``,
    ``budget:…``, ``checkpoint:…``, ``resume``) are refused with 403 whatever the
    key: answer those at ``/runs/{run_id}/requests/{request_id}``."""
    signal_id = ctx.app.signal(run_id, body.name, body.payload)
    return SignalOut(run_id=run_id, name=body.name, signal_id=signal_id)


@router.get("/requests", response_model=list[RequestOut], responses=responses())
def pending(_key: Read, ctx: Ctx) -> list[RequestOut]:
    """Every request waiting for a human, oldest first."""
    return [request_out(r) for r in ctx.app.requests()]


@router.post(
    "/runs/{run_id}/requests/{request_id}",
    response_model=RequestOut,
    responses=responses(404, 409, 413),
)
def answer(run_id: str, request_id: str, body: AnswerIn, key: Approve, ctx: Ctx) -> RequestOut:
    """Answer a request once: approve, reject (with a reason the agent sees) or edit
    (new arguments) an approval; ``answer`` a question."""
    request = ctx.app.answer(
        run_id,
        request_id,
        decision=body.decision,
        reason=body.reason,
        arguments=body.arguments,
        answer=body.answer,
        by=key.name,
    )
    return request_out(request)


@router.post(
    "/runs/{run_id}/cancel",
    status_code=202,
    response_model=CancelOut,
    responses=responses(404, 409, 413),
)
def cancel(run_id: str, _key: Submit, ctx: Ctx, body: CancelIn | None = None) -> CancelOut:
    """Cancel a run: at once if no worker holds it (`cancelled`), else asked
    (`running`): the run ends `cancelled` at its next step boundary, even if
    its workflow returns first (its result is discarded). A run that had already
    ended keeps its end (`409`)."""
    record = ctx.app.get_run(run_id)
    if record.finished:
        raise RunConflict(f"cannot cancel: run {run_id!r} is already {record.status}")
    status = ctx.app.cancel(run_id, body.reason if body else None)
    if status in FINISHED and status != "cancelled":
        raise RunConflict(f"cannot cancel: run {run_id!r} is already {status}")
    return CancelOut(id=run_id, status=status)  # type: ignore[arg-type]


@router.post(
    "/runs/{run_id}/fork",
    status_code=202,
    response_model=SubmitOut,
    responses=responses(404, 413),
)
def fork(run_id: str, body: ForkIn, response: Response, key: Submit, ctx: Ctx) -> SubmitOut:
    """Start a new run that replays this one's journal up to a step and executes
    live after it (time-travel debugging), optionally from an edited result.
    By default the fork asks again every request to a human at or before that
    step; ``decisions: "keep"`` copies the answers as this key's decisions and
    needs the ``approve`` scope."""
    if body.decisions == "keep" and not key.allows("approve"):
        raise refuse(key, "keeping the decisions of a fork needs 'approve'")
    edit = {"edit": body.edit} if "edit" in body.model_fields_set else {}
    handle = ctx.app.fork(
        run_id, from_step=body.from_step, decisions=body.decisions, by=key.name, **edit
    )
    return accepted(ctx.app, handle.run_id, response)


@router.post(
    "/runs/{run_id}/retry",
    status_code=202,
    response_model=SubmitOut,
    responses=responses(404, 409),
)
def retry(run_id: str, response: Response, _key: Submit, ctx: Ctx) -> SubmitOut:
    """Queue a failed run again from its failing step; completed steps are not
    executed again."""
    handle = ctx.app.retry(run_id)
    return accepted(ctx.app, handle.run_id, response)
