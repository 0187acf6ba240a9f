"""``mainspring shadow MODULE:APP``: re-run recorded runs against a candidate, with no
effect reaching the world, and say where the decisions part (docs/lab.md)."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from .. import ConfigError, ShadowReport
from ..lab import save_regressions, shadow_html, shadow_lines
from ._common import JsonOption, cli_errors, console, print_json
from ._lab import _stubs
from ._load import load_app

__all__ = ["parse_when", "shadow"]

_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(text: str | None, flag: str) -> timedelta | datetime | None:
    """``7d`` (back from now: s, m, h, d, w) or an ISO time (``2026-12-01T09:00``)."""
    if text is None:
        return None
    found = _AGO.match(text)
    if found:
        return timedelta(seconds=float(found[1]) * _UNITS[found[2]])
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"{flag} takes a span back from now (7d, 12h, 30m) or an ISO time, got {text!r}"
        ) from None


def _constant(value: Any) -> Any:
    return lambda arguments: value


def shadow(
    app_spec: Annotated[
        str, typer.Argument(metavar="MODULE:APP", help="The App holding the candidate.")
    ],
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="URL",
            help="The recorded runs' database (read-only); default the App's.",
        ),
    ] = None,
    run: Annotated[
        list[str] | None, typer.Option("--run", metavar="ID", help="Shadow this run (repeatable).")
    ] = None,
    workflow: Annotated[
        list[str] | None,
        typer.Option("--workflow", metavar="NAME", help="Only runs of this workflow (repeatable)."),
    ] = None,
    status: Annotated[
        list[str] | None,
        typer.Option("--status", metavar="STATUS", help="Only runs in this status (repeatable)."),
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Created since: 7d, 12h, 30m, or an ISO time.")
    ] = None,
    until: Annotated[str | None, typer.Option(help="Created before: 1d, or an ISO time.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many runs.")] = 100,
    from_step: Annotated[
        str, typer.Option(help="The journal position the candidate decides from (12 or 1:4).")
    ] = "0",
    model: Annotated[
        str | None, typer.Option(help="The candidate's model for every agent (openai:gpt-4.1).")
    ] = None,
    instructions: Annotated[
        str | None, typer.Option(help="The candidate's instructions for every agent.")
    ] = None,
    instructions_file: Annotated[
        Path | None, typer.Option(help="The candidate's instructions, read from a file.")
    ] = None,
    reads: Annotated[
        str, typer.Option(help="'journal' (default): read tools from the journal; 'live'.")
    ] = "journal",
    stub: Annotated[
        list[str] | None,
        typer.Option("--stub", metavar="TOOL=JSON", help="What a tool returns (repeatable)."),
    ] = None,
    scratch: Annotated[
        str | None,
        typer.Option(metavar="URL", help="Write the shadows here (default: a temporary file)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="Write shadow.html and shadow.json here."),
    ] = None,
    save_suite: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Save the runs that diverged as a regression suite (mainspring lab run"
            " MODULE:APP --regressions FILE replays it).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Re-run recorded runs against this App's code (and --model / --instructions),
    every write and irreversible tool answered from the recorded journal or --stub,
    in a scratch database: where do the decisions part, and at what cost?"""
    with cli_errors():
        if reads not in ("journal", "live"):
            raise ConfigError(f"--reads takes 'journal' or 'live', got {reads!r}")
        text = instructions
        if instructions_file is not None:
            text = instructions_file.read_text(encoding="utf-8")
        stubs = {name: _constant(value) for name, value in _stubs(stub or []).items()}
        app = load_app(app_spec)
        try:
            report = asyncio.run(
                app.shadow(
                    run,
                    workflows=workflow,
                    statuses=status,
                    since=parse_when(since, "--since"),
                    until=parse_when(until, "--until"),
                    limit=limit,
                    database=db,
                    from_step=from_step,
                    model=model,
                    instructions=text,
                    stubs=stubs,
                    reads="live" if reads == "live" else "journal",
                    scratch=scratch,
                )
            )
        finally:
            app.close()
        _write(report, out, save_suite)
    if as_json:
        print_json(json.loads(json.dumps(report.to_dict(), default=str)))
        return
    err = console()
    for line in shadow_lines(report):
        err.print(line)


def _write(report: ShadowReport, out: Path | None, save_suite: Path | None) -> None:
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "shadow.html").write_text(shadow_html(report), encoding="utf-8")
        data = json.dumps(report.to_dict(), indent=1, ensure_ascii=False, default=str)
        (out / "shadow.json").write_text(data + "\n", encoding="utf-8")
    if save_suite is not None:
        save_regressions(report, save_suite)
