"""The schedules endpoints: list them (``read``), pause and resume them (``admin``:
a schedule starts runs for everyone, so stopping it is an operator's decision, like
managing webhooks)."""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations.
from fastapi import APIRouter
from pydantic import BaseModel, Field

from ..storage import ScheduleRecord
from ._context import Admin, Ctx, Read, responses

__all__ = ["ScheduleOut", "router"]

router = APIRouter(tags=["schedules"])


class ScheduleOut(BaseModel):
    name: str
    cron: str = Field(description="Five fields: minute hour day-of-month month day-of-week.")
    tz: str = Field(description="The IANA time zone the cron's times are wall times of.")
    workflow: str
    catch_up: str = Field(description="'skip' or 'once': what happens to missed times.")
    queue: str | None = Field(
        default=None, description="The queue its runs start in (within its limits), or null."
    )
    paused: bool
    next_at: float = Field(description="When it is next due (seconds since the epoch).")
    last_at: float | None = Field(description="The due time of the last run it started.")
    last_run: str | None = Field(description="That run's id.")


def _out(record: ScheduleRecord) -> ScheduleOut:
    return ScheduleOut(**record.summary())


@router.get("/schedules", response_model=list[ScheduleOut], responses=responses())
def list_schedules(_key: Read, ctx: Ctx) -> list[ScheduleOut]:
    """Every schedule the workers have stored, by name."""
    return [_out(s) for s in ctx.app.schedules.list()]


@router.post("/schedules/{name}/pause", response_model=ScheduleOut, responses=responses(404))
def pause_schedule(name: str, _key: Admin, ctx: Ctx) -> ScheduleOut:
    """Stop the schedule from starting runs, on every worker, until resumed."""
    return _out(ctx.app.schedules.pause(name))


@router.post("/schedules/{name}/resume", response_model=ScheduleOut, responses=responses(404))
def resume_schedule(name: str, _key: Admin, ctx: Ctx) -> ScheduleOut:
    """Let the schedule start runs again from its next time after now; the times
    that passed while it was paused start nothing."""
    return _out(ctx.app.schedules.resume(name))
