"""A schedule can start its runs on a queue (``app.schedules.add(..., queue=...)``, the
decorator, a schedules file): the runs wait their turn within the queue's limits,
and every place that lists schedules shows the queue. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.testing import FakeClock

MONDAY_0850 = 1_767_603_000.0  # 2026-01-05T08:50:00Z


@pytest.fixture
def app(db_url: str) -> Iterator[ms.App]:
    application = ms.App(db_url, clock=FakeClock(start=MONDAY_0850), poll_interval_s=0.01)
    reports = application.queues.add("reports", concurrency=1)

    @application.workflow
    async def report(ctx: ms.RunContext, scope: str) -> str:
        return await ctx.step(lambda: f"report of {scope}", name="build")

    @application.schedules.add("0 9 * * *", queue=reports)  # the decorator form
    @application.workflow
    async def digest(ctx: ms.RunContext) -> str:
        return "digest"

    application.schedules.add("daily", "0 9 * * *", report, "all", queue="reports")
    yield application
    application.close()


def test_a_schedule_starts_its_runs_on_its_queue(app: ms.App) -> None:
    app.schedules.sync()
    # The queue's limits are in the store before anything was submitted to it.
    [queue] = app.queues.list()
    assert (queue.name, queue.concurrency) == ("reports", 1)
    assert {s.name: s.queue for s in app.schedules.list()} == {
        "daily": "reports",
        "digest": "reports",
    }
    app.clock.advance(600)  # type: ignore[attr-defined]
    started = app.schedules.tick()
    assert len(started) == 2
    assert {app.get_run(r).queue for r in started} == {"reports"}
    [queue] = app.queues.list()
    assert queue.queued == 2
    # Concurrency 1: the worker takes one at a time (a claim of two takes one).
    claimed = app.store.claim(
        worker="w", now=app.clock.now(), lease_s=30, limit=2, workflows=None, max_recoveries=3
    )
    assert len(claimed) == 1
    app.store.release(claimed[0].id, claimed[0].epoch, app.clock.now())
    asyncio.run(app.worker().run(until_idle=True))
    assert sorted(asyncio.run(app.result(r)) for r in started) == ["digest", "report of all"]


def test_a_changed_queue_is_a_changed_definition(app: ms.App) -> None:
    app.schedules.sync()
    app.queues.add("slow", concurrency=2)
    app.schedules.add("daily", "0 9 * * *", "report", "all", queue="slow")
    app.schedules.sync()
    assert app.schedules.get("daily").queue == "slow"
    app.schedules.add("daily", "0 9 * * *", "report", "all")  # no queue any more
    app.schedules.sync()
    assert app.schedules.get("daily").queue is None


def test_an_undeclared_queue_is_refused_at_once(app: ms.App, tmp_path: Path) -> None:
    with pytest.raises(ms.ConfigError, match="queue 'typo' is not declared in this App"):
        app.schedules.add("x", "0 9 * * *", "report", "all", queue="typo")
    bad = tmp_path / "bad.toml"
    bad.write_text('[[schedule]]\nname = "x"\ncron = "0 3 * * *"\nworkflow = "report"\nqueue = 3\n')
    with pytest.raises(ms.ConfigError, match="entry 1: 'queue' is a queue's name"):
        app.schedules.load(bad)


def test_a_schedules_file_names_the_queue_and_every_surface_shows_it(
    app: ms.App, tmp_path: Path
) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mainspring.server import create_app

    path = tmp_path / "schedules.toml"
    path.write_text(
        '[[schedule]]\nname = "nightly"\ncron = "0 3 * * *"\nworkflow = "report"\n'
        'args = ["night"]\nqueue = "reports"\n',
        encoding="utf-8",
    )
    [declared] = app.schedules.load(path)
    assert declared.queue == "reports"
    app.schedules.sync()
    runner = CliRunner()
    listed = json.loads(runner.invoke(cli, ["schedules", "list", "--db", app.url, "--json"]).output)
    assert {s["name"]: s["queue"] for s in listed} == dict.fromkeys(
        ("daily", "digest", "nightly"), "reports"
    )
    table = runner.invoke(cli, ["schedules", "list", "--db", app.url])
    assert "queue" in table.output and "reports" in table.output
    token = app.store.create_api_key("ops", ["read"], time.time())[1]
    with TestClient(create_app(app, webhooks=False)) as client:
        over_http = client.get("/schedules", headers={"X-API-Key": token}).json()
        assert {s["name"]: s["queue"] for s in over_http}["nightly"] == "reports"
        form = {"Origin": "http://testserver", "Content-Type": "application/x-www-form-urlencoded"}
        client.post("/ui/login", content=f"key={token}", headers=form)
        page = client.get("/ui/schedules").text
        assert "<th>queue</th>" in page and "<td>reports</td>" in page
