"""``mainspring schedules``: list schedules, pause and resume them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from ..storage import ScheduleRecord
from ._common import AppOption, DbOption, JsonOption, cli_errors, console, open_app, print_json

__all__ = ["schedules_commands"]

schedules_commands = typer.Typer(
    name="schedules",
    help="Schedules (cron times that start runs): list, pause, resume.",
    no_args_is_help=True,
)

NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="The schedule's name.")]


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@schedules_commands.command("list")
def schedules_list(
    db: DbOption = None, app_spec: AppOption = None, as_json: JsonOption = False
) -> None:
    """List the schedules workers have stored, with their next and last times."""
    with cli_errors(), open_app(db, app_spec) as app:
        found = app.schedules.list()
    if as_json:
        print_json([s.summary() for s in found])
        return
    table = Table(
        "name", "cron", "zone", "workflow", "queue", "catch-up", "state", "next", "last run"
    )
    for s in found:
        last = "-" if s.last_run is None else f"{s.last_run} ({_when(s.last_at)})"
        state = "paused" if s.paused else "active"
        queue = s.queue or "-"
        table.add_row(
            s.name, s.cron, s.tz, s.workflow, queue, s.catch_up, state, _when(s.next_at), last
        )
    console().print(table)


def _say(record: ScheduleRecord, as_json: bool) -> None:
    if as_json:
        print_json(record.summary())
        return
    if record.paused:
        console().print(f"schedule {record.name} is paused")
    else:
        console().print(f"schedule {record.name} is active; next at {_when(record.next_at)}")


@schedules_commands.command("pause")
def schedules_pause(
    name: NameArgument, db: DbOption = None, app_spec: AppOption = None, as_json: JsonOption = False
) -> None:
    """Pause a schedule: no worker starts its runs until it is resumed."""
    with cli_errors(), open_app(db, app_spec) as app:
        record = app.schedules.pause(name)
    _say(record, as_json)


@schedules_commands.command("resume")
def schedules_resume(
    name: NameArgument, db: DbOption = None, app_spec: AppOption = None, as_json: JsonOption = False
) -> None:
    """Resume a schedule from its next time after now (the times that passed while it
    was paused start nothing)."""
    with cli_errors(), open_app(db, app_spec) as app:
        record = app.schedules.resume(name)
    _say(record, as_json)
