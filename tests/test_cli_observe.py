"""``mainspring trace / tail / doctor / fork / retry`` and the filters of ``runs``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from _helpers import drain
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.limits import Price
from mainspring.models import Usage
from mainspring.testing import ScriptedModel

call = ScriptedModel.call


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'obs.db'}"


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


async def _runs(db: str) -> tuple[str, str]:
    """A succeeded agent run (with a failed tool call) and a failed workflow run."""
    app = ms.App(db, poll_interval_s=0.01, inline_wait_s=0.0)

    @app.tool(retry=ms.RetryPolicy.never())
    def close(ticket: int) -> str:
        """Close a ticket."""
        raise PermissionError(f"ticket {ticket} is locked")

    agent = app.agent(
        "closer",
        model=ScriptedModel([call("close", {"ticket": 7}), call("finish", {"answer": "ok"})]),
        instructions="x",
        tools=[close],
    )
    await app.run(agent, "close ticket 7")
    agent_run = app.list_runs()[0].id

    async def boom() -> None:
        raise ValueError("boom")

    @app.workflow
    async def explode(ctx: ms.RunContext) -> None:
        await ctx.step(boom, retry=ms.RetryPolicy.never())

    failed = app.submit(explode).run_id
    await drain(app)
    app.close()
    return agent_run, failed


async def test_trace_tree_and_json(db: str) -> None:
    agent_run, _ = await _runs(db)
    result = _invoke("trace", agent_run, "--db", db)
    assert result.exit_code == 0, result.output
    assert f"run {agent_run} closer succeeded" in result.output
    assert "tool:close failed" in result.output
    assert "PermissionError: ticket 7 is locked" in result.output
    result = _invoke("trace", agent_run, "--db", db, "--json")
    data = json.loads(result.stdout)
    assert [s["name"] for s in data["steps"]] == [
        "model:scripted:scripted",
        "tool:close",
        "model:scripted:scripted",
    ]
    assert data["steps"][1]["error_class"] == "PermissionError"
    assert data["steps"][1]["input"] == '{"ticket": 7}'
    assert data["totals"]["steps"] == 3 and data["totals"]["errors"] == 1
    assert data["totals"]["unpriced"] is True and data["steps"][0]["priced"] is False
    # The scripted model has no price: its tokens say so, as the dashboard does, rather
    # than a cost of $0.0000 that reads as free.
    text = _invoke("trace", agent_run, "--db", db).output
    assert "$0.0000" not in text
    assert "· no price" in text.splitlines()[0] and "tok no price" in text


async def test_doctor_and_tail(db: str) -> None:
    agent_run, failed = await _runs(db)
    result = _invoke("doctor", agent_run, "--db", db)
    assert result.exit_code == 0, result.output
    assert "tool error ignored" in result.output and "check next" in result.output
    data = json.loads(_invoke("doctor", agent_run, "--db", db, "--json").stdout)
    assert {f["kind"] for f in data["findings"]} >= {"ignored_tool_error"}
    result = _invoke("tail", agent_run, "--db", db)
    assert result.exit_code == 0
    assert result.output.count("\n") == 1  # finished: one progress line, then it exits
    assert result.output.startswith("succeeded steps    3")
    assert _invoke("tail", failed, "--db", db).exit_code == 1


async def test_retry_and_fork_from_the_cli(db: str) -> None:
    agent_run, failed = await _runs(db)
    result = _invoke("retry", failed, "--db", db)
    assert result.exit_code == 0, result.output
    app = ms.App(db)
    try:
        assert app.get_run(failed).status == "queued"
        assert app.store.load_steps(failed) == []  # the failing step runs again
        result = _invoke("fork", agent_run, "--from-step", "0", "--db", db, "--json")
        assert result.exit_code == 0, result.output
        forked = json.loads(result.stdout)["run_id"]
        assert [s.name for s in app.observe.steps(forked)] == ["model:scripted:scripted"]
        assert app.get_run(forked).status == "queued"
    finally:
        app.close()


async def test_bad_input_is_a_clear_error_and_changes_nothing(db: str) -> None:
    agent_run, _ = await _runs(db)
    cases = [
        (["fork", agent_run, "--from-step", "0", "--edit-state", "{nope"], "not valid JSON"),
        (["fork", agent_run, "--from-step", "9"], "has no step 0:9"),
        (["fork", agent_run, "--from-step", "one"], "'one'"),
        (["fork", "missing", "--from-step", "0"], "no run 'missing'"),
        (["retry", agent_run], "only a failed run can be retried"),
        (["trace", "missing"], "no run 'missing'"),
        (["doctor", "missing"], "no run 'missing'"),
        (["runs", "--since", "yesterday"], "--since 'yesterday'"),
    ]
    for args, message in cases:
        result = _invoke(*args, "--db", db)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr, (args, result.stderr)
    app = ms.App(db)
    try:
        assert len(app.list_runs()) == 2
    finally:
        app.close()


async def test_runs_filters(db: str) -> None:
    agent_run, failed = await _runs(db)
    data = json.loads(_invoke("runs", "--db", db, "--json", "--search", "TICKET 7").stdout)
    assert [r["id"] for r in data["runs"]] == [agent_run]
    data = json.loads(_invoke("runs", "--db", db, "--json", "--since", "1h").stdout)
    assert {r["id"] for r in data["runs"]} == {agent_run, failed}
    data = json.loads(_invoke("runs", "--db", db, "--json", "--since", "2999-01-01").stdout)
    assert data["runs"] == []
    result = _invoke("runs", "--db", db, "--search", "zzz")
    assert "no runs match" in result.output


async def test_an_agents_own_prices_are_journaled_so_db_alone_shows_the_cost(db: str) -> None:
    # "scripted" is in no price table but this agent's: only the journal can tell a
    # `trace --db` (which loads no app) what the run cost.
    app = ms.App(db)
    usage = Usage(input_tokens=1000, output_tokens=100)
    finish = ScriptedModel.call("finish", {"answer": "ok"})
    model = ScriptedModel([dataclasses.replace(finish, usage=usage)])
    agent = app.agent(
        "priced", model=model, instructions="x", prices={"scripted": Price(2.0, 10.0)}
    )
    try:
        result = await app.run(agent, "go")
    finally:
        app.close()
    assert result.cost_usd == pytest.approx(0.003)
    run_id = ms.App(db).list_runs()[0].id
    data = json.loads(_invoke("trace", run_id, "--db", db, "--json").stdout)
    assert data["totals"]["cost_usd"] == pytest.approx(0.003)
    assert data["totals"]["unpriced"] is False and data["steps"][0]["priced"] is True
    assert "$0.0030" in _invoke("trace", run_id, "--db", db).output
