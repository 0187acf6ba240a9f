"""Queues: declared on the App, submitted to, and enforced by the store across
worker processes (the store's own rules are in the conformance suite,
mainspring/testing/_queue_conformance.py)."""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mainspring as ms
from mainspring.storage import FINISHED

ROOT = Path(__file__).resolve().parent
WORKER = (sys.executable, "-m", "mainspring", "worker", "apps.queue_app:app")


async def _record(ctx: ms.RunContext, label: str) -> str:
    return label


def test_submit_to_a_declared_queue(app: ms.App) -> None:
    emails = app.queues.add("emails", concurrency=10, per_key=1, rate=5.0)
    wf = app.workflow(_record)
    handle = app.submit(wf, "a", queue=emails, queue_key="customer-42", priority=5)
    run = app.get_run(handle.run_id)
    assert (run.queue, run.queue_key, run.priority) == ("emails", "customer-42", 5)
    by_name = app.get_run(app.submit(wf, "b", queue="emails").run_id)
    assert (by_name.queue, by_name.queue_key, by_name.priority) == ("emails", None, 0)
    plain = app.get_run(app.submit(wf, "c").run_id)
    assert (plain.queue, plain.queue_key, plain.priority) == (None, None, 0)
    [q] = app.queues.list()
    assert (q.name, q.concurrency, q.per_key, q.rate, q.burst, q.queued) == (
        "emails",
        10,
        1,
        5.0,
        1,
        2,
    )
    assert [r.id for r in app.list_runs(queue="emails")] == [by_name.id, run.id]


def test_queue_mistakes_are_named(app: ms.App) -> None:
    wf = app.workflow(_record)
    app.queues.add("emails", concurrency=2)
    with pytest.raises(ms.ConfigError, match="'emials' is not declared"):
        app.submit(wf, "a", queue="emials")
    with pytest.raises(ms.ConfigError, match="need a queue"):
        app.submit(wf, "a", priority=3)
    with pytest.raises(ms.ConfigError, match="already declared with other limits"):
        app.queues.add("emails", concurrency=3)
    assert app.queues.add("emails", concurrency=2).concurrency == 2  # the same again is fine
    with pytest.raises(ms.ConfigError, match="concurrency must be an int >= 1"):
        app.queues.add("other", concurrency=0)
    with pytest.raises(ms.ConfigError, match="rate must be"):
        app.queues.add("other", rate=-1.0)
    with pytest.raises(ms.ConfigError, match="priority must be an int"):
        app.submit(wf, "a", queue="emails", priority=1.5)  # type: ignore[arg-type]
    with pytest.raises(ms.ConfigError, match="queue_key must be a string"):
        app.submit(wf, "a", queue="emails", queue_key=42)  # type: ignore[arg-type]
    assert app.list_runs() == []


def test_one_worker_starts_a_queue_by_priority_one_at_a_time(app: ms.App) -> None:
    app.queues.add("serial", concurrency=1)
    order: list[str] = []

    async def note(ctx: ms.RunContext, label: str) -> str:
        order.append(label)
        await asyncio.sleep(0)
        return label

    wf = app.workflow(note, name="note")
    for label, priority in [("low", 0), ("high", 9), ("mid", 5), ("high2", 9)]:
        app.submit(wf, label, queue="serial", priority=priority)
    free = app.submit(wf, "free")
    asyncio.run(app.worker(concurrency=8).run(until_idle=True))
    # The run in no queue went beside them; the queue's, one at a time by priority.
    assert [x for x in order if x != "free"] == ["high", "high2", "mid", "low"]
    assert "free" in order
    assert app.get_run(free.run_id).status == "succeeded"


def test_a_run_waiting_for_a_person_gives_its_slot_back(app: ms.App) -> None:
    app.queues.add("serial", concurrency=1)

    async def asks(ctx: ms.RunContext) -> str:
        return str(await ctx.wait_for("go"))

    waiting = app.workflow(asks, name="asks")
    wf = app.workflow(_record, name="record")
    first = app.submit(waiting, queue="serial")
    second = app.submit(wf, "next", queue="serial")
    asyncio.run(app.worker(concurrency=4).run(until_idle=True))
    assert app.get_run(first.run_id).status == "waiting"
    assert app.get_run(second.run_id).status == "succeeded"
    app.signal(first.run_id, "go", "yes")
    asyncio.run(app.worker(concurrency=4).run(until_idle=True))
    assert app.get_run(first.run_id).status == "succeeded"


def test_the_rate_of_starts_follows_the_apps_clock(db_url: str) -> None:
    clock = ms.FakeClock()
    app = ms.App(db_url, clock=clock, poll_interval_s=0.01)
    try:
        app.queues.add("slow", rate=1.0)  # one start a second
        wf = app.workflow(_record, name="record")
        ids = [app.submit(wf, str(i), queue="slow").run_id for i in range(4)]

        def drain() -> int:
            """How many have run (one clock reading: their order among them is by id)."""
            asyncio.run(app.worker().run(until_idle=True))
            return sum(app.get_run(r).status == "succeeded" for r in ids)

        assert drain() == 1
        clock.advance(0.5)
        assert drain() == 1
        clock.advance(0.5)
        assert drain() == 2
        clock.advance(10)  # an idle spell banks no more than the burst (1)
        assert drain() == 3
        clock.advance(1)
        assert drain() == 4
    finally:
        app.close()


# -- two worker processes ----------------------------------------------------------------


def _workers(tmp: Path, url: str, n: int) -> list[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "MAINSPRING_DATABASE_URL": url,
        "MAINSPRING_TEST_LEDGER": str(tmp / "ledger.db"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    procs = []
    for i in range(n):
        with open(tmp / f"worker-{i}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [*WORKER, "--concurrency", "8"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs


def _wait_for(what: str, check: object, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_limits_hold_across_two_worker_processes(tmp_path: Path, db_url: str) -> None:
    saved = os.environ.get("MAINSPRING_DATABASE_URL")
    os.environ["MAINSPRING_DATABASE_URL"] = db_url
    try:
        import apps.queue_app

        module = importlib.reload(apps.queue_app)
        assert module.app.store.url  # opened on this test's database
    finally:
        if saved is None:
            os.environ.pop("MAINSPRING_DATABASE_URL", None)
        else:
            os.environ["MAINSPRING_DATABASE_URL"] = saved
    app = module.app
    # Waiting before the workers start: one at a time, by priority, whoever claims.
    priorities = [3, 9, 1, 9, 5, 0]
    serial = {
        app.submit(module.job, "serial", None, queue="serial", priority=p).run_id: p
        for p in priorities
    }
    procs = _workers(tmp_path, db_url, 2)
    try:
        _wait_for(
            "both workers to start",
            lambda: all(
                "started on" in (tmp_path / f"worker-{i}.log").read_text() for i in range(2)
            ),
        )
        keys = ["k0", "k1", "k2", None]
        ids = [
            app.submit(module.job, "limited", keys[i % 4], queue="limited", queue_key=keys[i % 4])
            for i in range(24)
        ]
        # Runs in no queue go on beside the queue, unlimited by it.
        free = [app.submit(module.job, "free", None) for _ in range(6)]

        def done() -> bool:
            every = [h.run_id for h in ids + free] + list(serial)
            return all(app.get_run(r).status in FINISHED for r in every)

        _wait_for("every run to finish", done)
        assert {app.get_run(h.run_id).status for h in ids + free} == {"succeeded"}
        app.close()
        ledger = sqlite3.connect(tmp_path / "ledger.db")
        peaks = dict(ledger.execute("SELECT what, n FROM peak").fetchall())
        started = [r for (r,) in ledger.execute("SELECT run FROM started ORDER BY rowid")]
        ledger.close()
        assert [serial[r] for r in started if r in serial] == sorted(priorities, reverse=True)
        assert peaks["serial"] == 1, peaks
        assert 1 <= peaks["limited"] <= 2, peaks
        assert peaks["limited:per_key"] == 1, peaks
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def test_queues_over_http(app: ms.App) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mainspring.server import create_app

    app.queues.add("emails", concurrency=3, per_key=1)
    app.workflow(_record, name="record")
    _, token = app.store.create_api_key("ops", ["read", "submit"], app.clock.now())
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(app, webhooks=False)) as c:
        body = {"workflow": "record", "args": ["a"], "queue": "emails", "queue_key": "c-1"}
        made = c.post("/runs", json={**body, "priority": 4}, headers=auth)
        assert made.status_code == 202, made.text
        run = c.get(made.json()["url"], headers=auth).json()
        assert (run["queue"], run["queue_key"], run["priority"]) == ("emails", "c-1", 4)
        bad = c.post("/runs", json={**body, "queue": "nope"}, headers=auth)
        assert bad.status_code == 422 and "'nope' is not declared" in bad.text
        c.post("/runs", json={"workflow": "record", "args": ["b"]}, headers=auth)
        listed = c.get("/runs", params={"queue": "emails"}, headers=auth).json()["runs"]
        assert [r["id"] for r in listed] == [run["id"]]
        assert c.get("/queues", headers=auth).json() == [
            {
                "name": "emails",
                "concurrency": 3,
                "per_key": 1,
                "rate": None,
                "burst": 1,
                "running": 0,
                "queued": 1,
                "waiting": 0,
                "retrying": 0,
            }
        ]


def test_queues_from_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from mainspring.cli import cli

    db = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("MAINSPRING_DATABASE_URL", db)
    import apps.queue_app

    importlib.reload(apps.queue_app)  # a fresh App: an earlier test closed its store

    def invoke(*args: str) -> str:
        result = CliRunner().invoke(cli, list(args))
        assert result.exit_code == 0, result.output
        return result.output

    made = json.loads(
        invoke(
            "submit",
            "apps.queue_app:app",
            "job",
            "--args",
            '["limited", "c-1"]',
            "--queue",
            "limited",
            "--queue-key",
            "c-1",
            "--priority",
            "3",
            "--json",
        )
    )
    assert made["queue"] == {"name": "limited", "key": "c-1", "priority": 3}
    invoke("submit", "apps.queue_app:app", "job", "--args", '["free", null]')
    listed = json.loads(invoke("runs", "--db", db, "--queue", "limited", "--json"))
    assert [r["id"] for r in listed["runs"]] == [made["id"]]
    assert "limited (key c-1, priority 3)" in invoke("runs", "--db", db)
    assert "limited (key c-1, priority 3)" in invoke("show", made["id"], "--db", db)
    summary = json.loads(invoke("queues", "--db", db, "--json"))
    assert summary["queues"] == [
        {
            "name": "limited",
            "concurrency": 2,
            "per_key": 1,
            "rate": None,
            "burst": 1,
            "running": 0,
            "queued": 1,
            "waiting": 0,
            "retrying": 0,
        }
    ]
    text = invoke("queues", "--db", db)
    assert "limited" in text and "concurrency" in text


def test_runs_of_an_older_schema_keep_running_in_no_queue(tmp_path: Path) -> None:
    from mainspring.storage import SQLiteStore
    from mainspring.storage._migrations import MIGRATIONS

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    ddl = {"float": "REAL", "autoid": "INTEGER PRIMARY KEY AUTOINCREMENT"}
    for version in range(1, 11):  # the schema as it was before queues
        sql = MIGRATIONS[version].format(**ddl, without_rowid=" WITHOUT ROWID")
        for statement in sql.split(";"):
            if statement.strip():
                conn.execute(statement)
    conn.execute("CREATE TABLE ms_meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO ms_meta VALUES ('schema_version', '10')")
    conn.execute(
        "INSERT INTO ms_runs (id, workflow, status, input, created_at, updated_at)"
        " VALUES ('old', 'wf', 'queued', '[]', 1, 1)"
    )
    conn.close()
    store = SQLiteStore(path)  # migrates
    try:
        run = store.get_run("old")
        assert run is not None and (run.queue, run.queue_key, run.priority) == (None, None, 0)
        [claimed] = store.claim(
            worker="w", now=10, lease_s=5, limit=4, workflows=["wf"], max_recoveries=3
        )
        assert claimed.id == "old" and store.queues() == []
    finally:
        store.close()
