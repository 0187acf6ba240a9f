"""``mainspring demo``: real worker processes, a real SIGKILL, and the ledger's verdict."""

from __future__ import annotations

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
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_demo_json_survives_sigkill_with_every_effect_once(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    done = _demo("--steps", "12", "--json", "--yes", "--dir", str(folder))
    assert done.returncode == 0, done.stdout + done.stderr
    summary: dict[str, Any] = json.loads(done.stdout)  # JSON only on stdout

    assert summary["ok"] is True
    assert all(c["ok"] for c in summary["checks"]), summary["checks"]
    assert summary["status"] == "succeeded"
    # The CRM recognised the re-run call when the kill landed after its write.
    repeats = 1 if summary["effect_applied_before_kill"] else 0
    assert summary["result"] == {
        "migrated": 10,
        "repeats_recognised_by_crm": repeats,
        "email": "sent",
    }
    assert summary["steps"] == 12
    assert summary["steps_completed"] == 12
    assert 0 < summary["killed_at_step"] < summary["steps"]
    assert summary["epoch"] >= 2  # a second worker took the run over

    # The step in flight ran again, under the same key, and took effect once.
    [rerun] = summary["interrupted"]
    assert rerun["step"] == summary["killed_at_step"]
    assert rerun["key"] == f"{summary['run_id']}:0:{rerun['step']}"
    assert rerun["attempt_final"] > rerun["attempt_killed"]
    assert rerun["applied"] == 1

    # The ledger: every upsert exactly once per key, the email at most once.
    assert summary["duplicates"] == 0
    upserts = summary["effects"][:-1]
    assert [e["step"] for e in upserts] == list(range(1, 11))
    assert all(e["applied"] == 1 for e in upserts), upserts
    assert summary["crm_calls"] == sum(e["calls"] for e in summary["effects"])
    assert summary["at_most_once"]["step"] == 11
    assert summary["at_most_once"]["calls"] <= 1

    # No worker is left behind, and the files are where it says.
    assert summary["worker_exit_code"] == 0
    assert _gone(summary["killed_pid"]) and _gone(summary["takeover_pid"])
    assert summary["dir"] == str(folder.resolve())
    assert (folder / "mainspring.db").is_file() and (folder / "crm-ledger.db").is_file()

    # The printed inspection command works and shows the re-run step.
    command = ["show", summary["run_id"], "--json", "--db", summary["database_url"]]
    show = subprocess.run(
        [sys.executable, "-m", "mainspring", *command], capture_output=True, text=True, timeout=60
    )
    assert show.returncode == 0, show.stderr
    journal = json.loads(show.stdout)
    assert journal["run"]["status"] == "succeeded"
    assert [s["attempts"] for s in journal["steps"]] == [
        2 if s["seq"] == summary["killed_at_step"] else 1 for s in journal["steps"]
    ]


def test_demo_text_tells_the_story(tmp_path: Path) -> None:
    done = _demo("--steps", "8", "--dir", str(tmp_path / "demo"))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "killed worker pid " in out and " with SIGKILL at step " in out
    assert "took over the run" in out
    for label in ("summary", "journal", "crash", "recovery", "CRM ledger", "email"):
        assert f"\n  {label}" in out or f"\n{label}" in out, label
    assert "0 duplicate effects" in out
    assert "all 9 checks passed" in out
    assert "mainspring show " in out and "--db sqlite:///" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kill-at", "1.0"], "between 0 and 1"),
        (["--steps", "2"], "--steps"),
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
