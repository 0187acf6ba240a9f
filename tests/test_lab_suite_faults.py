"""The horizon suite's kill points and approvals: a real process is SIGKILLed at seeded
points, a restart moves past them, the same seed kills at the same points, and a
point can never kill forever."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mainspring import ConfigError
from mainspring.lab import KillRates, ProviderFaults, SuiteFaults, SuiteWorld

# A process that walks N events of each of two phases.
_WALKER = textwrap.dedent(
    """
    import sys
    from mainspring.lab import SuiteFaults

    faults = SuiteFaults(sys.argv[1])
    for phase in ("tool", "model"):
        while faults.events("b1", phase) < int(sys.argv[2]):
            faults.kill_point("b1", phase)
    print("done")
    """
)


def _walk(world: Path, tmp_path: Path, events: int) -> int:
    """Run the walker until it exits 0, restarting it after each SIGKILL; the restarts."""
    script = tmp_path / "walker.py"
    script.write_text(_WALKER)
    for restarts in range(200):
        done = subprocess.run(
            [sys.executable, str(script), str(world), str(events)], capture_output=True
        )
        if done.returncode == 0:
            assert done.stdout.strip() == b"done"
            return restarts
        assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    raise AssertionError("the walker never got past its kill points")


def _expected(seed: int, phase: str, rate: float, events: int) -> list[int]:
    """The counts a kill point kills at: its draws, but never twice in a row."""
    kills: list[int] = []
    for count in range(events):
        draw = random.Random(f"kill:{seed}:b1:{phase}:{count}").random()
        if draw < rate and (not kills or kills[-1] != count - 1):
            kills.append(count)
    return kills


def test_kill_points_kill_a_real_process_where_the_seed_says_and_a_restart_moves_on(
    tmp_path: Path,
) -> None:
    rates = KillRates(model=0.1, tool=0.05, commit=0.0)
    events = []
    for copy in ("a", "b"):  # two cells, one seed: the same kills
        world = tmp_path / f"{copy}.db"
        faults = SuiteFaults(world)
        faults.configure(7, rates, ProviderFaults())
        restarts = _walk(world, tmp_path, 40)
        events.append(faults.kill_events("b1"))
        assert restarts == len(events[-1]) > 0
        assert faults.kills("b1") == {
            "model": len(_expected(7, "model", 0.1, 40)),
            "tool": len(_expected(7, "tool", 0.05, 40)),
            "commit": 0,
        }
        # The counts were committed before each kill: every event counted once.
        assert faults.events("b1", "tool") == faults.events("b1", "model") == 40
        faults.close()
    assert events[0] == events[1]
    assert [c for _, p, c in events[0] if p == "tool"] == _expected(7, "tool", 0.05, 40)
    assert [c for _, p, c in events[0] if p == "model"] == _expected(7, "model", 0.1, 40)
    # Another seed kills elsewhere.
    assert _expected(8, "model", 0.1, 40) != _expected(7, "model", 0.1, 40)


def test_a_kill_point_at_rate_one_kills_every_other_event_and_never_loops(
    tmp_path: Path,
) -> None:
    world = tmp_path / "w.db"
    faults = SuiteFaults(world)
    faults.configure(0, KillRates(model=1.0, tool=1.0, commit=0.0), ProviderFaults())
    assert _walk(world, tmp_path, 8) == 8  # 4 kills in each phase's 8 events
    assert faults.kills() == {"model": 4, "tool": 4, "commit": 0}
    assert [c for _, _, c in faults.kill_events()] == [0, 2, 4, 6] * 2


def test_an_unconfigured_world_never_kills_and_its_tools_count_nothing(tmp_path: Path) -> None:
    world = SuiteWorld(tmp_path / "w.db")
    world.add_run("migrate", "b1", 2)
    for _ in range(50):
        world.faults.kill_point("b1", "model")
        world.call("b1", "progress", {}, "k")
    assert world.faults.kills() == {"model": 0, "tool": 0, "commit": 0}
    assert world.faults.events("b1", "tool") == 0
    with pytest.raises(ConfigError, match="phase"):
        world.faults.kill_point("b1", "checkout")  # type: ignore[arg-type]
    world.close()


def test_rates_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"KillRates\.tool"):
        KillRates(tool=1.5)
    with pytest.raises(ConfigError, match="add up"):
        ProviderFaults(server_error=0.5, rate_limited=0.4, timeout=0.2)
    with pytest.raises(ConfigError, match="timeout_s"):
        ProviderFaults(timeout_s=0)


def test_provider_draws_are_reproducible_and_near_their_rates() -> None:
    faults = ProviderFaults()
    drawn = [faults.draw(3, "b1", n) for n in range(5000)]
    assert drawn == [faults.draw(3, "b1", n) for n in range(5000)]
    assert drawn != [faults.draw(4, "b1", n) for n in range(5000)]
    share = {k: drawn.count(k) / len(drawn) for k in ("server_error", "rate_limited", "timeout")}
    assert 0.03 < share["server_error"] < 0.05
    assert 0.02 < share["rate_limited"] < 0.04
    assert 0.02 < share["timeout"] < 0.04


def test_approvals_for_contenders_without_hitl(tmp_path: Path) -> None:
    faults = SuiteFaults(tmp_path / "w.db")
    assert faults.request_approval("b1", "call_1", "refund", '{"ticket": 2}') is None
    assert faults.request_approval("b1", "call_1", "refund", '{"ticket": 2}') is None  # once
    assert faults.request_approval("b2", "call_9", "refund", '{"ticket": 7}') is None
    assert faults.pending() == [
        ("b1", "call_1", "refund", '{"ticket": 2}'),
        ("b2", "call_9", "refund", '{"ticket": 7}'),
    ]
    faults.answer("b1", "call_1", True)
    faults.answer("b2", "call_9", False)
    faults.answer("b1", "call_1", False)  # the first answer stands
    assert faults.request_approval("b1", "call_1", "refund", '{"ticket": 2}') == "approved"
    assert faults.request_approval("b2", "call_9", "refund", '{"ticket": 7}') == "rejected"
    assert faults.pending() == []
    with pytest.raises(KeyError, match="call_5"):
        faults.answer("b1", "call_5", True)
    faults.close()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads children from /proc (Linux)")
def test_a_harness_killed_mid_cell_leaves_no_worker_behind(tmp_path: Path) -> None:
    """A harness SIGKILLed by a test's timeout or an operator cannot stop its workers;
    they see it gone and exit, rather than go on running a cell nobody audits."""
    script = tmp_path / "harness.py"
    script.write_text(
        "from mainspring.lab import SuiteProfile, run_suite\n"
        "run_suite(tasks=['support'], steps=[100], runs=2, workers=2, profile=SuiteProfile())\n"
    )
    harness = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while len(workers := _children(harness.pid)) < 2:
            assert harness.poll() is None, "the harness ended before its workers started"
            assert time.monotonic() < deadline, "no worker started"
            time.sleep(0.1)
    finally:
        harness.kill()
        harness.wait()
    deadline = time.monotonic() + 15
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [w for w in workers if _alive(w)]
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert not left, f"workers {left} outlived their harness"
