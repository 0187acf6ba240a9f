"""``mainspring db migrate / db status`` and ``mainspring prune``, on SQLite and PostgreSQL.

The prune tests journal real runs with ``await app.run(...)``: an App on a FakeClock
set 40 days back finishes the "old" runs, an App on the real clock the recent one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.cli._db import parse_duration
from mainspring.storage import SCHEMA_VERSION, SQLiteStore, open_store
from mainspring.storage import redact_url as redact

DAY = 86_400.0


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def _ok(*args: str) -> Result:
    result = _invoke(*args)
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def _json(*args: str) -> Any:
    return json.loads(_ok(*args, "--json").stdout)


def _error(*args: str) -> str:
    """The one ``error: ...`` line of a command that must fail with exit code 2."""
    result = _invoke(*args)
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""
    return lines[0]


def _sqlite_file(url: str) -> Path | None:
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:") else None


@pytest.fixture(autouse=True)
def _no_database_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MAINSPRING_DATABASE_URL", raising=False)


def _app(url: str, clock: ms.Clock | None = None) -> ms.App:
    app = ms.App(url, clock=clock, inline_wait_s=0.5, poll_interval_s=0.01)

    async def shout(text: str) -> str:
        return text.upper()

    async def explode() -> None:
        raise ValueError("boom")

    @app.workflow
    async def greet(ctx: ms.RunContext, name: str) -> str:
        return await ctx.step(shout, name)

    @app.workflow
    async def doomed(ctx: ms.RunContext) -> None:
        await ctx.step(explode, retry=ms.RetryPolicy.never())

    @app.workflow
    async def approval(ctx: ms.RunContext) -> str:
        await ctx.step(shout, "asking")
        decision: str = await ctx.wait_for("go")
        return decision

    return app


# -- prune ---------------------------------------------------------------------------------


@pytest.fixture
def journaled(db_url: str) -> Iterator[dict[str, str]]:
    """Runs of every kind: finished 40 days ago, finished now, unfinished and old."""
    old = _app(db_url, ms.FakeClock(start=time.time() - 40 * DAY))
    new = _app(db_url)

    async def journal() -> dict[str, str]:
        async def finish(app: ms.App, workflow: str, *args: Any, key: str) -> str:
            run_id = app.submit(workflow, *args, key=key).run_id
            with contextlib.suppress(ms.RunFailed):
                await app.run(workflow, *args, key=key)  # the same key: executes that run
            return run_id

        ids = {"ok": await finish(old, "greet", "ada", key="ok")}
        ids["failed"] = await finish(old, "doomed", key="failed")
        signalled = old.submit("approval", key="signalled").run_id
        old.signal(signalled, "go", "yes")  # stored before the wait, consumed by it
        ids["signalled"] = await finish(old, "approval", key="signalled")
        assert ids["signalled"] == signalled
        ids["waiting"] = old.submit("approval", key="waiting").run_id
        await old.worker().run(until_idle=True)
        old.signal(ids["waiting"], "other", 1)  # an unfinished run's signal
        ids["cancelled"] = old.submit("greet", "cy", key="cancelled").run_id
        assert old.cancel(ids["cancelled"]) == "cancelled"
        ids["queued"] = old.submit("greet", "bo", key="queued").run_id
        ids["recent"] = await finish(new, "greet", "eve", key="recent")
        return ids

    try:
        ids = asyncio.run(journal())
        statuses = {name: old.get_run(rid).status for name, rid in ids.items()}
        assert statuses == {
            "ok": "succeeded",
            "failed": "failed",
            "signalled": "succeeded",
            "waiting": "waiting",
            "cancelled": "cancelled",
            "queued": "queued",
            "recent": "succeeded",
        }
        yield ids
    finally:
        old.close()
        new.close()


OLD_FINISHED = ("ok", "failed", "signalled", "cancelled")
KEPT = ("waiting", "queued", "recent")


def test_prune_deletes_old_finished_runs_only(db_url: str, journaled: dict[str, str]) -> None:
    store = open_store(db_url)
    try:
        journals = {name: store.load_steps(rid) for name, rid in journaled.items()}
        steps = sum(len(journals[name]) for name in OLD_FINISHED)
        assert steps == 4  # ok 1, failed 1, signalled 2 (a step and the wait), cancelled 0

        dry = _json("prune", "--older-than", "30d", "--db", db_url, "--dry-run")
        assert (dry["dry_run"], dry["older_than"], dry["older_than_s"]) == (True, "30d", 30 * DAY)
        assert (dry["runs"], dry["steps"], dry["signals"]) == (4, steps, 1)
        assert dry["cutoff"].endswith("Z")
        assert len(store.list_runs()) == 7, "a dry run deleted something"

        out = _ok("prune", "--older-than", "30d", "--db", db_url, "--batch", "1").stdout
        assert "deleted 4 finished runs (finished before " in out
        assert f"older than 30d), with {steps} journal rows and 1 signal" in out

        left = {r.id for r in store.list_runs()}
        assert left == {journaled[name] for name in KEPT}
        for name in OLD_FINISHED:
            assert store.load_steps(journaled[name]) == []
            assert store.next_signal(journaled[name], "go") is None
        for name in KEPT:
            assert store.load_steps(journaled[name]) == journals[name]
        assert store.next_signal(journaled["waiting"], "other") is not None

        again = _ok("prune", "--older-than", "30d", "--db", db_url).stdout
        assert "no runs finished before" in again and "nothing to delete" in again
        # A shorter retention takes the recent run too, never the unfinished old ones.
        done = _json("prune", "--older-than", "0s", "--db", db_url)
        assert (done["runs"], done["signals"]) == (1, 0)
        assert store.count_runs() == {"waiting": 1, "queued": 1}
    finally:
        store.close()


def test_prune_dry_run_table(db_url: str, journaled: dict[str, str]) -> None:
    out = _ok("prune", "--older-than", "12h", "--dry-run", "--db", db_url).stdout
    assert "would delete 4 finished runs" in out and "dry run, nothing was deleted" in out
    status = _json("db", "status", "--db", db_url)
    assert status["total_runs"] == 7


@pytest.mark.parametrize("value", ["30x", "30", "d", "-5d", "1.d", "", "30 days"])
def test_prune_refuses_a_bad_duration(tmp_path: Path, value: str) -> None:
    url = f"sqlite:///{tmp_path / 'never.db'}"
    line = _error("prune", "--older-than", value, "--db", url)
    assert f"--older-than {value!r} is not a duration" in line
    assert "30d" in line
    assert not (tmp_path / "never.db").exists()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30d", 30 * DAY),
        ("12h", 43_200),
        ("90m", 5_400),
        ("45s", 45),
        ("2w", 14 * DAY),
        ("1d12h", 1.5 * DAY),
        (" 30D ", 30 * DAY),
        ("1.5h", 5_400),
        ("0s", 0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_prune_requires_older_than(tmp_path: Path) -> None:
    result = _invoke("prune", "--db", f"sqlite:///{tmp_path / 'x.db'}")
    assert result.exit_code == 2 and "--older-than" in result.output


def test_prune_and_status_refuse_a_missing_database_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "missing.db"
    url = f"sqlite:///{missing}"
    line = _error("prune", "--older-than", "30d", "--db", url)
    assert f"no database file {str(missing)!r}" in line and "--db" in line
    assert "no database file" in _error("db", "status", "--db", url)
    monkeypatch.setenv("MAINSPRING_DATABASE_URL", url)
    assert "from MAINSPRING_DATABASE_URL" in _error("prune", "--older-than", "1d")
    monkeypatch.delenv("MAINSPRING_DATABASE_URL")
    monkeypatch.chdir(tmp_path)
    assert "'sqlite:///mainspring.db' from the default" in _error("db", "status")
    assert not missing.exists() and not (tmp_path / "mainspring.db").exists()
    both = _error("db", "status", "--db", url, "--app", "x:app")
    assert "not both" in both


# -- db status and db migrate ------------------------------------------------------------


def test_migrate_then_status(db_url: str) -> None:
    path = _sqlite_file(db_url)
    if path is None:  # PostgreSQL: an empty database is reported, not changed
        status = _json("db", "status", "--db", db_url)
        assert status == {
            "backend": "postgresql",
            "url": db_url,
            "schema_version": 0,
            "known_schema_version": SCHEMA_VERSION,
            "state": "migration_pending",
            "runs": None,
            "total_runs": None,
            "wal_bytes": None,  # no write-ahead log file of ours (SQLite only)
            "wal_limit_bytes": None,
        }
        out = _ok("db", "status", "--db", db_url).stdout
        assert "no mainspring tables yet: run mainspring db migrate" in out
        assert _json("db", "status", "--db", db_url)["schema_version"] == 0
    else:
        assert "no database file" in _error("db", "status", "--db", db_url)

    migrated = _json("db", "migrate", "--db", db_url)
    backend = "sqlite" if path else "postgresql"
    assert migrated == {
        "backend": backend,
        "url": db_url,
        "before": 0,
        "after": SCHEMA_VERSION,
        "migrated": True,
    }
    again = _ok("db", "migrate", "--db", db_url).stdout
    assert f"schema version {SCHEMA_VERSION} is already the latest; nothing to migrate" in again

    status = _json("db", "status", "--db", db_url)
    assert (status["backend"], status["state"], status["runs"], status["total_runs"]) == (
        backend,
        "up_to_date",
        {},
        0,
    )
    app = _app(db_url)
    try:
        asyncio.run(app.run("greet", "ada"))
        app.submit("greet", "bo")
    finally:
        app.close()
    status = _json("db", "status", "--db", db_url)
    assert status["runs"] == {"queued": 1, "succeeded": 1} and status["total_runs"] == 2
    out = _ok("db", "status", "--db", db_url).stdout
    assert f"backend   {backend}" in out
    assert f"version {SCHEMA_VERSION} (this mainspring: {SCHEMA_VERSION}), up to date" in out
    assert "2 in all: 1 queued, 1 succeeded" in out


def test_status_does_not_migrate_and_migrate_refuses_a_newer_database(db_url: str) -> None:
    store = open_store(db_url)
    try:
        with store._write() as cur:
            cur.execute(
                "UPDATE ms_meta SET value = ? WHERE key = 'schema_version'",
                (str(SCHEMA_VERSION + 1),),
            )
    finally:
        store.close()
    status = _json("db", "status", "--db", db_url)
    assert status["schema_version"] == SCHEMA_VERSION + 1
    assert (status["state"], status["runs"]) == ("database_newer", None)
    out = _ok("db", "status", "--db", db_url).stdout
    assert "newer than this mainspring: refused" in out
    line = _error("db", "migrate", "--db", db_url)
    assert f"schema version {SCHEMA_VERSION + 1}" in line and "upgrade mainspring" in line


def test_status_reports_an_older_schema_without_migrating(db_url: str) -> None:
    store = open_store(db_url)
    try:
        with store._write() as cur:
            cur.execute("UPDATE ms_meta SET value = '0' WHERE key = 'schema_version'")
        status = _json("db", "status", "--db", db_url)
        assert (status["schema_version"], status["state"]) == (0, "migration_pending")
        assert store.stored_schema_version() == 0  # status changed nothing
    finally:
        store.close()


def test_status_through_the_app(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "db_status_app.py").write_text(
        f"import mainspring as ms\n\napp = ms.App({db_url!r})\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        migrated = _json("db", "migrate", "--app", "db_status_app:app")
        assert migrated["after"] == SCHEMA_VERSION
        assert _json("db", "status", "--app", "db_status_app:app")["state"] == "up_to_date"
        dry = _json("prune", "--older-than", "1d", "--app", "db_status_app:app", "--dry-run")
        assert dry["runs"] == 0
    finally:
        sys.modules.pop("db_status_app", None)


def test_another_programs_sqlite_file_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    url = f"sqlite:///{path}"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
        conn.commit()
    status = _json("db", "status", "--db", url)
    assert (status["state"], status["schema_version"], status["runs"]) == (
        "not_mainspring",
        0,
        None,
    )
    assert "not a mainspring database" in _ok("db", "status", "--db", url).stdout
    line = _error("db", "migrate", "--db", url)
    assert "not a mainspring database" in line and str(path) in line
    with contextlib.closing(sqlite3.connect(path)) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert (tables, mode) == ({"invoices"}, "delete")  # not even switched to WAL


def test_migrate_completes_a_file_whose_first_opening_was_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "half.db"
    store = SQLiteStore(path, migrate=False)
    assert store.stored_schema_version() == 0  # the file has a header and no tables
    store.close()
    assert path.stat().st_size > 0
    url = f"sqlite:///{path}"
    assert _json("db", "status", "--db", url)["state"] == "migration_pending"
    assert _json("db", "migrate", "--db", url)["after"] == SCHEMA_VERSION


def test_urls_are_printed_without_passwords() -> None:
    assert redact("sqlite:///a/b.db") == "sqlite:///a/b.db"
    assert redact("postgresql://ms:s3cr%40t@db:5432/prod") == "postgresql://ms:***@db:5432/prod"
    assert redact("postgresql://ms@db/prod?password=x&sslmode=require") == (
        "postgresql://ms@db/prod?password=***&sslmode=require"
    )
    assert redact("host=db password=s3cret dbname=prod") == "host=db password=*** dbname=prod"
