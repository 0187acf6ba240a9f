"""``mainspring shadow`` and the regression suites it saves: a recorded run shadowed
from the command line against a changed prompt (JSON, the HTML page beside it), the
runs that diverged saved to a file, and ``mainspring lab run --regressions`` replaying
that file in CI: exit 0 while the code decides as saved, 1 when a decision moves."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.lab import load_regressions

_APP = """
import os
import mainspring as ms
from mainspring.testing import EffectLedger, ScriptedModel

app = ms.App(os.environ["SHADOW_APP_DB"])
ledger = EffectLedger(os.environ["SHADOW_LEDGER"])


@app.tool
def lookup_order(order: int) -> dict:
    \"\"\"Look an order up.\"\"\"
    return {"order": order, "paid": 10}


@app.tool(effect="irreversible", requires_approval=False)
def refund(order: int, amount: int) -> str:
    \"\"\"Refund an order.\"\"\"
    ledger.apply(f"refund:{order}:{amount}", "refund", amount)
    return f"refunded {amount}"


def play(messages, tools):
    turn = sum(1 for m in messages if m.kind == "assistant")
    generous = "generous" in messages[0].content
    amount = 25 if generous else 10
    script = [
        ScriptedModel.call("lookup_order", {"order": 7}, id="c1"),
        ScriptedModel.call("refund", {"order": 7, "amount": amount}, id="c2"),
        ScriptedModel.call("finish", {"answer": f"refunded {amount}"}, id="c3"),
    ]
    return script[turn]


app.agent(
    "refunder",
    model=ScriptedModel(play),
    instructions=os.environ.get("SHADOW_PROMPT", "Refund what was paid."),
    tools=[lookup_order, refund],
)
"""


@pytest.fixture
def cli_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "shadow_app.py").write_text(_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SHADOW_APP_DB", f"sqlite:///{tmp_path / 'own.db'}")
    monkeypatch.setenv("SHADOW_LEDGER", str(tmp_path / "ledger.db"))
    return tmp_path


def _record(db_url: str) -> str:
    """The production run, recorded by the module's App pointed at ``db_url``."""
    import importlib

    import shadow_app

    module = importlib.reload(shadow_app)
    prod = ms.App(db_url, poll_interval_s=0.02)
    try:
        prod.workflows.update(module.app.workflows)
        prod.agents.update(module.app.agents)
        prod.tools = module.app.tools
        run_id = prod.submit("refunder", "refund order 7").run_id
        asyncio.run(prod.worker().run(until_idle=True))
        assert prod.get_run(run_id).status == "succeeded"
        assert module.ledger.report().calls == 1
    finally:
        prod.close()
        module.app.close()
    return run_id


def test_shadow_from_the_command_line_and_its_regression_suite(
    cli_app: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = _record(db_url)
    runner = CliRunner()

    def fresh() -> None:  # each command imports the module anew (its prompt, its App)
        monkeypatch.delitem(sys.modules, "shadow_app", raising=False)

    fresh()
    out = cli_app / "reports"
    suite = cli_app / "regressions.json"
    done = runner.invoke(
        cli,
        ["shadow", "shadow_app:app", "--db", db_url, "--run", run_id,
         "--instructions", "Refund, be generous.", "--out", str(out),
         "--save-suite", str(suite), "--json"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    [r] = report["runs"]
    assert (r["verdict"], r["turn"]) == ("diverged", 2)
    assert r["arguments"][0]["changes"] == ["amount: 10 → 25"]
    page = (out / "shadow.html").read_text()
    assert "amount: 10 → 25" in page and "<table>" in page
    assert json.loads((out / "shadow.json").read_text())["diverged"] == 1

    from mainspring.testing import EffectLedger

    ledger = EffectLedger(cli_app / "ledger.db")
    assert ledger.report().calls == 1  # the recorded refund, and nothing since
    ledger.close()

    # the suite holds the run and its journal: CI needs no database
    saved = load_regressions(suite)
    [case] = saved.runs
    assert case.recording.run.id == run_id
    assert case.expected[1]["calls"] == [["refund", {"order": 7, "amount": 25}]]

    monkeypatch.setenv("SHADOW_PROMPT", "Refund, be generous.")  # the code as shipped
    fresh()
    kept = runner.invoke(cli, ["lab", "run", "shadow_app:app", "--regressions", str(suite)])
    assert kept.exit_code == 0, kept.output
    assert "1 of 1 runs decide as saved" in kept.output

    monkeypatch.setenv("SHADOW_PROMPT", "Refund what was paid.")  # a regression
    fresh()
    moved = runner.invoke(
        cli, ["lab", "run", "shadow_app:app", "--regressions", str(suite), "--json"]
    )
    assert moved.exit_code == 1, moved.output
    [failure] = json.loads(moved.stdout)["failures"]
    assert failure["reply"] == 2 and '"amount": 10' in failure["got"]


def test_a_file_that_is_no_suite_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(ms.ConfigError, match="not a mainspring shadow regression suite"):
        load_regressions(bad)


def test_since_takes_spans_and_times() -> None:
    from datetime import datetime, timedelta

    from mainspring.cli._shadow import parse_when

    assert parse_when("7d", "--since") == timedelta(days=7)
    assert parse_when("30m", "--since") == timedelta(minutes=30)
    assert parse_when("2026-12-01T09:00", "--since") == datetime(2026, 12, 1, 9, 0)
    with pytest.raises(ms.ConfigError, match="--since takes"):
        parse_when("last week", "--since")
