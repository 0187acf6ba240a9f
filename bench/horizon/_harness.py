"""The per-run-process loop for peer contenders (HORIZON.md's ``RunnerContender``,
written here until the horizon branch's lands).

For one cell (a contender, a task, a length): a fresh world file configured with the
cell's seed, kill rates and provider faults; the suite's model server in a thread of
this process; ``runs`` runs, each one runner process at a time
(``argv + --task --label --world --state --max-steps``), at most ``workers`` at once.
A runner that died of SIGKILL (a kill point) is started again with the same command; one
that exits 0 is done; one that exits otherwise gave up. A scripted reviewer approves
every approval request. Then each run is audited: it exited 0, the world's end state
is exact (``SuiteWorld.check``) and no effect happened twice (``duplicate_effects``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _common import CALLS, SuiteFaults, SuiteModelServer, repeated_after_restart

from mainspring.lab import TASKS, SuiteWorld, pass_hat_k, wilson

__all__ = ["PeerCell", "RunnerContender", "run_cell"]


@dataclass(frozen=True, slots=True)
class RunnerContender:
    """A contender run as one process per run: ``argv_prefix`` + the runner CLI."""

    name: str
    argv_prefix: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerCell:
    """What ``runs`` runs of one contender on one task and length did."""

    contender: str
    task: str
    steps: int
    items: int
    runs: int
    succeeded: int
    duplicate_effects: int
    gave_up: int
    model_calls: int
    tokens: int
    kills: int
    kills_by_phase: dict[str, int]
    restarts: int
    repeated_same_key: int
    repeated_new_key: int
    injected: dict[str, int]
    wall_s: float
    failures: list[str] = field(default_factory=list)

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.succeeded, self.runs)

    @property
    def pass_k(self) -> float | None:
        return pass_hat_k([(self.succeeded, self.runs)], self.runs)

    def per_success(self, total: int) -> float | None:
        return None if self.succeeded == 0 else total / self.succeeded

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "success_rate": self.succeeded / self.runs,
            "wilson95": list(self.interval),
            "pass_k": self.pass_k,
            "tokens_per_success": self.per_success(self.tokens),
            "calls_per_success": self.per_success(self.model_calls),
        }


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _repeated(state: Path, label: str) -> tuple[int, int]:
    try:
        lines = (state / f"{label}{CALLS}").read_text().splitlines()
    except FileNotFoundError:
        return 0, 0
    return repeated_after_restart([json.loads(line) for line in lines if line.strip()])


def run_cell(
    contender: RunnerContender,
    *,
    task: str,
    steps: int,
    runs: int,
    seed: int,
    kills: Any,
    provider: Any,
    workers: int = 2,
    timeout_s: float = 900.0,
    max_restarts: int = 200,
) -> PeerCell:
    """Run one cell and audit it (see the module's docstring)."""
    items = TASKS[task].items(steps)
    max_steps = steps * 3 + 30  # as the mainspring suite: the clean path three times over
    with tempfile.TemporaryDirectory(prefix=f"horizon-{contender.name}-") as tmp:
        where = Path(tmp)
        world = SuiteWorld(where / "world.db")
        faults = SuiteFaults(world.path)
        faults.configure(seed, kills, provider)
        labels = [f"{task}{steps}s{seed}r{i}" for i in range(runs)]
        for label in labels:
            world.add_run(task, label, items)
        server = SuiteModelServer(world.path).start()
        env = {
            **os.environ,
            "OPENAI_BASE_URL": server.base_url,
            "OPENAI_API_KEY": "sk-suite",
            "MAINSPRING_SUITE_CLIENT_TIMEOUT_S": str(server.client_timeout_s),
        }
        env.pop("PYTHONPATH", None)  # the peer venv's installed mainspring, not a tree
        started = time.monotonic()
        try:
            exits, restarts = _drive(
                contender, labels, task, world.path, where, env, max_steps, workers,
                faults, started + timeout_s, max_restarts,
            )  # fmt: skip
        finally:
            server.stop()
        wall = time.monotonic() - started
        failures: list[str] = []
        succeeded = 0
        for label in labels:
            code, log = exits[label]
            problems = world.check(label)
            if code != 0:
                problems.insert(0, f"{label}: runner {code}: {_tail(log)}")
            duplicated = world.duplicate_effects(label)
            if duplicated:
                problems.append(f"{label}: {duplicated} duplicate effect(s)")
            succeeded += not problems
            failures.extend(problems)
        repeated = [_repeated(where / "state", label) for label in labels]
        calls, tokens = world.model_calls()
        by_phase = faults.kills()
        cell = PeerCell(
            contender=contender.name,
            task=task,
            steps=steps,
            items=items,
            runs=runs,
            succeeded=succeeded,
            duplicate_effects=world.duplicate_effects(),
            gave_up=sum(code != 0 for code, _ in exits.values()),
            model_calls=calls,
            tokens=tokens,
            kills=sum(by_phase.values()),
            kills_by_phase=by_phase,
            restarts=restarts,
            repeated_same_key=sum(r[0] for r in repeated),
            repeated_new_key=sum(r[1] for r in repeated),
            injected=world.injected(),
            wall_s=round(wall, 2),
            failures=failures,
        )
        world.close()
        return cell


def _drive(
    contender: RunnerContender,
    labels: Sequence[str],
    task: str,
    world: str,
    where: Path,
    env: dict[str, str],
    max_steps: int,
    workers: int,
    faults: Any,
    deadline: float,
    max_restarts: int,
) -> tuple[dict[str, tuple[int | str, Path]], int]:
    """Keep ``workers`` runner processes going until every run exited for good."""
    waiting = list(labels)
    running: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    starts: dict[str, int] = {}
    exits: dict[str, tuple[int | str, Path]] = {}

    def start(label: str) -> None:
        starts[label] = starts.get(label, 0) + 1
        log = where / f"{label}.{starts[label]}.log"
        argv = [
            *contender.argv_prefix,
            "--task", task, "--label", label, "--world", world,
            "--state", str(where / "state"), "--max-steps", str(max_steps),
        ]  # fmt: skip
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        running[label] = (proc, log)

    try:
        while waiting or running:
            for label, key, _tool, _arguments in faults.pending():
                faults.answer(label, key, True)  # the scripted reviewer approves
            for label, (proc, log) in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                del running[label]
                if code == -signal.SIGKILL and starts[label] <= max_restarts:
                    start(label)
                else:
                    exits[label] = (code, log)
            while waiting and len(running) < workers:
                start(waiting.pop(0))
            if time.monotonic() > deadline:
                for label, (proc, log) in running.items():
                    proc.kill()
                    proc.wait(30)
                    exits[label] = ("timed out", log)
                for label in waiting:
                    exits[label] = ("never started", where / "none.log")
                break
            time.sleep(0.02)
    finally:
        for proc, _ in running.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    return exits, sum(starts.values()) - len(starts)
