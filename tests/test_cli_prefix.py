"""Operating long runs from the shell: run ids abbreviated as git abbreviates commits,
and ``tail --json`` for a pipe."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli

runner = CliRunner()


def _app(tmp_path: Path) -> tuple[ms.App, str]:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    app = ms.App(url)

    @app.workflow
    async def hello(ctx: ms.RunContext, who: str) -> str:
        return f"hello {who}"

    return app, url


def test_a_unique_prefix_names_a_run(tmp_path: Path) -> None:
    app, url = _app(tmp_path)
    runs = [app.submit("hello", str(i)) for i in range(3)]
    asyncio.run(app.worker().run(until_idle=True))
    ids = [r.run_id for r in runs]
    target = ids[0]
    prefix = next(  # the shortest prefix no other id shares
        target[:n] for n in range(1, 33) if not any(i.startswith(target[:n]) for i in ids[1:])
    )
    shown = runner.invoke(cli, ["show", prefix, "--json", "--db", url])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["run"]["id"] == target
    for command in (["trace", prefix, "--json"], ["doctor", prefix, "--json"]):
        done = runner.invoke(cli, [*command, "--db", url])
        assert done.exit_code == 0, done.output
    assert app.resolve_run_id(target) == target
    with pytest.raises(ms.RunNotFound, match=r"no run 'zz' .*nor one whose id starts with it"):
        app.resolve_run_id("zz")
    app.close()


def test_an_ambiguous_prefix_is_a_clear_error(tmp_path: Path) -> None:
    app, url = _app(tmp_path)
    ids = [app.submit("hello", str(i)).run_id for i in range(40)]
    # Among 40 hex ids, two share a first character.
    shared = next(c for c in "0123456789abcdef" if sum(i.startswith(c) for i in ids) > 1)
    done = runner.invoke(cli, ["show", shared, "--db", url])
    assert done.exit_code == 2
    assert f"{shared!r} is the start of several run ids" in done.output
    assert "give more of it" in done.output
    app.close()


def test_tail_json_prints_a_line_per_change(tmp_path: Path) -> None:
    app, url = _app(tmp_path)
    run = app.submit("hello", "ana")
    asyncio.run(app.worker().run(until_idle=True))
    done = runner.invoke(cli, ["tail", run.run_id[:12], "--json", "--db", url])
    assert done.exit_code == 0, done.output
    [line] = [json.loads(x) for x in done.stdout.splitlines()]
    assert line["run_id"] == run.run_id and line["status"] == "succeeded"
    assert line["steps"] == 0 and "cost_usd" in line
    app.close()


def test_a_run_about_to_be_claimed_is_due_now_not_1970(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'due.db'}"
    app = ms.App(url)

    @app.workflow
    async def gate(ctx: ms.RunContext) -> str:
        return str(await ctx.wait_for("go"))

    run = app.submit(gate)
    asyncio.run(app.worker().run(until_idle=True))
    app.signal(run.run_id, "go", "now")  # the run is due: no worker has claimed it yet
    listed = runner.invoke(cli, ["runs", "--db", url], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    assert "due now" in listed.stdout and "1970" not in listed.stdout
    app.close()


def test_show_verbose_never_cuts_a_value(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'long.db'}"
    app = ms.App(url)
    long = "x" * 150 + "-THE-END"

    def make() -> str:
        return long

    @app.workflow
    async def big(ctx: ms.RunContext) -> str:
        return str(await ctx.step(make))

    run = app.submit(big)
    asyncio.run(app.worker().run(until_idle=True))
    env = {"COLUMNS": "100"}
    short = runner.invoke(cli, ["show", run.run_id, "--db", url], env=env)
    assert short.exit_code == 0, short.output
    assert "THE-END" not in short.stdout.split("\nsteps", 1)[1]  # the table cuts it
    full = runner.invoke(cli, ["show", run.run_id, "-v", "--db", url], env=env)
    assert full.exit_code == 0, full.output
    # Every character of the step's output is there, over as many lines as it takes.
    table = full.stdout.split("\nsteps", 1)[1]
    assert table.count("x") >= 150 and "END" in table
    app.close()


def _long_run(tmp_path: Path) -> tuple[ms.App, str, str]:
    url = f"sqlite:///{tmp_path / 'long300.db'}"
    app = ms.App(url, default_retry=ms.RetryPolicy(max_attempts=2, initial_s=0.001))
    seen: set[int] = set()

    def work(i: int) -> int:
        if i == 7 and i not in seen:  # one step fails once, then succeeds
            seen.add(i)
            raise ConnectionError("blip")
        return i

    @app.workflow
    async def many(ctx: ms.RunContext) -> int:
        total = 0
        for i in range(30):
            total += await ctx.step(work, i, name=f"work:{i}")
        return total

    run = app.submit(many)
    asyncio.run(app.worker().run(until_idle=True))
    return app, url, run.run_id


def test_show_and_trace_page_and_filter_long_runs(tmp_path: Path) -> None:
    app, url, run_id = _long_run(tmp_path)
    for command in ("show", "trace"):
        last = json.loads(runner.invoke(cli, [command, run_id, "--last", "3", "--json",
                                              "--db", url]).stdout)  # fmt: skip
        assert [s["seq"] for s in last["steps"]] == [27, 28, 29]
        errors = json.loads(runner.invoke(cli, [command, run_id, "--errors", "--json",
                                                "--db", url]).stdout)  # fmt: skip
        assert [s["seq"] for s in errors["steps"]] == [7]
        one = json.loads(runner.invoke(cli, [command, run_id, "--step", "0:12", "--json",
                                             "--db", url]).stdout)  # fmt: skip
        assert [s["seq"] for s in one["steps"]] == [12]
        missing = runner.invoke(cli, [command, run_id, "--step", "99", "--db", url])
        assert missing.exit_code == 2 and "the run has no step 0:99" in missing.output
    tree = runner.invoke(cli, ["trace", run_id, "--errors", "--db", url])
    assert tree.exit_code == 0 and "30 steps" in tree.stdout and "showing 1 of them" in tree.stdout
    assert json.loads(runner.invoke(cli, ["trace", run_id, "--errors", "--json", "--db", url])
                      .stdout)["totals"]["steps"] == 30  # fmt: skip
    app.close()


def test_trace_json_times_are_iso_8601(tmp_path: Path) -> None:
    app, url, run_id = _long_run(tmp_path)
    data = json.loads(runner.invoke(cli, ["trace", run_id, "--json", "--db", url]).stdout)
    stamps = [data["run"]["created_at"], data["run"]["finished_at"]]
    stamps += [s[k] for s in data["steps"] for k in ("started_at", "finished_at")]
    assert all(isinstance(t, str) and t.endswith("Z") and "T" in t for t in stamps), stamps
    app.close()
