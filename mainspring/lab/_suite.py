"""The horizon suite: long agent tasks under model, provider and process faults.

Tasks ``migrate``, ``support``, ``reconcile`` and ``research`` (see :mod:`._tasks`
for the task, policy and world interface a peer runner reuses).
For each task and length, :func:`run_suite` submits ``runs`` runs of the task's
agent (mainspring's defaults, with a step budget sized to the task), keeps worker
processes busy on them, SIGKILLs one about every ``kill_every`` model calls (counted
over the runs in flight) and starts a replacement, answers every approval as a
scripted reviewer, and audits each run: it succeeded, the world's end state is exact
and no effect happened twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import ConfigError, MainspringError
from ._stats import pass_hat_k, wilson
from ._suite_app import build_app
from ._tasks import TASKS, PolicyRates, SuiteWorld

__all__ = ["PRICE_PER_MTOK", "SuiteCell", "SuiteProfile", "run_suite", "suite_markdown"]

_APP_SPEC = "mainspring.lab._suite_app:app"

#: The price the suite's cost assumes, in USD per million tokens, for every token:
#: gpt-4.1-mini's input price (the lab's ``LabProfile.price_in``). The world counts
#: input and output tokens together; a reply is one short tool call, so nearly all
#: of them are input (the history re-sent on every call).
PRICE_PER_MTOK = 0.40


@dataclass(frozen=True, slots=True, kw_only=True)
class SuiteProfile:
    """The faults of a suite run.

    Attributes:
        transient: the share of model calls that fail with a transient error.
        kill_every: SIGKILL a worker about every this many model calls (0: never).
        policy: the policy's own error rates.
        model_attempts: attempts of each model call (``None``: mainspring's default
            ``model_retry``).
    """

    transient: float = 0.1
    kill_every: int = 50
    policy: PolicyRates = field(default_factory=PolicyRates)
    model_attempts: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SuiteCell:
    """One task at one length: what ``runs`` runs did."""

    task: str
    steps: int
    items: int
    runs: int
    succeeded: int
    duplicate_effects: int
    model_calls: int
    tokens: int
    kills: int
    injected: dict[str, int]
    wall_s: float
    failures: list[str] = field(default_factory=list)

    @property
    def success_rate(self) -> float:
        return self.succeeded / self.runs

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.succeeded, self.runs)

    @property
    def pass_k(self) -> float | None:
        return pass_hat_k([(self.succeeded, self.runs)], self.runs)

    def per_success(self, total: int) -> float | None:
        return None if self.succeeded == 0 else total / self.succeeded

    @property
    def cost_per_success(self) -> float | None:
        """USD of the model's tokens per success, every token at :data:`PRICE_PER_MTOK`."""
        tokens = self.per_success(self.tokens)
        return None if tokens is None else tokens * PRICE_PER_MTOK / 1_000_000

    def to_dict(self) -> dict[str, Any]:
        low, high = self.interval
        return {
            **asdict(self),
            "success_rate": self.success_rate,
            "wilson95": [low, high],
            "pass_k": self.pass_k,
            "tokens_per_success": self.per_success(self.tokens),
            "calls_per_success": self.per_success(self.model_calls),
            "cost_per_success_usd": self.cost_per_success,
        }


def run_suite(
    *,
    tasks: Sequence[str] = ("migrate", "support"),
    steps: Sequence[int] = (10, 100),
    runs: int = 20,
    seed: int = 0,
    profile: SuiteProfile | None = None,
    workers: int = 2,
    timeout_s: float = 900.0,
    progress: Callable[[SuiteCell], None] | None = None,
) -> list[SuiteCell]:
    """Run every task at every length ``runs`` times under ``profile``.

    Raises:
        ConfigError: an unknown task, a count below 1, or runs that did not finish
            within ``timeout_s``.
    """
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ConfigError(f"unknown task(s) {unknown!r}; the suite has {sorted(TASKS)}")
    if runs < 1 or workers < 1 or not steps or min(steps) < 1:
        raise ConfigError(
            f"the suite needs runs, workers and steps >= 1; got runs={runs!r}, "
            f"workers={workers!r}, steps={list(steps)!r}"
        )
    profile = profile or SuiteProfile()
    cells = []
    for task in tasks:
        for n in steps:
            cell = _cell(task, n, runs, seed, profile, workers, timeout_s)
            cells.append(cell)
            if progress is not None:
                progress(cell)
    return cells


def _spawn(env: dict[str, str], log: Path, concurrency: int) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mainspring",
                "worker",
                _APP_SPEC,
                "--concurrency",
                str(concurrency),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _cell(
    task: str,
    steps: int,
    runs: int,
    seed: int,
    profile: SuiteProfile,
    workers: int,
    timeout_s: float,
) -> SuiteCell:
    spec = TASKS[task]
    items = spec.items(steps)
    with tempfile.TemporaryDirectory(prefix="mainspring-suite-") as tmp:
        where = Path(tmp)
        url = f"sqlite:///{where / 'suite.db'}"
        world = SuiteWorld(where / "world.db")
        rates = {**asdict(profile.policy), "transient": profile.transient}
        env = {
            **os.environ,
            "MAINSPRING_DATABASE_URL": url,
            "MAINSPRING_SUITE_WORLD": world.path,
            "MAINSPRING_SUITE_SEED": str(seed),
            "MAINSPRING_SUITE_RATES": json.dumps(rates),
            # Room for the clean path three times over: errors cost turns.
            "MAINSPRING_SUITE_MAX_STEPS": str(int(steps * 3 + 30)),
        }
        if profile.model_attempts is not None:
            env["MAINSPRING_SUITE_MODEL_ATTEMPTS"] = str(profile.model_attempts)
        app = build_app(url)
        labels: dict[str, str] = {}
        try:
            for i in range(runs):
                label = f"s{seed}r{i}{uuid.uuid4().hex[:6]}"
                world.add_run(task, label, items)
                run_id = app.submit(task, f"{task} batch {label}").run_id
                world.bind(label, run_id)
                labels[run_id] = label
            started = time.monotonic()
            kills = _drive(app, world, env, where, labels, profile, workers, timeout_s)
            wall = time.monotonic() - started
            return _audit(app, world, task, steps, items, labels, kills, wall)
        finally:
            app.close()
            world.close()


def _drive(
    app: Any,
    world: SuiteWorld,
    env: dict[str, str],
    where: Path,
    labels: dict[str, str],
    profile: SuiteProfile,
    workers: int,
    timeout_s: float,
) -> int:
    concurrency = max(2, len(labels) // workers + 1)
    procs = [_spawn(env, where / f"worker-{i}.log", concurrency) for i in range(workers)]
    kills, next_kill = 0, profile.kill_every
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            for request in app.requests():
                if request.run_id in labels:
                    # The scripted reviewer approves every request (one answered
                    # already, or whose run moved on, is left alone).
                    with contextlib.suppress(MainspringError):
                        app.answer(request.run_id, request.id, decision="approve", by="reviewer")
            calls, _ = world.model_calls()
            if profile.kill_every and calls >= next_kill:
                alive = [p for p in procs if p.poll() is None]
                if alive:
                    victim = alive[kills % len(alive)]
                    victim.send_signal(signal.SIGKILL)
                    victim.wait(30)
                    kills += 1
                next_kill = calls + profile.kill_every
            for i, proc in enumerate(procs):
                if proc.poll() is not None:  # a supervisor restarts the dead
                    procs[i] = _spawn(env, where / f"worker-r{kills}-{i}.log", concurrency)
            if all(app.get_run(r).finished for r in labels):
                return kills
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"suite: the runs did not finish within {timeout_s}s; logs in {where}"
                )
            time.sleep(0.05)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)


def _audit(
    app: Any,
    world: SuiteWorld,
    task: str,
    steps: int,
    items: int,
    labels: dict[str, str],
    kills: int,
    wall: float,
) -> SuiteCell:
    succeeded = 0
    failures: list[str] = []
    for run_id, label in labels.items():
        record = app.get_run(run_id)
        problems = world.check(label)
        if record.status != "succeeded":
            problems.insert(0, f"{label}: run {run_id} ended {record.status}: {record.error}")
        duplicated = world.duplicate_effects(label)
        if duplicated:
            problems.append(f"{label}: {duplicated} duplicate effect(s)")
        succeeded += not problems
        failures.extend(problems)
    calls, tokens = world.model_calls()
    return SuiteCell(
        task=task,
        steps=steps,
        items=items,
        runs=len(labels),
        succeeded=succeeded,
        duplicate_effects=world.duplicate_effects(),
        model_calls=calls,
        tokens=tokens,
        kills=kills,
        injected=world.injected(),
        wall_s=round(wall, 2),
        failures=failures,
    )


def suite_markdown(cells: Sequence[SuiteCell]) -> str:
    """The suite's table in markdown (cost per success at :data:`PRICE_PER_MTOK`)."""
    lines = [
        "| task | steps | runs | success | Wilson 95 % | pass^k | duplicate effects "
        "| model calls / success | tokens / success | $ / success | kills | policy errors "
        "| wall s |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        low, high = c.interval
        pk = "n/a" if c.pass_k is None else f"{c.pass_k:.2f}"
        calls = c.per_success(c.model_calls)
        tokens = c.per_success(c.tokens)
        cost = c.cost_per_success
        lines.append(
            f"| {c.task} | {c.steps} | {c.runs} | {c.success_rate:.1%} "
            f"| {low:.1%} – {high:.1%} | {pk} | {c.duplicate_effects} "
            f"| {'—' if calls is None else f'{calls:.1f}'} "
            f"| {'—' if tokens is None else f'{tokens:,.0f}'} "
            f"| {'—' if cost is None else f'{cost:.4f}'} | {c.kills} "
            f"| {sum(c.injected.values())} | {c.wall_s:.1f} |"
        )
    return "\n".join(lines)
