"""The horizon benchmark's peer runners (bench/horizon/): their CLI, and the stand-ins
for the horizon branch's faults and model server. The benchmark itself is not a test
(bench/horizon.py runs it); the runners' CLI needs the peer venv, which CI lacks."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
HORIZON = ROOT / "bench" / "horizon"
VENV_PYTHON = ROOT / "bench" / ".venv-horizon" / "bin" / "python"
RUNNERS = ("plain_loop.py", "langgraph_agent.py", "agents_sdk.py")


@pytest.fixture
def common(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """bench/horizon/_common.py, imported from its directory, forgotten afterwards."""
    monkeypatch.syspath_prepend(str(HORIZON))
    for name in ("_common", "_standins"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import _common

    yield _common
    for name in ("_common", "_standins"):
        sys.modules.pop(name, None)


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


def test_effects_asked_again_after_a_restart_are_told_apart_by_key(common: ModuleType) -> None:
    def note(pid: int, tool: str, item: int, key: str) -> dict[str, Any]:
        return {"pid": pid, "tool": tool, "arguments": {"record": item}, "key": key}

    notes = [
        note(1, "validate", 0, "a"),
        note(1, "write", 0, "b"),  # killed here
        note(2, "write", 0, "b"),  # replayed under the same key (a checkpointer)
        note(2, "write", 1, "c"),  # killed here
        note(3, "progress", 0, "d"),
        note(3, "write", 1, "e"),  # asked again by the model: a new key
        note(3, "write", 1, "f"),  # the same process repeating itself: not a restart
        note(4, "validate", 2, "g"),  # a restart that moved on
        note(4, "write", 2, "h"),
    ]
    assert common.repeated_after_restart(notes) == (1, 1)


def test_standin_approvals_are_asked_once_and_answered(common: ModuleType, tmp_path: Path) -> None:
    if not common.STANDINS:
        pytest.skip("mainspring.lab has the real SuiteFaults: the stand-ins are not used")
    faults = common.SuiteFaults(tmp_path / "world.db")
    assert faults.request_approval("b1", "call_1", "refund", '{"ticket": 2}') is None
    assert faults.request_approval("b1", "call_1", "refund", '{"ticket": 2}') is None
    assert faults.pending() == [("b1", "call_1", "refund", '{"ticket": 2}')]
    faults.answer("b1", "call_1", True)
    assert faults.request_approval("b1", "call_1", "refund", "{}") == "approved"
    assert faults.pending() == []


def test_standin_kill_point_is_a_noop_unconfigured_and_kills_when_drawn(
    common: ModuleType, tmp_path: Path
) -> None:
    if not common.STANDINS:
        pytest.skip("mainspring.lab has the real SuiteFaults: the stand-ins are not used")
    world = tmp_path / "world.db"
    faults = common.SuiteFaults(world)
    faults.kill_point("b1", "model")  # never configured: nothing happens
    faults.configure(7, common.KillRates(model=1.0, tool=0.0, commit=0.0), common.ProviderFaults())
    code = (
        f"import sys; sys.path[:0] = [{str(HORIZON)!r}, {str(ROOT)!r}]\n"
        "from _standins import SuiteFaults\n"
        f"SuiteFaults({str(world)!r}).kill_point('b1', 'tool')\n"
        f"SuiteFaults({str(world)!r}).kill_point('b1', 'model')\n"
        "print('survived')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "survived" not in proc.stdout
    assert faults.kills() == {"model": 1}


def test_standin_server_plays_the_policy_over_the_openai_sdk(
    common: ModuleType, tmp_path: Path
) -> None:
    if not common.STANDINS:
        pytest.skip("mainspring.lab has the real SuiteModelServer: the stand-ins are not used")
    openai = pytest.importorskip("openai")
    from mainspring.lab import TASKS, SuiteWorld

    world = SuiteWorld(tmp_path / "world.db")
    world.add_run("support", "b1", 3)
    faults = common.SuiteFaults(world.path)
    faults.configure(0, common.KillRates(0, 0, 0), common.ProviderFaults(0, 0, 0))
    with common.SuiteModelServer(world.path) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-suite", timeout=10)
        messages: list[Any] = [{"role": "user", "content": "support batch b1"}]
        reply = client.chat.completions.create(
            model="m", messages=messages, tools=common.openai_tools(TASKS["support"])
        )
    call = reply.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("progress", {})
    assert world.model_calls("b1")[0] == 1


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
