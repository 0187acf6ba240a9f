"""The deterministic simulator (mainspring.testing.sim): a seed replays its run byte
for byte, the oracles hold on the real engine, and a bug put back on purpose is found."""

from __future__ import annotations

from typing import Any

import pytest

import mainspring.testing.sim as sim
from mainspring.journal._steps import Steps
from mainspring.testing.sim import AgentWorkload, FaultMix, OrdersWorkload, simulate

# A mix that makes a process die often: what a test of crash recovery wants.
CRASHY = FaultMix(crash=1 / 150, freeze=1 / 2000, busy=0.02, ambiguous=0.01)
# Crashes only, at one await point in 30: the at-most-once window is a few await
# points wide, so this mix finds a run-twice bug in about one seed of three.
CRASHES = FaultMix(crash=1 / 30, freeze=0, busy=0, ambiguous=0, clock_jump=0, provider=0)


def test_sim_names_are_pinned() -> None:
    assert set(sim.__all__) == {
        "OWNER",
        "WORKLOADS",
        "AgentWorkload",
        "FaultMix",
        "OrdersWorkload",
        "SimClock",
        "SimLoop",
        "SimResult",
        "SimStalled",
        "Workload",
        "replay_command",
        "simulate",
    }


def test_a_seed_replays_its_run_byte_for_byte() -> None:
    first = simulate(OrdersWorkload(orders=6), seed=11, faults=CRASHY)
    again = simulate(OrdersWorkload(orders=6), seed=11, faults=CRASHY)
    other = simulate(OrdersWorkload(orders=6), seed=12, faults=CRASHY)
    assert first.text() == again.text()
    assert first.text() != other.text()
    # The seed drew faults, not only a schedule: the trace tells them.
    assert any(" crash" in line for line in first.trace)


@pytest.mark.parametrize("seed", range(4))
def test_the_engine_keeps_its_promises_under_faults(seed: int) -> None:
    result = simulate(OrdersWorkload(orders=8), seed=seed, faults=CRASHY)
    assert result.ok, f"{result.violations}\nreplay: {result.command}"
    assert result.steps > 0


def test_an_at_most_once_step_run_again_after_a_crash_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The bug put back: a started at_most_once step whose worker died runs again,
    # as an at_least_once step would, instead of failing as StepInterrupted.
    real = Steps._interrupted

    async def run_it_again(self: Steps, step: Any, rec: Any) -> None:
        mode, step.mode = step.mode, "at_least_once"
        try:
            await real(self, step, rec)
        finally:
            step.mode = mode

    monkeypatch.setattr(Steps, "_interrupted", run_it_again)
    found = None
    for seed in range(20):
        result = simulate(OrdersWorkload(orders=8), seed=seed, faults=CRASHES)
        if not result.ok:
            found = result
            break
    assert found is not None, "20 seeds did not find an at_most_once step run twice"
    assert any("at_most_once_twice" in v for v in found.violations), found.violations
    assert f"seed={found.seed}" in found.command


@pytest.mark.parametrize("seed", range(2))
def test_an_agent_run_under_crashes_and_provider_faults_applies_each_item_once(seed: int) -> None:
    result = simulate(AgentWorkload(items=60, provider=0.1), seed=seed, faults=CRASHY)
    assert result.ok, f"{result.violations}\nreplay: {result.command}"
    assert result.steps >= 2 * 60  # a model call and a tool call per item, at least
    assert any(
        line.endswith(" succeeded epoch=" + line.rsplit("=", 1)[-1]) for line in result.trace
    )


def test_lab_sim_prints_a_failing_seed_with_its_replay_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from typer.testing import CliRunner

    from mainspring.cli import cli

    ok = CliRunner().invoke(cli, ["lab", "sim", "--seed", "3", "--runs", "1", "--json"])
    assert ok.exit_code == 0, ok.output
    assert '"failed": []' in ok.output

    # A workload whose check always complains: the command says which seed and how
    # to replay it, and exits 1.
    class Broken(OrdersWorkload):
        def check(self, client: Any, ledger: Any) -> list[str]:
            return ["[end] planted"]

    monkeypatch.setitem(sim.WORKLOADS, "orders", Broken)
    bad = CliRunner().invoke(cli, ["lab", "sim", "--seed", "5", "--runs", "1"])
    assert bad.exit_code == 1
    assert "seed 5: FAILED" in bad.output
    assert "mainspring lab sim --seed 5 --runs 1 --workload orders --workers 3" in bad.output


def test_a_seed_replays_the_same_in_another_process_whatever_its_hash_seed() -> None:
    import os
    import subprocess
    import sys

    def start(hash_seed: str) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        code = (
            "from mainspring.testing.sim import OrdersWorkload, simulate\n"
            "print(simulate(OrdersWorkload(orders=4), seed=3).text())"
        )
        return subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
        )

    one, two = start("1"), start("2")  # side by side: each pays its imports
    traces = [p.communicate(timeout=120)[0] for p in (one, two)]
    assert one.returncode == two.returncode == 0
    assert traces[0] == traces[1]
    assert "turns " in traces[0]


def test_a_missing_fence_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    # The bug put back: a commit is applied whatever epoch and status the writer holds,
    # so a worker that froze and woke after another took its run over writes on.
    import mainspring.storage._journal as journal

    monkeypatch.setattr(journal, "fence_holds", lambda epoch, status, held: True)
    freezes = FaultMix(crash=0, freeze=1 / 200, busy=0, ambiguous=0, clock_jump=0.02, provider=0)
    found = None
    for seed in range(20):
        result = simulate(OrdersWorkload(orders=8), seed=seed, faults=freezes)
        if not result.ok:
            found = result
            break
    assert found is not None, "20 seeds did not find a commit past the fence"
    assert any(" freeze " in line for line in found.trace)
