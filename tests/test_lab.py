"""The reliability lab: statistics, seed 000's figures, the policies, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mainspring.cli import cli
from mainspring.lab import LabProfile, pass_hat_k, run_lab, theory_success, wilson

runner = CliRunner()

# Seed 000, section 3.4: theory at error rate 0.1 for 3, 5, 8 and 12 steps.
SEED_000 = {3: 0.729, 5: 0.590, 8: 0.430, 12: 0.282}


def test_wilson_interval_matches_the_textbook() -> None:
    low, high = wilson(81, 263)  # Wilson's own worked example
    assert (round(low, 4), round(high, 4)) == (0.2553, 0.3662)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="impossible"):
        wilson(11, 10)


def test_pass_hat_k_is_taus_estimator() -> None:
    # one task 3 of 4, one task 4 of 4: pass^2 = (C(3,2)/C(4,2) + 1) / 2
    assert pass_hat_k([(3, 4), (4, 4)], 2) == pytest.approx((3 / 6 + 1) / 2)
    assert pass_hat_k([(3, 4)], 1) == pytest.approx(0.75)
    assert pass_hat_k([(3, 4)], 8) is None  # too few trials for k


def test_theory_is_seed_000s_table() -> None:
    for n, expected in SEED_000.items():
        assert theory_success(0.1, n) == pytest.approx(expected, abs=5e-4)
    # section 3.5: error rate 0.05 at 5, 10, 20 steps; 0.2 at 20
    assert [round(theory_success(0.05, n), 3) for n in (5, 10, 20)] == [0.774, 0.599, 0.358]
    assert round(theory_success(0.2, 20), 3) == 0.012
    assert theory_success(0.1, 10, retries=2) == pytest.approx((1 - 0.001) ** 10)


def test_naive_lab_reproduces_seed_000_within_its_intervals() -> None:
    result = run_lab(
        LabProfile(model_error_rate=0.1), steps=(3, 5, 8, 12), policies=["naive"], seed=42
    )
    for n, expected in SEED_000.items():
        cell = result.cell("naive", n)
        assert cell.trials == 1000
        assert cell.ci_low <= expected <= cell.ci_high, (n, cell)
        assert cell.causes == {"model_error": 1000 - cell.successes}
        assert cell.pass_k[1] == pytest.approx(cell.success_rate)
        assert cell.pass_k[8] is not None and cell.pass_k[8] < cell.pass_k[2] < cell.pass_k[1]


def test_retries_match_the_retry_curve() -> None:
    profile = LabProfile(model_error_rate=0.3, retries=1)
    result = run_lab(profile, steps=(5, 20), policies=["retries"], trials=1000, seed=3)
    for n in (5, 20):
        cell = result.cell("retries", n)
        assert cell.theory == pytest.approx((1 - 0.3**2) ** n)
        assert cell.ci_low <= cell.theory <= cell.ci_high, cell


def test_policies_differ_where_the_runtime_acts() -> None:
    profile = LabProfile(
        model_error_rate=0.05, tool_failure_rate=0.05, malformed_rate=0.05, crash_rate=0.05
    )
    result = run_lab(profile, steps=(8,), trials=40, repeats=4, seed=5)
    naive, retries, checkpoint, validate, full = (
        result.cell(p, 8) for p in ("naive", "retries", "checkpoint", "validate", "mainspring")
    )
    assert naive.causes.get("worker_crash", 0) > 0 and retries.causes.get("worker_crash", 0) > 0
    # the journal resumes crashed runs: no trial is lost to a crash
    for cell in (checkpoint, validate, full):
        assert "worker_crash" not in cell.causes and cell.recoveries > 0
    # unvalidated garbage spoils results; validators send it back for repair
    assert checkpoint.causes.get("malformed", 0) > 0
    assert "malformed" not in validate.causes and "malformed" not in full.causes
    # re-run writes without an idempotency key repeat their effect; with one they do not
    assert retries.duplicate_effects > 0 and checkpoint.duplicate_effects > 0
    assert full.duplicate_effects == 0
    assert naive.successes < retries.successes < full.successes
    assert full.cost_per_success is not None and naive.cost_per_success is not None


def test_correlated_faults_defeat_retries_and_show_in_pass_k() -> None:
    profile = LabProfile(model_error_rate=0.05, correlated_rate=0.02)
    result = run_lab(profile, steps=(10,), policies=["mainspring"], trials=80, repeats=8, seed=9)
    cell = result.cell("mainspring", 10)
    assert cell.causes.get("correlated", 0) > 0
    assert cell.theory is None  # not independent: no closed form claimed
    assert cell.pass_k[8] is not None and cell.pass_k[8] <= cell.pass_k[1] < 1.0


def test_a_seed_reproduces_every_figure() -> None:
    profile = LabProfile(model_error_rate=0.1, crash_rate=0.05, tool_failure_rate=0.05)
    kwargs = {"steps": (4,), "trials": 20, "repeats": 4, "seed": 11}
    assert run_lab(profile, **kwargs).to_dict() == run_lab(profile, **kwargs).to_dict()  # type: ignore[arg-type]


def test_cli_json_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = runner.invoke(
        cli,
        [
            "lab",
            "--steps",
            "3,5",
            "--policy",
            "naive,retries",
            "--trials",
            "100",
            "--json",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(c["policy"], c["steps"]) for c in data["cells"]] == [
        ("naive", 3),
        ("naive", 5),
        ("retries", 3),
        ("retries", 5),
    ]
    for name in (
        "report.md",
        "report.html",
        "success_vs_steps.png",
        "pass_k.png",
        "failure_causes.png",
    ):
        assert (out / name).stat().st_size > 0
    assert (out / "success_vs_steps.png").read_bytes()[:4] == b"\x89PNG"
    assert "| naive | 3 |" in (out / "report.md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "3,x"], "'x' in '3,x' is not an integer"),
        (["--steps", "0"], "within 1..1000"),
        (["--policy", "yolo"], "unknown policy 'yolo'"),
        (["--trials", "15", "--repeats", "10"], "multiple of repeats"),
        (["--error-rate", "1.5"], "model_error_rate must be within [0, 1]"),
    ],
)
def test_cli_bad_input_names_what_is_wrong(args: list[str], message: str) -> None:
    result = runner.invoke(cli, ["lab", *args])
    assert result.exit_code == 2
    assert message in result.output
