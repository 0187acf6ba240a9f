"""Schedules from the outside: the HTTP API (with its scopes), the CLI and the
dashboard list schedules and pause and resume them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.server import create_app
from mainspring.testing import FakeClock

MONDAY_0850 = 1_767_603_000.0  # 2026-01-05T08:50:00Z


@pytest.fixture
def app(db_url: str) -> Iterator[ms.App]:
    application = ms.App(db_url, clock=FakeClock(start=MONDAY_0850))

    @application.workflow
    async def report(ctx: ms.RunContext, scope: str) -> str:
        return scope

    application.schedules.add("standup", "0 9 * * 1-5", report, "team", tz="Europe/Paris")
    application.schedules.sync()
    yield application
    application.close()


def test_http_api_lists_pauses_and_resumes(app: ms.App) -> None:
    now = time.time()
    read = {"X-API-Key": app.store.create_api_key("dash", ["read"], now)[1]}
    admin = {"X-API-Key": app.store.create_api_key("ops", ["admin"], now)[1]}
    with TestClient(create_app(app, webhooks=False)) as client:
        (listed,) = client.get("/schedules", headers=read).json()
        assert listed == {
            "name": "standup",
            "cron": "0 9 * * 1-5",
            "tz": "Europe/Paris",
            "workflow": "report",
            "catch_up": "skip",
            "queue": None,
            "paused": False,
            # Monday 08:50 UTC is 09:50 in Paris: next is Tuesday 09:00 Paris, 08:00 UTC.
            "next_at": 1_767_686_400.0,  # 2026-01-06T08:00:00Z
            "last_at": None,
            "last_run": None,
        }
        refused = client.post("/schedules/standup/pause", headers=read)
        assert refused.status_code == 403 and "admin" in refused.json()["error"]["message"]
        paused = client.post("/schedules/standup/pause", headers=admin)
        assert paused.status_code == 200 and paused.json()["paused"] is True
        assert app.schedules.get("standup").paused
        resumed = client.post("/schedules/standup/resume", headers=admin).json()
        assert resumed["paused"] is False
        missing = client.post("/schedules/nope/pause", headers=admin)
        assert missing.status_code == 404
        assert missing.json()["error"] == {
            "type": "not_found",
            "message": "no schedule named 'nope'",
        }


def _cli(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args))
    return result


def test_cli_lists_pauses_and_resumes(app: ms.App) -> None:
    url = app.url
    listed = _cli("schedules", "list", "--db", url, "--json")
    assert listed.exit_code == 0, listed.output
    assert [s["name"] for s in json.loads(listed.output)] == ["standup"]
    table = _cli("schedules", "list", "--db", url)
    assert "standup" in table.output and "Europe/Paris" in table.output
    assert "active" in table.output
    paused = _cli("schedules", "pause", "standup", "--db", url)
    assert paused.exit_code == 0 and "schedule standup is paused" in paused.output
    assert app.schedules.get("standup").paused
    assert "paused" in _cli("schedules", "list", "--db", url).output
    resumed = _cli("schedules", "resume", "standup", "--db", url, "--json")
    assert resumed.exit_code == 0 and json.loads(resumed.output)["paused"] is False
    missing = _cli("schedules", "pause", "nope", "--db", url)
    assert missing.exit_code == 2
    assert "error: no schedule named 'nope'" in missing.output


_FORM = {"Origin": "http://testserver", "Content-Type": "application/x-www-form-urlencoded"}


def _login(client: TestClient, token: str) -> None:
    r = client.post("/ui/login", content=f"key={token}", headers=_FORM, follow_redirects=False)
    assert r.status_code == 303, r.text


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_dashboard_lists_schedules_with_pause_for_admins(app: ms.App) -> None:
    now = time.time()
    read_token = app.store.create_api_key("dash", ["read"], now)[1]
    admin_token = app.store.create_api_key("ops", ["admin"], now)[1]
    with TestClient(create_app(app, webhooks=False)) as client:
        _login(client, read_token)
        page = client.get("/ui/schedules").text
        assert 'id="schedule-standup"' in page and 'data-paused="no"' in page
        assert "<code>0 9 * * 1-5</code>" in page
        # The next time as the schedule's own zone reads it, and in UTC beside it.
        nxt = app.schedules.get("standup").next_at
        paris = datetime.fromtimestamp(nxt, ZoneInfo("Europe/Paris"))
        assert paris.strftime("%Y-%m-%d %H:%M %Z") in page and paris.hour == 9
        assert datetime.fromtimestamp(nxt, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") in page
        assert 'data-action="pause"' not in page  # a read key sees no buttons
        assert "needs a key with the admin scope" in page
        client.post("/ui/logout", headers=_FORM)
        _login(client, admin_token)
        assert 'data-action="pause"' in client.get("/ui/schedules").text
        # What the button does: the API call, authenticated by the session cookie.
        clicked = client.post(
            "/schedules/standup/pause", json={}, headers={"Origin": "http://testserver"}
        )
        assert clicked.status_code == 200, clicked.text
        page = client.get("/ui/schedules").text
        assert 'data-paused="yes"' in page and 'data-action="resume"' in page
        assert 'href="/ui/schedules"' in client.get("/ui/").text  # linked from every page
        # A run a schedule started says so on its page.
        app.schedules.resume("standup")
        app.clock.advance(app.schedules.get("standup").next_at - app.clock.now())  # type: ignore[attr-defined]
        (run_id,) = app.schedules.tick()
        run_page = client.get(f"/ui/runs/{run_id}").text
        assert "started by the" in run_page
        assert "<code>standup</code> (schedule:standup:2026-01-06T08:00:00Z)" in run_page
        shown = client.get(f"/runs/{run_id}", headers={"X-API-Key": admin_token}).json()
        assert shown["schedule"] == "standup"
        assert shown["key"] == "schedule:standup:2026-01-06T08:00:00Z"
        cli_shown = _cli("show", run_id, "--db", app.url)
        assert "schedule" in cli_shown.output and "standup" in cli_shown.output


def _worker(where: Path, schedules: str) -> subprocess.CompletedProcess[str]:
    command = ["worker", "sched_app:app", "--schedules", schedules, "--until-idle"]
    return subprocess.run(
        [sys.executable, "-m", "mainspring", *command],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_worker_command_loads_a_schedules_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    (tmp_path / "sched_app.py").write_text(
        "import mainspring as ms\n"
        f"app = ms.App({url!r})\n"
        "@app.workflow\n"
        "async def report(ctx, scope: str) -> str:\n"
        "    return scope\n",
        encoding="utf-8",
    )
    (tmp_path / "schedules.toml").write_text(
        '[[schedule]]\nname = "nightly"\ncron = "0 3 * * *"\nworkflow = "report"\n'
        'args = ["all"]\ntz = "Europe/Paris"\ncatch_up = "once"\n',
        encoding="utf-8",
    )
    done = _worker(tmp_path, "schedules.toml")
    assert done.returncode == 0, done.stderr
    (stored,) = json.loads(_cli("schedules", "list", "--db", url, "--json").output)
    assert stored["name"] == "nightly" and stored["tz"] == "Europe/Paris"
    assert stored["catch_up"] == "once" and stored["workflow"] == "report"
    (tmp_path / "bad.toml").write_text('[[schedule]]\nname = "x"\ncron = "0 3 * *"\n')
    bad = _worker(tmp_path, "bad.toml")
    assert bad.returncode == 2
    assert "bad.toml', entry 1: 'workflow' is required" in bad.stderr
