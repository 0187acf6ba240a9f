"""`mainspring lab run`: a user's workflow or agent under the lab's faults."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypedDict

import pytest
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.lab import LabProfile, run_workflow_lab
from mainspring.testing import ScriptedModel

runner = CliRunner()


def _chain_app() -> ms.App:
    app = ms.App()

    def add(x: int, y: int) -> int:
        return x + y

    @app.workflow
    async def chain(ctx: ms.RunContext, n: int) -> int:
        total = 0
        for i in range(n):
            total = await ctx.step(add, total, i, name=f"add:{i}")
        return total

    return app


def test_interceptors_wrap_every_executed_attempt(tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []

    class Spy(ms.StepInterceptor):
        async def execute_step(
            self, call: ms.StepCall, proceed: Callable[[], Awaitable[Any]]
        ) -> Any:
            seen.append((call.info.name, call.info.attempt))
            if call.info.name == "b" and call.info.attempt == 1:
                raise ms.TransientError("injected")
            return await proceed()

    app = ms.App(
        f"sqlite:///{tmp_path / 'i.db'}",
        interceptors=[Spy()],
        default_retry=ms.RetryPolicy(initial_s=0.0),
    )

    @app.workflow
    async def two(ctx: ms.RunContext) -> int:
        a = await ctx.step(lambda: 1, name="a")
        b = await ctx.step(lambda: 2, name="b")
        return int(a + b)

    import asyncio

    assert asyncio.run(app.run(two, key="k")) == 3
    assert seen == [("a", 1), ("b", 1), ("b", 2)]
    assert asyncio.run(app.run(two, key="k")) == 3  # a replay executes nothing
    assert len(seen) == 3
    app.close()


def test_independent_faults_match_the_closed_form() -> None:
    app = _chain_app()
    result = run_workflow_lab(
        app,
        LabProfile(model_error_rate=0.1),
        workflow="chain",
        args=[5],
        policies=["naive", "retries"],
        trials=100,
        seed=7,
    )
    assert result.steps == (5,) and result.target == "app"
    for policy in ("naive", "retries"):
        cell = result.cell(policy, 5)
        assert cell.theory is not None
        assert cell.ci_low <= cell.theory <= cell.ci_high, (policy, cell)
    assert result.cell("naive", 5).theory == pytest.approx(0.9**5)
    assert result.cell("naive", 5).causes == {"step_error": 100 - result.cell("naive", 5).successes}


def test_policies_order_and_crashes_are_recovered() -> None:
    result = run_workflow_lab(
        _chain_app(),
        LabProfile(model_error_rate=0.1, crash_rate=0.08, tool_failure_rate=0.05),
        workflow="chain",
        args=[6],
        policies=["naive", "retries", "checkpoint", "mainspring"],
        trials=40,
        repeats=4,
        seed=3,
    )
    naive, retries, checkpoint, full = (
        result.cell(p, 6) for p in ("naive", "retries", "checkpoint", "mainspring")
    )
    assert naive.success_rate < retries.success_rate < checkpoint.success_rate
    assert retries.causes.get("worker_crash", 0) > 0  # no journal: a crash loses the run
    assert "worker_crash" not in checkpoint.causes  # resumed from the journal
    assert checkpoint.recoveries > retries.recoveries
    # `add` never passes its idempotency key on: the lab still counts its re-executions
    assert full.duplicate_effects == checkpoint.duplicate_effects > 0


def _agent_app(notes: list[str]) -> tuple[ms.App, ms.Workflow[[str], ms.AgentResult]]:
    app = ms.App()

    @app.tool(effect="write")
    def note(text: str, *, ctx: ms.ToolContext) -> str:
        notes.append(ctx.idempotency_key)
        return "noted"

    def play(messages: Any, tools: Any) -> Any:
        done = sum(getattr(m, "kind", "") == "tool_result" for m in messages)
        if done < 2:
            return ScriptedModel.call("note", {"text": f"note {done}"})
        return ScriptedModel.call("finish", {"answer": "two notes"})

    helper = app.agent(
        "helper", model=ScriptedModel(play), instructions="Take two notes with note.", tools=[note]
    )
    return app, helper


def test_an_agent_under_the_lab() -> None:
    notes: list[str] = []
    app, _ = _agent_app(notes)
    result = run_workflow_lab(
        app,
        LabProfile(model_error_rate=0.05, malformed_rate=0.15, crash_rate=0.05),
        workflow="helper",
        args=["take two notes"],
        policies=["checkpoint", "validate", "mainspring"],
        trials=30,
        repeats=3,
        seed=5,
    )
    checkpoint, validate, full = (
        result.cell(p, result.steps[0]) for p in ("checkpoint", "validate", "mainspring")
    )
    assert result.steps[0] >= 5  # three model calls and two tool calls
    assert checkpoint.causes.get("malformed", 0) > 0  # no repair: a garbled reply fails
    assert validate.success_rate > checkpoint.success_rate  # the agent repairs it
    assert full.duplicate_effects == 0  # the tool takes ctx: ToolContext
    assert full.tokens > 0 and full.cost_per_success is not None
    # No real effect: the write tool ran as a stub in every trial.
    assert notes == [] and result.stubbed == ("note",) and not result.live
    # Every failed trial is listed with its cause, its error and its run.
    failed = sum(c.trials - c.successes for c in result.cells)
    assert len(result.failures) == failed > 0
    assert {f.cause for f in result.failures} >= {"malformed"}
    assert all(len(f.run_id) == 32 and f.error for f in result.failures)
    assert result.to_dict()["failures"][0]["run_id"] == result.failures[0].run_id


def test_live_runs_the_real_tools_and_kept_failures_can_be_shown(tmp_path: Path) -> None:
    notes: list[str] = []
    app, _ = _agent_app(notes)
    result = run_workflow_lab(
        app,
        LabProfile(malformed_rate=0.3),
        workflow="helper",
        args=["take two notes"],
        policies=["checkpoint"],
        trials=6,
        repeats=3,
        seed=5,
        live=True,
        keep=tmp_path / "kept",
    )
    assert notes and result.live and result.stubbed == ()
    failure = result.failures[0]
    assert failure.database is not None
    url = failure.database
    shown = subprocess.run(
        [sys.executable, "-m", "mainspring", "show", failure.run_id, "--json", "--db", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["run"]["status"] == "failed"


class Receipt(TypedDict):
    id: int


def test_a_write_tool_no_placeholder_fits_needs_a_stub() -> None:
    app = ms.App()

    @app.tool(effect="write")
    def pay(cents: int) -> Receipt:
        return {"id": 1}

    def play(messages: Any, tools: Any) -> Any:
        if any(getattr(m, "kind", "") == "tool_result" for m in messages):
            return ScriptedModel.call("finish", {"answer": "paid"})
        return ScriptedModel.call("pay", {"cents": 5})

    agent = app.agent("payer", model=ScriptedModel(play), instructions="pay", tools=[pay])
    for target in (app, agent):  # with its App (checked first), or found when it runs
        with pytest.raises(ms.ConfigError, match=r"--stub pay='<JSON>'.*--live"):
            run_workflow_lab(
                target, LabProfile(), workflow="payer", args=["x"], trials=2, repeats=1
            )
    result = run_workflow_lab(
        app,
        LabProfile(),
        workflow="payer",
        args=["x"],
        trials=2,
        repeats=1,
        stubs={"pay": {"id": 7}},
    )
    assert result.stubbed == ("pay",) and result.cells[0].successes == 2


MODULE = """
import mainspring as ms
from mainspring.testing import ScriptedModel

app = ms.App()


def add(x: int, y: int) -> int:
    return x + y


@app.workflow
async def chain(ctx: ms.RunContext, n: int) -> int:
    total = 0
    for i in range(n):
        total = await ctx.step(add, total, i, name=f"add:{i}")
    return total


@app.workflow
async def other(ctx: ms.RunContext) -> None:
    return None


WRITES = []


@app.tool(effect="irreversible")
def purge(table: str) -> str:
    "Purge a table."
    WRITES.append(table)
    return "purged"


def _play(messages, tools):
    if any(getattr(m, "kind", "") == "tool_result" for m in messages):
        return ScriptedModel.call("finish", {"answer": "done"})
    return ScriptedModel.call("purge", {"table": "customers"})


cleanup = app.agent(
    "cleanup", model=ScriptedModel(_play), instructions="Purge with purge.", tools=[purge]
)
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "lab_run_target.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "lab_run_target"


def test_cli_runs_a_workflow_and_writes_json(module: str) -> None:
    res = runner.invoke(
        cli,
        ["lab", "run", f"{module}:chain", "--args", "[3]", "--trials", "10",
         "--policy", "naive,checkpoint", "--crash-rate", "0.1", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["target"] == f"{module}:chain" and data["steps"] == [3]
    assert [c["policy"] for c in data["cells"]] == ["naive", "checkpoint"]
    res = runner.invoke(
        cli, ["lab", "run", f"{module}:app", "--workflow", "chain", "--kwargs", '{"n": 2}',
              "--trials", "10", "--policy", "retries"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "retries" in res.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{m}:add"], "is a function: the lab runs a workflow"),
        (["{m}:nothing"], "has no attribute"),
        (["{m}:app"], "name one with --workflow"),
        (["{m}:app", "--workflow", "nope"], "has no workflow 'nope'"),
        (["{m}:chain", "--args", "[3"], "--args must be JSON"),
        (["{m}:chain", "--args", '{"n": 3}'], "--args must be a JSON list"),
        (["{m}:chain", "--kwargs", "[3]"], "--kwargs must be a JSON object"),
        (["{m}:chain", "--args", '["x"]'], "is not a valid int"),
        (["{m}:chain"], "cannot take"),
        (["nomodule_here:x"], "cannot import module"),
    ],
)
def test_cli_bad_input_is_a_clear_error(module: str, argv: list[str], message: str) -> None:
    res = runner.invoke(cli, ["lab", "run", *(a.replace("{m}", module) for a in argv)])
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_cli_stubs_effects_and_lists_failed_trials(module: str, tmp_path: Path) -> None:
    res = runner.invoke(
        cli,
        ["lab", "run", f"{module}:cleanup", "--args", '["go"]', "--trials", "4",
         "--repeats", "2", "--policy", "naive", "--error-rate", "0.5", "--out",
         str(tmp_path / "out")],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    target = __import__(module)
    assert target.WRITES == []  # the irreversible tool never really ran
    assert "no real effects: these tools ran as stubs: purge" in res.stdout
    assert "failed trials (" in res.stdout and "model_error" in res.stdout
    assert "mainspring show " in res.stdout and "--db sqlite:///" in res.stdout
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Failed trials" in report and "`purge`" in report
    assert list((tmp_path / "out" / "trials").glob("naive-task*.db"))


def test_cli_live_asks_first(module: str) -> None:
    argv = ["lab", "run", f"{module}:cleanup", "--args", '["go"]', "--trials", "2",
            "--repeats", "1", "--policy", "naive", "--error-rate", "0"]  # fmt: skip
    refused = runner.invoke(cli, [*argv, "--live"])  # stdin is not a terminal
    assert refused.exit_code == 2 and "confirm with --yes" in refused.output
    target = __import__(module)
    assert target.WRITES == []
    done = runner.invoke(cli, [*argv, "--live", "--yes", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["live"] is True
    assert target.WRITES == ["customers"] * 3  # the reference run and two trials


def test_cli_stub_option(module: str) -> None:
    bad = runner.invoke(cli, ["lab", "run", f"{module}:cleanup", "--stub", "purge"])
    assert bad.exit_code == 2 and "--stub takes TOOL=JSON" in bad.output
    res = runner.invoke(
        cli,
        ["lab", "run", f"{module}:cleanup", "--args", '["go"]', "--trials", "2",
         "--repeats", "1", "--policy", "naive", "--error-rate", "0", "--stub",
         'purge="stubbed"', "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["stubbed"] == ["purge"]
