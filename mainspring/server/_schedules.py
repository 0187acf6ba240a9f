"""The schedules endpoints: list them (``read``), pause and resume them (``admin``:
a schedule starts runs for everyone, so stopping it is an operator's decision, like
managing webhooks)."""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations
# (the key dependencies passed in) at runtime.
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from .. import App
from ..storage import ScheduleRecord

__all__ = ["ScheduleOut", "add_schedule_routes"]


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


def add_schedule_routes(api: FastAPI, app: App, *, read: Any, admin: Any, responses: Any) -> None:
    """Add ``GET /schedules`` and ``POST /schedules/{name}/pause|resume`` to ``api``;
    ``read`` and ``admin`` are the key dependencies of those scopes."""

    @api.get(
        "/schedules", response_model=list[ScheduleOut], tags=["schedules"], responses=responses()
    )
    def list_schedules(_key: read) -> list[ScheduleOut]:
        """Every schedule the workers have stored, by name."""
        return [_out(s) for s in app.list_schedules()]

    @api.post(
        "/schedules/{name}/pause",
        response_model=ScheduleOut,
        tags=["schedules"],
        responses=responses(404),
    )
    def pause_schedule(name: str, _key: admin) -> ScheduleOut:
        """Stop the schedule from starting runs, on every worker, until resumed."""
        return _out(app.pause_schedule(name))

    @api.post(
        "/schedules/{name}/resume",
        response_model=ScheduleOut,
        tags=["schedules"],
        responses=responses(404),
    )
    def resume_schedule(name: str, _key: admin) -> ScheduleOut:
        """Let the schedule start runs again from its next time after now; the times
        that passed while it was paused start nothing."""
        return _out(app.resume_schedule(name))
