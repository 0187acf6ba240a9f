"""``mainspring replay-check MODULE:APP``: the replay gate before a deploy."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.table import Table

from .. import ReplayReport, RunCheck
from ._common import JsonOption, cli_errors, console, print_json
from ._load import load_app
from ._worker import accept_version_values

__all__ = ["replay_check"]


def replay_check(
    app_spec: Annotated[
        str, typer.Argument(metavar="MODULE:APP", help="The App holding the code to deploy.")
    ],
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="URL",
            help="Check the runs of this database (production's) instead of the App's own;"
            " opened without migrating it, read-only on PostgreSQL.",
        ),
    ] = None,
    run: Annotated[
        list[str] | None,
        typer.Option("--run", metavar="ID", help="Check this run (repeatable), any status."),
    ] = None,
    workflow: Annotated[
        list[str] | None,
        typer.Option("--workflow", metavar="NAME", help="Only runs of this workflow (repeatable)."),
    ] = None,
    accept_version: Annotated[
        list[str] | None,
        typer.Option(
            help="Only runs of this code version (repeatable; 'none', 'any'). Default: the"
            " runs this App's workers claim."
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Replay every unfinished run's journal against this code, writing nothing.

    Exit code 0 when every run replays cleanly, 1 when one does not (a step order that
    changed, a workflow the code lacks, an input that no longer fits): run it in CI
    before a deploy."""
    with cli_errors():
        app = load_app(app_spec)
        try:
            report = asyncio.run(
                app.replay_check(
                    run,
                    workflows=workflow,
                    versions=accept_version_values(accept_version),
                    database=db,
                )
            )
        finally:
            app.close()
    if as_json:
        print_json(report.to_dict())
    else:
        _print(report)
    raise typer.Exit(0 if report.ok else 1)


def _print(report: ReplayReport) -> None:
    out = console()
    if not report.runs:
        out.print("no unfinished runs to check")
        return
    failed = report.failed
    if failed:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for column in ("run", "workflow", "version", "status", "verdict", "where"):
            table.add_column(column, no_wrap=column != "where")
        for r in failed:
            table.add_row(
                r.run_id[:12], r.workflow, r.version or "-", r.status, r.verdict, _where(r)
            )
        out.print(table)
        hints = dict.fromkeys(r.hint for r in failed if r.hint)
        for hint in hints:
            out.print(f"hint: {hint}")
    rate = len(report.runs) / report.seconds * 60 if report.seconds > 0 else 0.0
    out.print(
        f"{len(report.runs) - len(failed)} of {len(report.runs)} runs replay cleanly"
        f" ({report.seconds:.2f} s, {rate:,.0f} runs a minute)"
    )


def _where(r: RunCheck) -> str:
    if r.verdict != "diverged":
        return r.message
    expected = f"{r.expected[0]} {r.expected[1]!r}" if r.expected else "-"
    got = f"{r.got[0]} {r.got[1]!r}" if r.got else "-"
    return f"position {r.position}: the journal has {expected}, the code asks for {got}"
