"""Each example in examples/ runs to completion, and what it claims is checked."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from examples.migration import TargetStore, legacy_rows
from examples.migration.local import run_local

ROOT = Path(__file__).resolve().parent.parent


def test_migration_runs_every_stage_and_writes_each_customer_once(tmp_path: Path) -> None:
    out = run_local(tmp_path, 60, flaky_every=7)
    assert out.status == "succeeded", out.error
    rows = legacy_rows(60)
    rejected = {r["id"] for r in rows if "@" not in r["email"] or r["phone"] == "12-34"}
    rejected |= {r["id"] for r in rows if r["plan"] == "platinum"}
    assert {r["id"] for r in out.result["rejected"]} == rejected
    imported = {r["id"] for r in rows} - rejected
    assert out.result["imported"] == len(imported) == len(out.target_rows)
    assert set(out.target_rows) == imported
    # The gate showed the reviewer the counts before anything was written.
    assert out.gate_preview["import"] == len(imported)
    assert out.gate_preview["rejected"] == len(rejected)
    names = [s.name for s in out.steps]
    assert names.index("approval:import") < names.index("import_customer")
    assert Counter(names)["import_customer"] == len(imported)
    # Faults were met and survived: retried steps, and writes whose reply was lost
    # recognised by their idempotency key instead of applied twice.
    assert any(s.attempt > 1 for s in out.steps if s.name == "import_customer")
    assert out.result["repeats_recognised"] > 0
    assert out.ledger.calls > out.ledger.keys == len(imported)
    assert out.ledger.duplicate_effects == {}
    # Every stored row has the target schema.
    assert all(r["phone"].startswith("+") and r["segment"] for r in out.target_rows.values())


def test_migration_undoes_the_import_when_reconciliation_fails(tmp_path: Path) -> None:
    out = run_local(tmp_path, 30, drops=("cus_0007",))
    assert out.status == "failed"
    assert "reconciliation failed: 1 missing (cus_0007)" in out.error["message"]
    assert "the import was undone" in out.error["message"]
    assert out.target_rows == {}  # compensation removed every imported customer
    assert [s.name for s in out.steps][-2:] == ["reconcile", "undo_import"]
    assert out.ledger.duplicate_effects == {}


def test_migration_rejected_at_the_gate_writes_nothing(tmp_path: Path) -> None:
    out = run_local(tmp_path, 20, approve=False)
    assert out.status == "failed"
    assert "stage gate 'import' rejected by example: not today" in out.error["message"]
    assert out.target_rows == {} and out.ledger.calls == 0


def test_migration_refuses_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="count must be between 1 and 9999"):
        legacy_rows(0)
    TargetStore(tmp_path / "target.db").close()
    with pytest.raises(Exception, match="already holds a migration"):
        run_local(tmp_path, 5)


def test_migration_module_runs_from_the_shell(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.migration", "--count", "15", "--dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert ": succeeded" in done.stdout and "0 duplicate effects" in done.stdout
