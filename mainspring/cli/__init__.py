"""The ``mainspring`` command."""

from __future__ import annotations

import sys

import typer

from .. import MainspringError
from ._db import db_commands, prune
from ._demo import demo
from ._human import answer, approve, pending
from ._keys import keys_commands, webhooks_commands
from ._lab import lab_commands, preflight
from ._observe import doctor, fork, retry, tail, trace
from ._queues import queues
from ._replay import replay_check
from ._runs import cancel, runs, show, signal, submit
from ._schedules import schedules_commands
from ._serve import serve
from ._shadow import shadow
from ._worker import worker

__all__ = ["cli", "main"]

cli = typer.Typer(
    name="mainspring",
    help="Durable execution for long-horizon AI agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@cli.callback()
def _root() -> None:
    """Durable execution for long-horizon AI agents."""


cli.command()(worker)
cli.command()(submit)
cli.command()(runs)
cli.command()(queues)
cli.command()(show)
cli.command()(signal)
cli.command()(cancel)
cli.command()(pending)
cli.command()(approve)
cli.command()(answer)
cli.command()(serve)
cli.command()(trace)
cli.command()(tail)
cli.command()(doctor)
cli.command()(fork)
cli.command()(retry)
cli.command()(demo)
cli.command()(prune)
cli.command(name="replay-check")(replay_check)
cli.command()(shadow)
cli.add_typer(db_commands)
cli.add_typer(keys_commands)
cli.add_typer(webhooks_commands)
cli.add_typer(lab_commands)
cli.add_typer(schedules_commands)
cli.command()(preflight)


def main() -> None:
    """Entry point: run the CLI, printing mainspring errors as one clear line."""
    try:
        cli()
    except MainspringError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
