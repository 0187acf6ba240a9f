"""``mainspring preflight``: seed 000's pre-release checklist."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mainspring.cli import cli
from mainspring.lab import CHECKS, preflight

runner = CliRunner()


def test_a_careless_agent_misses_every_item() -> None:
    report = preflight("apps.preflight_app:careless")
    assert report.kind == "agent" and not report.ok
    assert {f.check for f in report.findings if f.status == "fail"} == set(CHECKS)
    for f in report.findings:
        assert f.problems and f.fix, f


def test_a_careful_agent_passes() -> None:
    report = preflight("apps.preflight_app:careful")
    assert report.ok, [f for f in report.findings if f.status == "fail"]
    assert {f.status for f in report.findings} == {"pass"}


def test_workflows_are_checked_from_their_source() -> None:
    sloppy = {f.check: f for f in preflight("apps.preflight_app:sloppy_flow").findings}
    assert {c for c, f in sloppy.items() if f.status == "fail"} == {
        "schemas",
        "bounds",
        "resume",
        "gate_irreversible",
        "traces",
        "completion",
    }
    assert any("time.time()" in p for p in sloppy["resume"].problems)
    assert any("random.random()" in p for p in sloppy["resume"].problems)
    assert preflight("apps.preflight_app:tidy_flow").ok


def test_cli_exit_codes_and_json() -> None:
    bad = runner.invoke(cli, ["preflight", "apps.preflight_app:careless", "--json"])
    assert bad.exit_code == 1
    data = json.loads(bad.stdout)
    assert data["ok"] is False and len(data["findings"]) == len(CHECKS)
    good = runner.invoke(cli, ["preflight", "apps.preflight_app:careful"])
    assert good.exit_code == 0 and "ready" in good.stdout
    text = runner.invoke(cli, ["preflight", "apps.preflight_app:careless"])
    assert "MISS" in text.stdout and "fix:" in text.stdout


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "expected MODULE:OBJECT"),
        ("no_such_module_xyz:agent", "cannot import module 'no_such_module_xyz'"),
        ("apps.preflight_app:missing", "has no attribute 'missing'"),
        ("apps.preflight_app:not_an_agent", "is a int"),
    ],
)
def test_bad_targets_get_a_clear_error(spec: str, message: str) -> None:
    result = runner.invoke(cli, ["preflight", spec])
    assert result.exit_code == 2
    assert message in result.output
