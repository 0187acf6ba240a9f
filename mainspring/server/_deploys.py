"""``POST /replay-check``: the replay gate over HTTP (admin scope): the journal of every
unfinished run replayed against the code this server runs, writing nothing (see
:meth:`mainspring.App.replay_check`). The dashboard's runs list calls it."""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations.
import asyncio

from fastapi import APIRouter

from ._context import Admin, Ctx, responses
from ._schemas import ReplayCheckIn, ReplayCheckOut

__all__ = ["router"]

router = APIRouter()


@router.post(
    "/replay-check", response_model=ReplayCheckOut, tags=["runs"], responses=responses(413, 422)
)
async def replay_check(body: ReplayCheckIn, _key: Admin, ctx: Ctx) -> ReplayCheckOut:
    """Replay every unfinished run (or `runs`) against the code this server runs, and say
    which would not replay: where each diverges, what the journal holds there and what
    the code asks for. Nothing is written. Admin scope: a fleet's replay is work."""
    check = ctx.app.replay_check(body.runs, workflows=body.workflows, versions=body.versions)
    # On a thread of its own, with its own event loop: a fleet's replay is CPU work
    # that must not hold up the server's other requests.
    report = await asyncio.to_thread(asyncio.run, check)
    return ReplayCheckOut.model_validate(report.to_dict())
