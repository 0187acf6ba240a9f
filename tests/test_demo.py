"""``mainspring demo``: real workers, a stage gate, a real SIGKILL, the ledger's verdict."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mainspring", "demo", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_demo_json_survives_sigkill_with_every_import_once(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    done = _demo("--customers", "20", "--json", "--yes", "--no-lab", "--dir", str(folder))
    assert done.returncode == 0, done.stdout + done.stderr
    summary: dict[str, Any] = json.loads(done.stdout)  # JSON only on stdout

    assert summary["ok"] is True
    assert all(c["ok"] for c in summary["checks"]), summary["checks"]
    assert summary["status"] == "succeeded"
    result = summary["result"]
    # 20 legacy rows: cus_0011 (email) and cus_0017 (phone) are refused by validate.
    assert [r["id"] for r in result["rejected"]] == ["cus_0011", "cus_0017"]
    assert result["imported"] == summary["imports"] == summary["target_rows"] == 18
    assert result["reconciled"] is True
    assert summary["gate"] == "approval:import" and summary["gate_preview"]["import"] == 18
    assert summary["killed_step_name"] == "import_customer"
    assert summary["epoch"] >= 2  # a second worker took the run over

    # The step in flight ran again, under the same key, and took effect once.
    [rerun] = summary["interrupted"]
    assert rerun["step"] == summary["killed_at_step"]
    assert rerun["key"] == f"{summary['run_id']}:0:{rerun['step']}"
    assert rerun["attempt_final"] > rerun["attempt_killed"]
    assert rerun["applied"] == 1

    # The target's ledger: one effect per import key, faults or not.
    assert summary["duplicates"] == 0 and summary["target_keys"] == 18
    assert summary["target_calls"] > 18  # injected faults and the kill repeated calls
    # cus_0007 and cus_0014's first writes fail (every 7th): retried steps.
    assert any("import_customer" in s for s in summary["retried_steps"])
    assert summary["lab"] == [] and summary["lab_plot"] is None

    assert summary["worker_exit_code"] == 0
    assert _gone(summary["killed_pid"]) and _gone(summary["takeover_pid"])
    assert summary["dir"] == str(folder.resolve())
    assert (folder / "mainspring.db").is_file() and (folder / "target.db").is_file()

    # The printed inspection command works and shows the re-run step.
    command = ["show", summary["run_id"], "--json", "--db", summary["database_url"]]
    show = subprocess.run(
        [sys.executable, "-m", "mainspring", *command], capture_output=True, text=True, timeout=60
    )
    assert show.returncode == 0, show.stderr
    journal = json.loads(show.stdout)
    assert journal["run"]["status"] == "succeeded"
    killed = next(s for s in journal["steps"] if s["seq"] == summary["killed_at_step"])
    assert killed["attempts"] >= 2


def test_demo_text_without_yes_approves_when_stdin_is_not_a_terminal(tmp_path: Path) -> None:
    done = _demo("--customers", "12", "--dir", str(tmp_path / "demo"))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "stdin is not a terminal: the stage gate will be approved automatically" in out
    assert "stage gate: import" in out and "approved automatically" in out
    assert "killed worker pid " in out and " with SIGKILL at step " in out
    assert "took over the run" in out
    for label in ("summary", "journal", "retries", "gate", "crash", "recovery", "target"):
        assert f"\n  {label}" in out or f"\n{label}" in out, label
    assert "0 duplicate effects" in out
    assert "all 9 checks passed" in out
    assert "mainspring show " in out and "--db sqlite:///" in out
    # The lab comparison, and its plot when matplotlib is there (the lab extra).
    assert "lab: success rate by task length" in out
    assert "naive" in out and "mainspring " in out
    if (tmp_path / "demo" / "lab" / "success_vs_steps.png").is_file():
        assert "plot written: " in out
    else:
        assert "matplotlib is missing" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kill-at", "1.0"], "between 0 and 1"),
        (["--customers", "2"], "--customers"),
    ],
)
def test_demo_rejects_bad_options(args: list[str], message: str, tmp_path: Path) -> None:
    done = _demo(*args, "--dir", str(tmp_path))
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "mainspring.db").exists()


def test_demo_refuses_a_used_directory(tmp_path: Path) -> None:
    (tmp_path / "mainspring.db").write_bytes(b"")
    done = _demo("--dir", str(tmp_path))
    assert done.returncode == 2
    assert "from an earlier demo" in done.stderr


def test_the_demo_cannot_fail_by_its_own_dice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transform stage's injected faults never outnumber its attempts: the model
    faults at most MAX_FAULTS_IN_A_ROW times in a row, and the stage retries more often."""
    monkeypatch.setenv("MIGRATION_TARGET", str(tmp_path / "target.db"))
    worker_app = importlib.import_module("mainspring.examples.migration.worker_app")
    from mainspring.examples.migration.local import MAX_FAULTS_IN_A_ROW, segment_model

    assert worker_app.config.retry.max_attempts > MAX_FAULTS_IN_A_ROW
    model = segment_model()
    assert model.profile.max_in_a_row == MAX_FAULTS_IN_A_ROW
    assert model.seed == segment_model().seed  # the same faults in every run


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 50 demos, each a few seconds to a minute on a busy machine
def test_the_demo_passes_fifty_runs_in_a_row(tmp_path: Path) -> None:
    """``mainspring demo`` as a new user runs it (the lab comparison included), 50 times:
    the main job never fails, whatever the timing of its kill."""
    for i in range(50):
        done = _demo("--yes", "--json", "--dir", str(tmp_path / f"demo-{i}"))
        assert done.returncode == 0, f"run {i + 1} of 50 failed:\n{done.stdout}\n{done.stderr}"
        assert json.loads(done.stdout)["ok"] is True
        print(f"demo {i + 1} of 50 passed")
