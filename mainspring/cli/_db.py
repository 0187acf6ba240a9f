"""``mainspring db migrate / db status`` and ``mainspring prune``: looking after the database.

The database is chosen as for every operator command (``--db``, ``--app``,
``MAINSPRING_DATABASE_URL``, the default). ``db status`` reads without changing
anything; ``db migrate`` is the one command besides ``submit`` that may create a
SQLite file.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal, get_args
from urllib.parse import urlsplit

import typer
from rich.text import Text

from .. import ConfigError
from ..storage import SCHEMA_VERSION, RunStatus, SQLiteStore, Store, open_store, redact_url
from ._common import (
    AppOption,
    DbOption,
    JsonOption,
    cli_errors,
    console,
    database_url,
    iso_time,
    open_app,
    print_json,
    require_file,
    sqlite_path,
)

__all__ = ["db_commands", "parse_duration", "prune"]

SchemaState = Literal["up_to_date", "migration_pending", "database_newer", "not_mainspring"]

_STATUSES: tuple[str, ...] = get_args(RunStatus)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")

db_commands = typer.Typer(
    name="db",
    help="The database: its schema version, migrations and run counts.",
    no_args_is_help=True,
)


@db_commands.command("migrate")
def migrate(db: DbOption = None, app_spec: AppOption = None, as_json: JsonOption = False) -> None:
    """Bring the database's schema to this mainspring's version.

    Run it before rolling out a new version. Workers that start together are safe
    too: migrations take a lock (an advisory lock on PostgreSQL).
    """
    with cli_errors():
        url, source = database_url(db, app_spec)
        path = sqlite_path(url)
        if path is not None and _foreign_sqlite(path):
            raise ConfigError(
                f"SQLite file {path!r} (URL {url!r} from {source}) holds tables but none "
                "of mainspring's: it is not a mainspring database, so nothing was added to it"
            )
        store = _open_unmigrated(url)
        try:
            before = store.stored_schema_version()
            after = store.migrate()  # a newer database: SchemaVersionError, exit 2
            backend = store.dialect
        finally:
            store.close()
    shown = redact_url(url)
    if as_json:
        print_json(
            {
                "backend": backend,
                "url": shown,
                "before": before,
                "after": after,
                "migrated": after != before,
            }
        )
        return
    if after == before:
        message = f"{shown}: schema version {after} is already the latest; nothing to migrate"
    else:
        message = f"{shown}: migrated the schema from version {before} to {after}"
    console().print(message, soft_wrap=True)


@db_commands.command("status")
def status(db: DbOption = None, app_spec: AppOption = None, as_json: JsonOption = False) -> None:
    """Show the database's backend, schema version and run counts. Changes nothing."""
    with cli_errors():
        url, source = database_url(db, app_spec)
        require_file(url, source)
        path = sqlite_path(url)
        foreign = path is not None and _foreign_sqlite(path)
        version, counts, backend = 0, None, SQLiteStore.dialect
        wal: tuple[int, int] | None = None
        if not foreign:  # another program's file is not even opened: that would set WAL
            store = _open_unmigrated(url)
            try:
                version = store.stored_schema_version()
                # Only a schema this mainspring knows is read further.
                counts = store.count_runs() if 0 < version <= SCHEMA_VERSION else None
                backend = store.dialect
                wal = store.wal_size()
            finally:
                store.close()
    state = _schema_state(foreign, version)
    ordered = None if counts is None else {s: counts[s] for s in _STATUSES if counts.get(s)}
    shown = redact_url(url)
    if as_json:
        print_json(
            {
                "backend": backend,
                "url": shown,
                "schema_version": version,
                "known_schema_version": SCHEMA_VERSION,
                "state": state,
                "runs": ordered,
                "total_runs": None if ordered is None else sum(ordered.values()),
                "wal_bytes": None if wal is None else wal[0],
                "wal_limit_bytes": None if wal is None else wal[1],
            }
        )
        return
    verdict = _verdict(state, version)
    facts: list[tuple[str, str | Text]] = [
        ("backend", backend),
        ("database", shown),
        (
            "schema",
            Text.assemble(f"version {version} (this mainspring: {SCHEMA_VERSION}), ", verdict),
        ),
        ("runs", _runs_line(ordered)),
    ]
    if wal is not None:
        facts.append(("wal", _wal_text(*wal)))
    out = console()
    width = max(len(label) for label, _ in facts)
    for label, value in facts:
        out.print(Text.assemble((label.ljust(width), "bold"), "  ", value))


def _schema_state(foreign: bool, version: int) -> SchemaState:
    if foreign:
        return "not_mainspring"
    if version > SCHEMA_VERSION:
        return "database_newer"
    if version < SCHEMA_VERSION:
        return "migration_pending"
    return "up_to_date"


def _verdict(state: SchemaState, version: int) -> Text:
    """What ``db status`` says of the schema, and what to do about it."""
    if state == "database_newer":
        return Text(
            "newer than this mainspring: refused (upgrade mainspring to use it)", style="bold red"
        )
    if state == "not_mainspring":
        return Text("not a mainspring database: it holds other tables", style="bold red")
    if version == 0:
        return Text("no mainspring tables yet: run mainspring db migrate", style="yellow")
    if state == "migration_pending":
        return Text("migration pending: run mainspring db migrate", style="yellow")
    return Text("up to date", style="green")


def _runs_line(ordered: dict[str, int] | None) -> str:
    if ordered is None:
        return "-"
    by_status = ", ".join(f"{n} {s}" for s, n in ordered.items())
    return f"{sum(ordered.values())} in all: {by_status}" if ordered else "none"


@db_commands.command("checkpoint")
def checkpoint(
    db: DbOption = None, app_spec: AppOption = None, as_json: JsonOption = False
) -> None:
    """Fold SQLite's write-ahead log into the database and truncate the -wal file.

    A read transaction left open (a sqlite3 shell, a backup) keeps SQLite from doing
    this by itself, and the -wal file grows with every commit; once it has ended, the
    next checkpoint shrinks the file back to its limit, and this does it at once. It
    waits for readers up to the busy timeout; workers can keep running.
    """
    with cli_errors():
        url, source = database_url(db, app_spec)
        require_file(url, source)
        store = _open_unmigrated(url)
        try:
            before = store.wal_size()
            after = store.checkpoint(wait=True)
        finally:
            store.close()
    shown = redact_url(url)
    if as_json:
        print_json(
            {
                "url": shown,
                "wal_bytes_before": None if before is None else before[0],
                "wal_bytes": None if after is None else after[0],
                "wal_limit_bytes": None if after is None else after[1],
                "held": after is not None and after[0] > 0,
            }
        )
    elif before is None or after is None:
        console().print(f"{shown}: no write-ahead log file to truncate (not SQLite)")
    elif after[0] > 0:
        console().print(
            f"{shown}: the write-ahead log is still {after[0] / 1e6:.1f} MB (was "
            f"{before[0] / 1e6:.1f} MB): a read transaction still uses it (an open sqlite3 "
            "shell, a backup); end it and run this again",
            soft_wrap=True,
        )
    else:
        console().print(
            f"{shown}: write-ahead log folded in and truncated ({before[0] / 1e6:.1f} MB -> 0)",
            soft_wrap=True,
        )
    if after is not None and after[0] > 0:
        raise typer.Exit(1)


_KEPT_SHOWN = 20  # kept runs listed in text (--json lists them all)


def prune(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            metavar="DURATION",
            help="Delete runs that finished longer ago than this: 30d, 12h, 90m, 45s.",
        ),
    ],
    db: DbOption = None,
    app_spec: AppOption = None,
    batch: Annotated[int, typer.Option(min=1, help="Runs deleted per transaction.")] = 500,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only count what would be deleted.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Delete finished runs older than a retention period, with their journals and signals.

    Only succeeded, failed and cancelled runs are deleted; queued, running, sleeping
    and waiting runs are never touched, however old, and neither is a finished run an
    unfinished one still needs (its parent or fork source, its children, a fork on
    the way of a running child's end): those are kept, and listed with why. Deletes
    in short batches, so workers can keep running.
    """
    with cli_errors():
        seconds = parse_duration(older_than)
        now = time.time()
        with open_app(db, app_spec) as app:
            result = app.store.prune(seconds, now, batch=batch, dry_run=dry_run)
            url = app.url
    cutoff = now - seconds
    if as_json:
        print_json(
            {
                "dry_run": dry_run,
                "older_than": older_than,
                "older_than_s": seconds,
                "cutoff": iso_time(cutoff),
                "runs": result.runs,
                "steps": result.steps,
                "signals": result.signals,
                "kept": [k.summary() for k in result.kept],
            }
        )
        return
    when = datetime.fromtimestamp(cutoff, UTC).strftime("%Y-%m-%d %H:%M:%S")
    age = f"finished before {when} UTC, older than {older_than}"
    what = (
        f"{_n(result.runs, 'finished run')} ({age}), with {_n(result.steps, 'journal row')}"
        f" and {_n(result.signals, 'signal')}"
    )
    if result.runs == 0:
        unneeded = " that no unfinished run needs" if result.kept else ""
        message = f"{redact_url(url)}: no runs {age}{unneeded}; nothing to delete"
    elif dry_run:
        message = f"{redact_url(url)}: would delete {what}; dry run, nothing was deleted"
    else:
        message = f"{redact_url(url)}: deleted {what}"
    out = console()
    out.print(message, soft_wrap=True)
    if result.kept:
        out.print(
            f"kept {_n(len(result.kept), 'finished run')} past the cut-off that unfinished"
            " runs still need:",
            soft_wrap=True,
        )
        for k in result.kept[:_KEPT_SHOWN]:
            out.print(f"  {k.run_id}: {k.describe()}", soft_wrap=True, highlight=False)
        if len(result.kept) > _KEPT_SHOWN:
            out.print(f"  ... and {len(result.kept) - _KEPT_SHOWN} more (--json lists them all)")


# -- helpers ------------------------------------------------------------------------------


def parse_duration(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``90m``, ``45s``, ``2w`` or a sum like ``1d12h``.

    Raises:
        ConfigError: not a duration.
    """
    compact = text.strip().lower()
    parts = _DURATION_PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ConfigError(
            f"--older-than {text!r} is not a duration: give a number and a unit, "
            "like 30d, 12h, 90m or 45s (units: s, m, h, d, w)"
        )
    return float(sum(float(n) * _UNITS[u] for n, u in parts))


def _foreign_sqlite(path: str) -> bool:
    """A SQLite file holding tables, none of them mainspring's: another program's database."""
    if not os.path.isfile(path):
        return False
    try:
        # Read-only: looking must not change another program's file.
        conn = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)
        try:
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return False  # not SQLite at all: opening the store says so
    return bool(names) and "ms_meta" not in names


def _open_unmigrated(url: str) -> Store:
    """Open the store the URL names without migrating it."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        return SQLiteStore.from_url(url, migrate=False)
    if scheme in ("postgresql", "postgres"):
        from ..storage.postgres import PostgresStore  # needs the [postgres] extra

        return PostgresStore(url, migrate=False)
    return open_store(url)  # an unknown scheme: open_store explains which ones it knows


def _wal_text(size: int, limit: int) -> str | Text:
    text = f"{size / 1e6:.1f} MB (truncated to {limit / 1e6:.1f} MB when it starts over)"
    if size <= limit:
        return text
    return Text(
        f"{text}: past its limit, a read transaction left open (a sqlite3 shell, a backup) "
        "keeps SQLite from checkpointing; end it, or run mainspring db checkpoint",
        style="yellow",
    )


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
