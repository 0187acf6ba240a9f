"""The horizon suite: the quick sample passes under faults, the policy errs as asked,
the world counts a planted duplicate effect, and the CLI runs it."""

from __future__ import annotations

import json
import random
import sys

import pytest
from typer.testing import CliRunner

from mainspring import ConfigError
from mainspring.cli import cli
from mainspring.lab import (
    TASKS,
    KillRates,
    PolicyRates,
    ProviderFaults,
    RunnerContender,
    SuiteCell,
    SuiteProfile,
    SuiteWorld,
    decide,
    run_suite,
    suite_markdown,
)

runner = CliRunner()
_KINDS = ("malformed", "wrong_tool", "repeat", "forget")


def test_quick_suite_succeeds_under_kill_points_provider_faults_and_policy_errors() -> None:
    # The CLI's --quick sample: both tasks, 10 steps, 3 runs each; kill points at the
    # model, tool and commit points (denser than the default), 10 % provider faults with
    # a 1 s client timeout, the policy's default error rates.
    result = runner.invoke(cli, ["lab", "suite", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ok"] is True
    cells = report["cells"]
    assert [c["task"] for c in cells] == ["migrate", "support"]
    for cell in cells:
        assert cell["contender"] == "mainspring"
        assert cell["succeeded"] == cell["runs"] == 3, cell["failures"]
        assert cell["duplicate_effects"] == 0
        assert cell["kills"] == sum(cell["kills_by_phase"].values()) >= 1
        assert set(cell["kills_by_phase"]) == {"model", "tool", "commit"}
        assert cell["model_calls"] >= cell["items"] * 2 * cell["runs"]
        assert cell["pass_k"] == 1.0
        assert cell["wilson95"][1] == 1.0
    # The process and provider faults really happened, across the sample.
    assert sum(sum(c["provider_faults"].values()) for c in cells) >= 1
    assert {p for c in cells for p, n in c["kills_by_phase"].items() if n} >= {"model", "tool"}
    # The policy really erred, and mainspring's loop recovered from it.
    assert sum(sum(c["injected"].values()) for c in cells) >= 1


@pytest.mark.parametrize("kind", _KINDS)
def test_policy_injects_each_error_at_its_rate(kind: str) -> None:
    spec = TASKS["migrate"]
    result = json.dumps({"ok": True, "next": {"action": "write", "record": 7}})
    rates = PolicyRates(**{k: 0.25 if k == kind else 0.0 for k in _KINDS})
    rng = random.Random(3)
    made = [decide(spec, result, ("validate", '{"record": 7}'), rng, rates) for _ in range(2000)]
    errors = [m for m in made if m[2] is not None]
    assert {m[2] for m in errors} == {kind}
    assert 400 <= len(errors) <= 600  # 25 % of 2,000, seeded
    clean = [m for m in made if m[2] is None]
    assert all(m[:2] == ("write", '{"record": 7}') for m in clean)
    for tool, arguments, _ in errors:
        if kind == "malformed":
            assert tool == "write" and arguments != '{"record": 7}'
        elif kind == "wrong_tool":
            assert tool in ("validate", "checkpoint")
        elif kind == "repeat":
            assert (tool, arguments) == ("validate", '{"record": 7}')
        else:
            assert tool == "write" and json.loads(arguments)["record"] < 7


def test_policy_asks_the_world_when_it_lost_track() -> None:
    rates = PolicyRates(malformed=1.0, wrong_tool=0, repeat=0, forget=0)
    for seen in (None, "not json", json.dumps({"ok": True})):
        assert decide(TASKS["support"], seen, None, random.Random(0), rates) == (
            "progress",
            "{}",
            None,
        )


@pytest.mark.parametrize("task", ["migrate", "support"])
def test_a_plain_loop_over_the_world_finishes_despite_policy_errors(task: str, tmp_path) -> None:
    # The interface a peer runner uses: decide() plays the model, SuiteWorld.call the tools.
    world = SuiteWorld(tmp_path / "world.db")
    world.add_run(task, "b1", 12)
    rng, rates = (
        random.Random(5),
        PolicyRates(malformed=0.1, wrong_tool=0.1, repeat=0.1, forget=0.1),
    )
    last_result: str | None = None
    last_call: tuple[str, str] | None = None
    errors = 0
    for turn in range(400):
        tool, arguments, error = decide(TASKS[task], last_result, last_call, rng, rates)
        errors += error is not None
        if tool == "finish":
            break
        try:
            parsed = json.loads(arguments)
        except ValueError:
            last_result = "repair: the arguments are not JSON"
            continue
        if not isinstance(parsed.get(next(iter(parsed), ""), 0), int):
            last_result = "repair: the argument must be an integer"
            continue
        last_call = (tool, arguments)
        last_result = json.dumps(world.call("b1", tool, parsed, f"b1:{turn}"))
    assert tool == "finish"
    assert errors > 0
    assert world.check("b1") == []
    assert world.duplicate_effects() == 0
    world.close()


def test_the_world_counts_a_planted_duplicate_effect(tmp_path) -> None:
    world = SuiteWorld(tmp_path / "world.db")
    world.add_run("migrate", "m1", 2)
    world.add_run("support", "s1", 3)
    assert world.call("m1", "validate", {"record": 0}, "k1")["ok"]
    assert world.call("m1", "write", {"record": 0}, "k2")["ok"]
    assert world.call("m1", "write", {"record": 0}, "k3")["ok"] is False  # already written
    # A re-execution with the same key is deduplicated by the idempotent API ...
    assert world.asked_again() == 0
    world.ledger.apply("k2", "write", {"label": "m1", "item": 0})
    assert world.duplicate_effects() == 0
    assert world.asked_again() == 1  # asked again, applied once
    # ... but the same record written under another key is a duplicate effect.
    world.ledger.apply("k-planted", "write", {"label": "m1", "item": 0})
    assert world.duplicate_effects("m1") == 1
    # A refund has no deduplication: twice is twice.
    assert world.call("s1", "open_ticket", {"ticket": 2}, "k4")["ok"]
    refused = world.call("s1", "close_ticket", {"ticket": 2}, "k4b")  # the wrong tool
    assert refused["ok"] is False and "needs its refund" in refused["error"]
    assert world.call("s1", "refund", {"ticket": 2}, "k5")["ok"]
    world.ledger.apply_unsafe("refund:s1:2", "refund", {"label": "s1", "item": 2})
    assert world.duplicate_effects("s1") == 1
    assert world.duplicate_effects() == 2
    assert any("refund effects" in p for p in world.check("s1"))
    world.close()


def test_bad_input_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown task"):
        run_suite(tasks=["nope"], steps=[10], runs=1)
    with pytest.raises(ConfigError, match="runs"):
        run_suite(tasks=["migrate"], steps=[10], runs=0, profile=SuiteProfile())
    result = runner.invoke(cli, ["lab", "suite", "--task", "nope", "--quick"])
    assert result.exit_code != 0
    assert "unknown task" in result.output
    with pytest.raises(ConfigError, match="unknown contender 'langgraph'"):
        run_suite(tasks=["migrate"], steps=[10], runs=1, contender="langgraph")  # type: ignore[arg-type]
    result = runner.invoke(cli, ["lab", "suite", "--quick", "--contender", "langgraph"])
    assert result.exit_code != 0
    assert "NAME=COMMAND" in result.output
    result = runner.invoke(cli, ["lab", "suite", "--quick", "--kill-tool", "2"])
    assert result.exit_code != 0
    assert "KillRates.tool must be a probability" in result.output


# A peer's runner, as small as it gets: the official openai SDK in a plain loop, no
# persistence of its own (a restart begins the task again; the world remembers).
_PLAIN_LOOP = """
import argparse, json, os, sys, time
import openai
from mainspring.lab import TASKS, SuiteFaults, SuiteWorld

p = argparse.ArgumentParser()
for flag in ("--task", "--label", "--world", "--state", "--max-steps"):
    p.add_argument(flag, required=True)
args = p.parse_args()
world, faults, spec = SuiteWorld(args.world), SuiteFaults(args.world), TASKS[args.task]
timeout = float(os.environ["MAINSPRING_SUITE_CLIENT_TIMEOUT_S"])
client = openai.OpenAI(timeout=timeout, max_retries=10)  # OPENAI_BASE_URL, OPENAI_API_KEY
answer = {"type": "object", "properties": {"answer": {"type": "string"}}}
tools = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in
         [*((t.name, t.parameters) for t in spec.tools), ("finish", answer)]]
messages = [{"role": "user", "content": f"{args.task} batch {args.label}"}]
for _ in range(int(args.max_steps)):
    reply = client.chat.completions.create(model="horizon", messages=messages, tools=tools)
    faults.kill_point(args.label, "model")
    message = reply.choices[0].message
    call = message.tool_calls[0]
    name, raw = call.function.name, call.function.arguments
    if name == "finish":
        sys.exit(0)
    messages.append(message.model_dump(exclude_none=True))
    try:
        arguments = json.loads(raw)
    except ValueError:
        result = {"ok": False, "error": "the arguments are not JSON"}
    else:
        if any(t.name == name and t.approval for t in spec.tools):
            while faults.request_approval(args.label, call.id, name, raw) is None:
                time.sleep(0.05)
        result = world.call(args.label, name, arguments, call.id)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
sys.exit(1)
"""


def test_a_runner_contender_plays_a_cell_under_kills_and_provider_faults(tmp_path) -> None:
    script = tmp_path / "plain_loop.py"
    script.write_text(_PLAIN_LOOP)
    contender = RunnerContender("plain-loop", (sys.executable, str(script)))
    profile = SuiteProfile(
        kills=KillRates(model=0.08, tool=0.08, commit=0.0),
        provider=ProviderFaults(server_error=0.1, rate_limited=0.05, timeout=0.05, timeout_s=2),
    )
    cells = [
        run_suite(
            tasks=["support"],
            steps=[10],
            runs=2,
            seed=4,
            profile=profile,
            contender=contender,
            timeout_s=300,
        )[0]
        for _ in range(2)
    ]
    for cell in cells:
        assert cell.contender == "plain-loop"
        assert cell.succeeded == cell.runs == 2, cell.failures
        assert cell.duplicate_effects == 0
        assert cell.kills == sum(cell.kills_by_phase.values()) >= 1
        assert cell.kills_by_phase["commit"] == 0  # a plain loop commits nothing
        assert sum(cell.provider_faults.values()) >= 1
    # One process per run, and every draw seeded: the same seed, the same faults.
    assert cells[0].kills_by_phase == cells[1].kills_by_phase
    assert cells[0].provider_faults == cells[1].provider_faults
    assert cells[0].model_calls == cells[1].model_calls
    assert cells[0].injected == cells[1].injected
    table = suite_markdown(cells)
    assert "| plain-loop | support | 10 | 2 | 100.0%" in table


def test_a_runner_that_raises_is_named_by_its_exception_not_its_frames(tmp_path) -> None:
    script = tmp_path / "raises.py"
    script.write_text(
        "def call_model():\n    raise TimeoutError('the provider took too long')\n\n"
        "print('starting')\ncall_model()\n"
    )
    cell = run_suite(
        tasks=["migrate"], steps=[5], runs=1,
        profile=SuiteProfile(provider=ProviderFaults(timeout_s=1)),
        contender=RunnerContender("raiser", (sys.executable, str(script))),
    )[0]  # fmt: skip
    assert cell.succeeded == 0
    first = cell.failures[0]
    assert "runner exited 1: TimeoutError: the provider took too long (traceback in " in first
    assert "File " not in first and "call_model()" not in first


def test_a_cell_survives_its_json(tmp_path) -> None:
    cell = run_suite(
        tasks=["support"], steps=[3], runs=1,
        profile=SuiteProfile(kills=KillRates(0, 0, 0), provider=ProviderFaults(0, 0, 0)),
    )[0]  # fmt: skip
    data = json.loads(json.dumps(cell.to_dict()))
    assert SuiteCell.from_dict(data) == cell
    assert suite_markdown([SuiteCell.from_dict(data)]) == suite_markdown([cell])
    with pytest.raises(ConfigError, match="not a suite cell"):
        SuiteCell.from_dict({"task": "support"})


def test_a_runner_that_fails_fails_its_run(tmp_path) -> None:
    script = tmp_path / "gives_up.py"
    script.write_text("import sys\nprint('no model today')\nsys.exit(3)\n")
    cell = run_suite(
        tasks=["migrate"],
        steps=[5],
        runs=1,
        profile=SuiteProfile(provider=ProviderFaults(timeout_s=1)),
        contender=RunnerContender("quitter", (sys.executable, str(script))),
    )[0]
    assert cell.succeeded == 0
    assert "runner exited 3: no model today" in cell.failures[0]


def test_kill_before_commit_puts_a_point_before_each_commit_and_after_each_written_one(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --kill-before-commit: a SIGKILL may land before a commit (nothing written) as well
    # as after it (written, the worker never heard). The points are counted, not fired.
    from types import SimpleNamespace

    from mainspring.lab import SuiteFaults, _suite_app

    world = SuiteWorld(tmp_path / "world.db")
    world.add_run("migrate", "m1", 2)
    world.bind("m1", "run-1")
    monkeypatch.setenv("MAINSPRING_SUITE_WORLD", world.path)
    events: list[str] = []
    monkeypatch.setattr(
        SuiteFaults, "kill_point", lambda self, label, phase: events.append(f"{phase}:{label}")
    )

    class Inner:
        url = "sqlite:///nowhere"

        def commit(self, batch):
            events.append("commit")
            return [SimpleNamespace(ok=w.run_id != "refused") for w in batch]

    batch = [SimpleNamespace(run_id="run-1"), SimpleNamespace(run_id="refused")]
    world.add_run("migrate", "m2", 1)
    world.bind("m2", "refused")
    for before, expected in [
        (True, ["commit:m1", "commit:m2", "commit", "commit:m1"]),
        (False, ["commit", "commit:m1"]),  # only after a commit that wrote the run's rows
    ]:
        events.clear()
        store = _suite_app._KillingStore(Inner(), before=before)  # type: ignore[arg-type]
        store.commit(batch)
        assert events == expected, (before, events)
    world.close()


def test_a_cell_succeeds_with_kills_before_commits_too() -> None:
    (cell,) = run_suite(
        tasks=["migrate"], steps=[4], runs=2, seed=3, timeout_s=300,
        profile=SuiteProfile(
            kills=KillRates(model=0.0, tool=0.0, commit=0.08), kill_before_commit=True,
            provider=ProviderFaults(0, 0, 0),
        ),
    )  # fmt: skip
    assert cell.succeeded == cell.runs == 2, cell.failures
    assert cell.duplicate_effects == 0
    assert cell.kills_by_phase["commit"] >= 1
