"""The horizon benchmark (bench/horizon.py) and its peer runners (bench/horizon/): their
CLI and tools, the contenders bench/horizon.py hands to ``run_suite``, and one real peer
cell when the peer venv is built. The benchmark itself is not a test (bench/horizon.py
runs it); the runners need the peer venv (bench/.venv-horizon), which CI lacks."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
HORIZON = ROOT / "bench" / "horizon"
VENV_PYTHON = ROOT / "bench" / ".venv-horizon" / "bin" / "python"
RUNNERS = ("plain_loop.py", "langgraph_agent.py", "agents_sdk.py", "pydantic_ai_bare.py")


@pytest.fixture
def common(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """bench/horizon/_common.py, imported from its directory, forgotten afterwards."""
    monkeypatch.syspath_prepend(str(HORIZON))
    monkeypatch.delitem(sys.modules, "_common", raising=False)
    import _common

    yield _common
    sys.modules.pop("_common", None)


def test_the_runner_cli_parses_and_refuses_what_horizon_md_does_not_say(
    common: ModuleType,
) -> None:
    given = ["--task", "support", "--label", "b1", "--world", "w.db", "--state", "s"]
    args = common.parse_args([*given, "--max-steps", "40"])
    assert (args.task, args.label, args.max_steps, args.task_text) == (
        "support", "b1", 40, "support batch b1"
    )  # fmt: skip
    with pytest.raises(SystemExit):
        common.parse_args(["--task", "nope", "--label", "b", "--world", "w", "--state", "s"])
    with pytest.raises(SystemExit):
        common.parse_args([*given, "--max-steps", "0"])


def test_tools_are_the_tasks_plus_finish(common: ModuleType) -> None:
    from mainspring.lab import TASKS

    names = [t["function"]["name"] for t in common.openai_tools(TASKS["migrate"])]
    assert names == ["progress", "validate", "write", "checkpoint", "finish"]


@pytest.mark.skipif(
    not VENV_PYTHON.exists(),
    reason="no peer venv: `python bench/horizon/_venv.py` builds bench/.venv-horizon",
)
@pytest.mark.parametrize("runner", RUNNERS)
def test_each_runner_imports_its_framework_and_parses_the_cli(runner: str) -> None:
    script = str(HORIZON / runner)
    shown = subprocess.run([str(VENV_PYTHON), script, "--help"], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "--max-steps" in shown.stdout
    missing = subprocess.run([str(VENV_PYTHON), script, "--task", "support"], capture_output=True)
    assert missing.returncode == 2


@pytest.fixture
def horizon(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """bench/horizon.py as a module, forgotten afterwards."""
    monkeypatch.syspath_prepend(str(HORIZON))
    spec = importlib.util.spec_from_file_location("bench_horizon", ROOT / "bench" / "horizon.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("_venv", None)


def test_the_runners_meet_the_suites_own_faults_and_server(common: ModuleType) -> None:
    from mainspring import lab

    assert common.SuiteFaults is lab.SuiteFaults
    assert common.SuiteModelServer is lab.SuiteModelServer


def test_peers_go_to_run_suite_as_runner_contenders(horizon: ModuleType) -> None:
    from mainspring.lab import AppContender, KillRates, ProviderFaults, RunnerContender

    assert horizon.contender("mainspring", None) == "mainspring"
    peer = horizon.contender("langgraph", Path("/venv/bin/python"))
    assert isinstance(peer, RunnerContender)
    assert peer.argv_prefix == ("/venv/bin/python", str(HORIZON / "langgraph_agent.py"))
    # An integration's contender runs with this interpreter (the extra), no peer venv.
    on_mainspring = horizon.contender("pydantic_ai_mainspring", None)
    assert on_mainspring == RunnerContender(
        "pydantic_ai_mainspring", (sys.executable, str(HORIZON / "pydantic_ai_mainspring.py"))
    )
    # A peer's agent on mainspring: mainspring's worker pool running its App.
    on = horizon.contender("langgraph_mainspring", Path("/venv/bin/python"))
    assert isinstance(on, AppContender) and on.name == "LangGraph on mainspring"
    assert (on.app, on.python, on.pythonpath) == (
        "langgraph_mainspring:app", "/venv/bin/python", (str(HORIZON),),
    )  # fmt: skip
    assert horizon.profile(False).kills == KillRates(0, 0, 0)
    assert horizon.profile(False).provider == ProviderFaults(0, 0, 0)
    assert horizon.profile(True).kills == KillRates()
    assert horizon.profile(True, 5.0).provider == ProviderFaults(timeout_s=5.0)
    assert horizon.profile(False, 5.0).provider.timeout_s == 5.0
    with pytest.raises(SystemExit):
        horizon.main(["--contenders", "mainspring,crewai"])


@pytest.mark.slow
def test_pydantic_ai_on_mainspring_plays_a_cell_through_run_suite(horizon: ModuleType) -> None:
    from mainspring.lab import run_suite

    contender = horizon.contender("pydantic_ai_mainspring", None)
    (cell,) = run_suite(
        tasks=["support"], steps=[3], runs=1, workers=1, timeout_s=120.0,
        contender=contender, profile=horizon.profile(False),
    )  # fmt: skip
    assert (cell.contender, cell.succeeded, cell.failures) == ("pydantic_ai_mainspring", 1, [])
    assert cell.duplicate_effects == 0 and cell.model_calls >= 4


def test_parallel_children_get_the_cell_arguments_only(horizon: ModuleType) -> None:
    given = ["--contenders", "a,b", "--parallel", "--steps=10", "--html", "h.html"]
    given += ["--json", "--contenders=c", "--client-timeout", "5", "--quick"]
    assert horizon._without(given) == ["--steps=10", "--client-timeout", "5", "--quick"]


def test_parallel_runs_each_contender_in_a_child_and_prints_one_table(
    horizon: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    given = ["--contenders", "mainspring,mainspring", "--task", "support", "--steps", "3"]
    assert horizon.main([*given, "--runs", "1", "--no-faults", "--parallel"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| mainspring")]
    assert len(rows) == 2 and all("| support | 3 | 1 | 100.0% |" in r for r in rows), rows


def test_one_command_prints_the_table_and_writes_json_and_html(
    horizon: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "horizon.html"
    given = ["--contenders", "mainspring", "--task", "support", "--steps", "3", "--runs", "1"]
    assert horizon.main([*given, "--no-faults", "--html", str(page)]) == 0
    table = capsys.readouterr().out
    assert "| mainspring | support | 3 | 1 | 100.0% |" in table, table
    assert "<svg" in page.read_text()
    assert horizon.main([*given, "--no-faults", "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    cell = json.loads(line)
    assert (cell["contender"], cell["succeeded"], cell["duplicate_effects"]) == ("mainspring", 1, 0)


@pytest.mark.skipif(
    not VENV_PYTHON.exists(),
    reason="no peer venv: `python bench/horizon/_venv.py` builds bench/.venv-horizon",
)
def test_a_peer_runner_plays_a_cell_through_run_suite(horizon: ModuleType) -> None:
    from mainspring.lab import run_suite

    (cell,) = run_suite(
        tasks=["support"], steps=[3], runs=1, workers=1, timeout_s=120.0,
        contender=horizon.contender("plain_loop", VENV_PYTHON), profile=horizon.profile(False),
    )  # fmt: skip
    assert (cell.contender, cell.succeeded, cell.failures) == ("plain_loop", 1, [])
    assert cell.model_calls >= 4  # three tickets and finish, the policy's errors on top


def test_a_sigterm_to_a_parallel_run_ends_its_contender_children(tmp_path: Path) -> None:
    # `timeout` or an operator stops the one command: its children, one per contender,
    # must not run on with the machine (their workers then exit by the harness watch).
    seed = str(900_000 + os.getpid() % 100_000)  # marks this test's children
    argv = [sys.executable, str(ROOT / "bench" / "horizon.py"), "--parallel", "--no-faults"]
    argv += ["--contenders", "mainspring,mainspring", "--task", "support", "--steps", "400"]
    argv += ["--runs", "1", "--seed", seed]
    parent = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def children() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except (OSError, ValueError):
                continue
            if b"--json" in cmdline and seed.encode() in cmdline and entry.name.isdigit():
                found.append(int(entry.name))
        return found

    deadline = time.monotonic() + 60
    while len(children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(children()) == 2, "the two contender children never started"
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert children() == []
