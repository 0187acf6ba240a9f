"""The operator commands: submit, runs, show, signal, cancel.

Each test gets a real SQLite file journaled by real runs of a small app module
(written into tmp_path): succeeded, failed, retried, waiting for a signal, sleeping,
spanning two sessions, and queued.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli

MODULE = "cli_runs_app"
APP_SOURCE = """
from pathlib import Path

import mainspring as ms

URL = f"sqlite:///{Path(__file__).with_name('runs.db')}"
clock = ms.FakeClock(start=1_714_996_800.0)  # 2024-05-06T12:00:00Z
app = ms.App(
    URL,
    clock=clock,
    inline_wait_s=0.5,
    poll_interval_s=0.01,
    default_retry=ms.RetryPolicy(max_attempts=3, initial_s=0.0, jitter=False),
)
live = ms.App(URL, poll_interval_s=0.01)  # the real clock, for "today" times
tries = {"fetch": 0}


async def shout(text: str) -> str:
    clock.advance(0.012)
    return text.upper()


async def explode(n: int) -> None:
    raise ValueError(f"boom [n={n}]")


async def fetch() -> dict:
    tries["fetch"] += 1
    clock.advance(3.4)
    if tries["fetch"] < 3:
        raise ConnectionError(f"flaky attempt {tries['fetch']}")
    return {"rows": list(range(40))}


@app.workflow
async def greet(ctx: ms.RunContext, name: str, punctuation: str = "!") -> str:
    return await ctx.step(shout, name) + punctuation


@app.workflow
async def doomed(ctx: ms.RunContext, n: int) -> None:
    await ctx.step(explode, n, retry=ms.RetryPolicy.never())


@app.workflow
async def flaky(ctx: ms.RunContext) -> int:
    data = await ctx.step(fetch)
    return len(data["rows"])


@app.workflow
async def approval(ctx: ms.RunContext, order: int) -> str:
    await ctx.step(shout, f"order {order}")
    decision = await ctx.wait_for("approve")
    return f"approved by {decision['by']}"


@app.workflow
async def nap(ctx: ms.RunContext) -> None:
    await ctx.sleep(3600)


@app.workflow
async def chapters(ctx: ms.RunContext) -> str:
    if ctx.session == 0:
        await ctx.step(shout, "one")
        ctx.continue_as_new({"done": 1})
    await ctx.step(shout, "two")
    return "both"


@live.workflow
async def ping(ctx: ms.RunContext) -> str:
    return "pong"
"""


@dataclass
class Runs:
    """The ids of the journaled runs, and the app module."""

    mod: ModuleType
    greet: str
    doomed: str
    flaky: str
    chapters: str
    approval: str
    nap: str
    queued: str


async def _journal(mod: ModuleType) -> dict[str, str]:
    app: ms.App = mod.app

    async def run(wf: Any, *args: Any, key: str) -> str:
        handle = app.submit(wf, *args, key=key)
        await app.run(wf, *args, key=key)  # the same key: executes that run here
        return handle.run_id

    greet = await run(mod.greet, "ada", key="greet-ada")
    with pytest.raises(ms.RunFailed):
        await run(mod.doomed, 3, key="doomed-3")
    flaky = await run(mod.flaky, key="flaky")
    chapters = await run(mod.chapters, key="chapters")
    waiting = app.submit(mod.approval, 7, key="order-7").run_id
    sleeping = app.submit(mod.nap).run_id
    await app.worker(concurrency=4).run(until_idle=True)
    queued = app.submit(mod.greet, "bob").run_id
    doomed = app.submit(mod.doomed, 3, key="doomed-3").run_id
    return {
        "greet": greet,
        "doomed": doomed,
        "flaky": flaky,
        "chapters": chapters,
        "approval": waiting,
        "nap": sleeping,
        "queued": queued,
    }


def _import_app(directory: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(directory))
    sys.modules.pop(MODULE, None)
    return importlib.import_module(MODULE)


def _close(mod: ModuleType) -> None:
    mod.app.close()
    mod.live.close()
    sys.modules.pop(MODULE, None)


@pytest.fixture(scope="module")
def journaled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the app module and its database, journaled once."""
    directory = tmp_path_factory.mktemp("journaled")
    (directory / f"{MODULE}.py").write_text(APP_SOURCE)
    with pytest.MonkeyPatch.context() as monkeypatch:
        mod = _import_app(directory, monkeypatch)
        try:
            ids = asyncio.run(_journal(mod))
        finally:
            _close(mod)
    (directory / "ids.json").write_text(json.dumps(ids))
    return directory


@pytest.fixture
def runs(journaled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runs]:
    """A fresh copy of the journaled database, and the app module next to it."""
    for var in ("MAINSPRING_DATABASE_URL", "FORCE_COLOR", "COLUMNS", "TTY_COMPATIBLE"):
        monkeypatch.delenv(var, raising=False)
    for name in (f"{MODULE}.py", "runs.db", "runs.db-wal", "runs.db-shm"):
        if (journaled / name).exists():
            shutil.copy(journaled / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    mod = _import_app(tmp_path, monkeypatch)
    try:
        yield Runs(mod, **json.loads((journaled / "ids.json").read_text()))
    finally:
        _close(mod)


@pytest.fixture
def db(runs: Runs) -> str:
    return str(runs.mod.URL)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def ok(*args: str) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def fails(*args: str) -> str:
    """Run a command that must fail like a usage error; return its one-line message."""
    result = invoke(*args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def as_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json"))


def iso(text: str) -> datetime:
    return datetime.fromisoformat(text)


# -- runs ----------------------------------------------------------------------------------


def test_runs_json_gives_each_runs_status_current_step_and_wait(runs: Runs, db: str) -> None:
    listing = as_json("runs", "--db", db)
    by_id = {r["id"]: r for r in listing["runs"]}

    assert {rid: r["status"] for rid, r in by_id.items()} == {
        runs.greet: "succeeded",
        runs.doomed: "failed",
        runs.flaky: "succeeded",
        runs.chapters: "succeeded",
        runs.approval: "waiting",
        runs.nap: "sleeping",
        runs.queued: "queued",
    }
    assert listing["counts"] == {
        "queued": 1,
        "sleeping": 1,
        "waiting": 1,
        "succeeded": 3,
        "failed": 1,
    }
    assert listing["runs"][0]["id"] == runs.queued  # newest first

    greet = by_id[runs.greet]
    assert greet["input"] == {"args": ["ada"], "kwargs": {}}
    assert greet["output"] == "ADA!"
    assert greet["key"] == "greet-ada"
    assert greet["created_at"] == "2024-05-06T12:00:00.000Z"
    assert greet["current_step"] == {
        "session": 0,
        "seq": 0,
        "kind": "step",
        "name": "shout",
        "status": "completed",
        "attempts": 1,
    }

    doomed = by_id[runs.doomed]
    assert doomed["error"]["type"] == "mainspring._errors.StepFailed"
    assert "ValueError: boom [n=3]" in doomed["error"]["message"]
    assert doomed["current_step"]["status"] == "failed"

    waiting = by_id[runs.approval]
    assert waiting["wait_reason"] == "signal:approve"
    assert waiting["current_step"]["kind"] == "signal"
    assert waiting["current_step"]["name"] == "approve"

    sleeping = by_id[runs.nap]
    assert sleeping["wait_reason"] == "sleep"
    # An hour after it went to sleep (other runs' steps may move the shared FakeClock
    # by a few ms between the sleep and the commit that records it).
    assert abs((iso(sleeping["wake_at"]) - iso(sleeping["updated_at"])).total_seconds() - 3600) < 1

    assert by_id[runs.chapters]["session"] == 1
    assert by_id[runs.chapters]["handoff"] == {"done": 1}
    assert by_id[runs.queued]["current_step"] is None


def test_runs_table_shows_ids_statuses_steps_and_counts(runs: Runs, db: str) -> None:
    out = ok("runs", "--db", db)
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}

    assert "succeeded" in rows[runs.greet] and "0 shout" in rows[runs.greet]
    assert "failed" in rows[runs.doomed] and "0 explode (failed)" in rows[runs.doomed]
    assert "1 signal approve" in rows[runs.approval]
    assert "signal:approve" in rows[runs.approval]
    assert "sleep, wakes 2024-05-06 13:00:" in rows[runs.nap]
    assert "2024-05-06 12:00:00" in rows[runs.greet]  # not today: the date is shown
    assert "7 shown · 7 runs in all: 1 queued, 1 sleeping, 1 waiting, 3 succeeded, 1 failed" in out


def test_runs_filters_by_status_and_workflow_and_pages(runs: Runs, db: str) -> None:
    def ids(*options: str) -> list[str]:
        return [r["id"] for r in as_json("runs", "--db", db, *options)["runs"]]

    assert sorted(ids("--status", "failed", "--status", "waiting")) == sorted(
        [runs.doomed, runs.approval]
    )
    assert sorted(ids("--status", "sleeping,queued")) == sorted([runs.nap, runs.queued])
    assert sorted(ids("--workflow", "greet")) == sorted([runs.greet, runs.queued])
    everything = ids()
    assert ids("--limit", "2") == everything[:2]
    assert ids("--limit", "2", "--offset", "2") == everything[2:4]
    assert "more with --offset 2" in ok("runs", "--db", db, "--limit", "2")
    assert "no runs match" in ok("runs", "--db", db, "--workflow", "nobody")


def test_runs_rejects_an_unknown_status(runs: Runs, db: str) -> None:
    assert "unknown status 'done'" in fails("runs", "--db", db, "--status", "done")


def test_times_of_today_show_the_clock_time_only(runs: Runs, db: str) -> None:
    run_id = as_json("submit", f"{MODULE}:live", "ping")["id"]
    row = next(line for line in ok("runs", "--db", db).splitlines() if line.startswith(run_id))
    assert datetime.now(UTC).strftime("%Y-%m-%d") not in row
    assert len(re.findall(r"  \d\d:\d\d:\d\d  ", row)) == 2  # created and updated


# -- show ------------------------------------------------------------------------------------


def test_show_json_of_a_retried_step(runs: Runs, db: str) -> None:
    shown = as_json("show", runs.flaky, "--db", db)

    assert shown["run"]["status"] == "succeeded"
    assert shown["run"]["output"] == 40
    [step] = shown["steps"]
    assert step["name"] == "fetch"
    assert step["status"] == "completed"
    assert step["attempts"] == 3
    assert step["output"] == {"rows": list(range(40))}
    assert step["duration_s"] == pytest.approx(3.4)
    assert iso(step["finished_at"]) > iso(step["started_at"])


def test_show_of_a_failed_run_names_the_error_and_the_step(runs: Runs, db: str) -> None:
    out = ok("show", runs.doomed, "--db", db)

    assert runs.doomed in out
    assert "status       failed" in out
    assert "key          doomed-3" in out
    assert 'input        {"args":[3],"kwargs":{}}' in out
    error_line = next(line for line in out.splitlines() if line.startswith("error"))
    assert "StepFailed: step 'explode' failed after 1 attempt(s): ValueError: boom [n=3]" in (
        error_line
    )
    step_row = next(line for line in out.splitlines() if " explode " in line)
    assert step_row.split()[:5] == ["0", "step", "explode", "failed", "1"]
    assert "ValueError: boom [n=3]" in step_row
    assert "Traceback" not in out


def test_show_verbose_prints_the_stored_traceback(runs: Runs, db: str) -> None:
    out = ok("show", runs.doomed, "--db", db, "--verbose")
    assert "run error traceback:" in out
    assert 'raise ValueError(f"boom [n={n}]")' in out


def test_show_summarises_outputs_and_durations(runs: Runs, db: str) -> None:
    flaky = ok("show", runs.flaky, "--db", db)
    row = next(line for line in flaky.splitlines() if " fetch " in line)
    assert row.split()[:5] == ["0", "step", "fetch", "completed", "3"]
    assert '{"rows":[0,1,2,3,' in row and "…" in row  # JSON cut to about 80 characters
    assert row.rstrip().endswith("3.4s")
    assert "result       40" in flaky

    greet = ok("show", runs.greet, "--db", db)
    assert 'result       "ADA!"' in greet
    assert next(line for line in greet.splitlines() if " shout " in line).endswith("12ms")


def test_show_of_a_waiting_run_gives_its_wait(runs: Runs, db: str) -> None:
    out = ok("show", runs.approval, "--db", db)
    assert "status       waiting" in out
    assert "waiting on   signal:approve" in out
    wait_row = next(line for line in out.splitlines() if " approve " in line)
    assert wait_row.split()[:4] == ["1", "signal", "approve", "started"]


def test_show_groups_steps_by_session(runs: Runs, db: str) -> None:
    out = ok("show", runs.chapters, "--db", db)
    lines = out.splitlines()
    first, second = lines.index("session 0"), lines.index("session 1")
    assert first < second
    assert any('"ONE"' in line for line in lines[first:second])
    assert any('"TWO"' in line for line in lines[second:])
    assert 'hand-off     {"done":1}' in out

    steps = as_json("show", runs.chapters, "--db", db)["steps"]
    assert [(s["session"], s["seq"], s["output"]) for s in steps] == [(0, 0, "ONE"), (1, 0, "TWO")]


def test_show_of_an_unknown_run(runs: Runs, db: str) -> None:
    message = fails("show", "no-such-run", "--db", db)
    assert "no run 'no-such-run'" in message


# -- signal and cancel ----------------------------------------------------------------------


def test_signal_resumes_a_waiting_run(runs: Runs, db: str) -> None:
    out = ok("signal", runs.approval, "approve", '{"by": "ana"}', "--db", db)
    assert f"sent signal 'approve' to run {runs.approval}" in out
    assert "was waiting for it" in out

    # The CLI stamps the wake-up with the real clock; the app's fake one must catch up.
    runs.mod.clock.advance(time.time() - runs.mod.clock.now())

    async def finish() -> Any:
        await runs.mod.app.worker().run(until_idle=True)
        return await runs.mod.app.result(runs.approval, timeout=5)

    assert asyncio.run(finish()) == "approved by ana"
    shown = as_json("show", runs.approval, "--db", db)
    assert shown["run"]["status"] == "succeeded"
    assert shown["steps"][1]["output"] == {"signal": {"by": "ana"}}


def test_signal_is_kept_for_a_run_not_waiting_for_it(runs: Runs, db: str) -> None:
    sent = as_json("signal", runs.nap, "later", "--db", db)
    assert sent["status"] == "sleeping"
    assert isinstance(sent["signal_id"], int)
    assert "takes the signal when it waits for 'later'" in ok(
        "signal", runs.nap, "later", "3", "--db", db
    )


def test_signal_errors(runs: Runs, db: str) -> None:
    assert "PAYLOAD-JSON '{by: ana}' is not valid JSON" in fails(
        "signal", runs.approval, "approve", "{by: ana}", "--db", db
    )
    assert "no run 'nope'" in fails("signal", "nope", "approve", "--db", db)
    assert f"run {runs.greet!r} is already succeeded" in fails(
        "signal", runs.greet, "approve", "--db", db
    )


def test_cancel_a_waiting_run_with_a_reason(runs: Runs, db: str) -> None:
    out = ok("cancel", runs.approval, "--reason", "order withdrawn", "--db", db)
    assert out.strip() == f"run {runs.approval}: cancelled (was waiting)"

    run = as_json("show", runs.approval, "--db", db)["run"]
    assert run["status"] == "cancelled"
    assert run["error"] == {"type": "Cancelled", "message": "order withdrawn"}
    assert run["wait_reason"] is None

    again = ok("cancel", runs.approval, "--db", db)
    assert "is already cancelled: nothing to cancel" in again
    assert as_json("cancel", runs.greet, "--db", db) == {
        "run_id": runs.greet,
        "previous_status": "succeeded",
        "status": "succeeded",
    }


def test_cancel_a_running_run_asks_its_worker(runs: Runs, db: str) -> None:
    app: ms.App = runs.mod.app
    claimed = app.store.claim(
        worker="elsewhere",
        now=app.clock.now(),
        lease_s=60,
        limit=1,
        workflows=None,
        max_recoveries=5,
        run_id=runs.queued,
    )
    assert [r.id for r in claimed] == [runs.queued]

    out = ok("cancel", runs.queued, "--db", db)
    assert out.strip() == (
        f"run {runs.queued}: cancelling (its worker will stop it at the next step)"
    )
    row = next(line for line in ok("runs", "--db", db).splitlines() if runs.queued in line)
    assert "running (cancel requested)" in row
    assert "owner elsewhere" in ok("show", runs.queued, "--db", db)


def test_cancel_an_unknown_run(runs: Runs, db: str) -> None:
    assert "no run 'nope'" in fails("cancel", "nope", "--db", db)


# -- submit ---------------------------------------------------------------------------------


def test_submit_creates_a_run_and_a_key_makes_it_idempotent(runs: Runs, db: str) -> None:
    spec = f"{MODULE}:app"
    out = ok("submit", spec, "greet", "--args", '["cy"]', "--kwargs", '{"punctuation": "?"}')
    assert out.startswith("submitted run ")
    run_id = out.split()[2]
    run = as_json("show", run_id, "--db", db)["run"]
    assert run["status"] == "queued"
    assert run["input"] == {"args": ["cy"], "kwargs": {"punctuation": "?"}}

    first = as_json("submit", spec, "greet", "--args", '["dee"]', "--key", "dee-1")
    second = as_json("submit", spec, "greet", "--args", '["dee"]', "--key", "dee-1")
    assert first["created"] is True
    assert second["created"] is False
    assert second["id"] == first["id"]
    assert second["status"] == "queued"

    existing = ok("submit", spec, "doomed", "--args", "[3]", "--key", "doomed-3")
    assert f"run {runs.doomed} already exists with key 'doomed-3'" in existing
    assert "failed" in existing


def test_submitted_run_is_executed_by_a_worker(runs: Runs, db: str) -> None:
    run_id = as_json("submit", f"{MODULE}:app", "greet", "--kwargs", '{"name": "eve"}')["id"]

    async def work() -> Any:
        await runs.mod.app.worker().run(until_idle=True)
        return await runs.mod.app.result(run_id, timeout=5)

    assert asyncio.run(work()) == "EVE!"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["greet", "--args", "[1,"], "--args '[1,' is not valid JSON"),
        (["greet", "--args", '{"name": "x"}'], '--args \'{"name": "x"}\' must be a JSON array'),
        (["greet", "--kwargs", '["x"]'], "--kwargs '[\"x\"]' must be a JSON object"),
        (
            ["greet", "--args", '["a", "b", "c"]'],
            "workflow 'greet' cannot take args=('a', 'b', 'c')",
        ),
        (["greet"], "missing a required argument: 'name'"),
        (
            ["doomed", "--args", '["three"]'],
            "'three' is not a valid int",
        ),
        (["nosuch"], "no workflow named 'nosuch' is registered"),
        (["doomed", "--args", "[1]", "--key", "greet-ada"], "key 'greet-ada' already names"),
    ],
)
def test_submit_errors(runs: Runs, db: str, options: list[str], expected: str) -> None:
    before = as_json("runs", "--db", db)["counts"]
    assert expected in fails("submit", f"{MODULE}:app", *options)
    assert as_json("runs", "--db", db)["counts"] == before  # nothing was submitted


def test_submit_with_a_bad_app_spec(runs: Runs) -> None:
    assert "'nowhere:app'" in fails("submit", "nowhere:app", "greet")


# -- choosing the database ------------------------------------------------------------------


def test_a_missing_database_file_is_an_error_not_a_new_file(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here.db"
    for command in (["runs"], ["show", "abc"], ["signal", "abc", "go"], ["cancel", "abc"]):
        message = fails(*command, "--db", f"sqlite:///{missing}")
        assert f"no database file {str(missing)!r}" in message
    assert not missing.exists()


def test_the_default_database_is_mainspring_db(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MAINSPRING_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    assert "no database file 'mainspring.db'" in fails("runs")
    assert not (tmp_path / "mainspring.db").exists()


def test_a_file_that_is_not_a_mainspring_database(tmp_path: Path) -> None:
    notes = tmp_path / "notes.db"
    notes.write_text("just some notes\n")
    message = fails("runs", "--db", f"sqlite:///{notes}")
    assert "notes.db" in message and "is it a mainspring database" in message


def test_the_environment_and_the_app_choose_the_database(
    runs: Runs, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    by_app = as_json("runs", "--app", f"{MODULE}:app")["runs"]
    assert len(by_app) == 7
    monkeypatch.setenv("MAINSPRING_DATABASE_URL", db)
    assert as_json("runs")["runs"] == by_app
    assert as_json("show", runs.greet)["run"]["output"] == "ADA!"
    assert "give --db or --app, not both" in fails("runs", "--db", db, "--app", f"{MODULE}:app")


def test_json_output_is_the_only_thing_on_stdout(runs: Runs, db: str) -> None:
    for command in (["runs"], ["show", runs.doomed], ["signal", runs.nap, "x"]):
        result = invoke(*command, "--db", db, "--json")
        assert result.exit_code == 0
        json.loads(result.stdout)


def test_runs_show_when_a_run_last_did_something_not_only_its_status(tmp_path: Path) -> None:
    # A running run's steps commit without touching its row: the listing's activity
    # time follows its newest journal row, not the claim that last changed the status.
    from mainspring.storage import RunWrite, SQLiteStore, StepRecord

    path = tmp_path / "active.db"
    store = SQLiteStore(path)
    t0 = 1_714_996_800.0  # 2024-05-06 12:00:00 UTC
    store.create_run(run_id="r1", workflow="wf", input="[[],{}]", key=None, now=t0)
    [run] = store.claim(worker="w", now=t0, lease_s=60, limit=1, workflows=None, max_recoveries=3)
    step = StepRecord(
        run_id="r1", session=0, seq=0, kind="step", name="work", status="completed",
        attempt=1, epoch=run.epoch, output="1", started_at=t0 + 95, finished_at=t0 + 100,
    )  # fmt: skip
    [result] = store.commit([RunWrite(run_id="r1", epoch=run.epoch, steps=[step])], t0 + 100)
    assert result.ok
    store.close()
    [listed] = as_json("runs", "--db", f"sqlite:///{path}")["runs"]
    assert listed["updated_at"] == "2024-05-06T12:00:00.000Z"  # the claim
    assert listed["active_at"] == "2024-05-06T12:01:40.000Z"  # the step, 100 s later
    assert "12:01:40" in ok("runs", "--db", f"sqlite:///{path}")
