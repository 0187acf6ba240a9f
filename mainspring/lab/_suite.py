"""The horizon suite: long agent tasks under model, provider and process faults.

Tasks ``migrate``, ``support``, ``reconcile`` and ``research`` (see :mod:`._tasks`
for the task, policy and world interface a peer runner reuses).
For each task and length, :func:`run_suite` sets up the cell's world (a SQLite file:
the runs' items, the effect ledger, the fault counts), configures its faults
(:class:`~mainspring.lab.SuiteFaults`), starts its provider
(:class:`~mainspring.lab.SuiteModelServer`, OpenAI's wire on 127.0.0.1), and has the
contender play ``runs`` runs: mainspring's worker pool, or a peer's runner script
(:class:`~mainspring.lab.RunnerContender`). The kill points SIGKILL the contender's
processes at the model, tool and commit points; the harness restarts them, answers
every approval as a scripted reviewer, and audits each run: it ended well, the world's
end state is exact and no effect happened twice.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .. import ConfigError, MissingExtra
from ._stats import pass_hat_k, wilson
from ._suite_contenders import (
    AppContender,
    CellDrive,
    Contender,
    RunnerContender,
    child_env,
    contender_name,
    drive_mainspring,
    drive_runners,
)
from ._suite_faults import KillRates, ProviderFaults
from ._suite_model import SuiteModelServer
from ._tasks import TASKS, PolicyRates, SuiteWorld

__all__ = ["PRICE_PER_MTOK", "SuiteCell", "SuiteProfile", "run_suite", "suite_markdown"]

#: The price the suite's cost assumes, in USD per million tokens, for every token:
#: gpt-4.1-mini's input price (the lab's ``LabProfile.price_in``). The world counts
#: input and output tokens together; a reply is one short tool call, so nearly all
#: of them are input (the history re-sent on every call).
PRICE_PER_MTOK = 0.40


@dataclass(frozen=True, slots=True, kw_only=True)
class SuiteProfile:
    """The faults of a suite run.

    Attributes:
        kills: the kill points' rates (per event, by phase).
        provider: the provider's faults (per model request).
        policy: the policy's own error rates.
        kill_every: also SIGKILL a contender process from outside about every this many
            paid model calls (0: never; the kill points are the default process faults).
        kill_before_commit: mainspring only: a ``"commit"`` kill point right before each
            commit too (after it, always).
        model_attempts: mainspring only: attempts of each model call (``None``:
            mainspring's default ``model_retry``).
    """

    kills: KillRates = field(default_factory=KillRates)
    provider: ProviderFaults = field(default_factory=ProviderFaults)
    policy: PolicyRates = field(default_factory=PolicyRates)
    kill_every: int = 0
    kill_before_commit: bool = False
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
    contender: str = "mainspring"
    kills_by_phase: dict[str, int] = field(default_factory=dict)
    provider_faults: dict[str, int] = field(default_factory=dict)
    asked_again: int = 0
    """Tool calls whose idempotency key had been called before: effects asked again
    (after a kill, a retry, a resume) that the world applied once."""

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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SuiteCell:
        """The cell :meth:`to_dict` (or ``--json``) wrote; derived figures are ignored.

        Raises:
            ConfigError: a field the cell needs is missing.
        """
        names = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in names})
        except TypeError as e:
            raise ConfigError(f"not a suite cell ({e}): {sorted(data)}") from None

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
    timeout_s: float | None = None,
    contender: Contender = "mainspring",
    progress: Callable[[SuiteCell], None] | None = None,
) -> list[SuiteCell]:
    """Run every task at every length ``runs`` times under ``profile``.

    Args:
        contender: ``"mainspring"`` (a pool of ``workers`` worker processes), an
            :class:`AppContender` (the same, running another App), or a
            :class:`RunnerContender` (one process per run, ``workers`` at once).
        timeout_s: a cell's time; runs unfinished by then fail (``None``: 900 s plus
            5 s a step, room for the default profile's 30 s timeouts).

    Raises:
        ConfigError: an unknown task or contender, or a count below 1.
        MissingExtra: the ``openai`` SDK is missing (mainspring's agents talk to the
            suite's provider through it, as they would to OpenAI).
    """
    if contender == "mainspring" and importlib.util.find_spec("openai") is None:
        # Said once, here, rather than as every run's failure.
        raise MissingExtra("the horizon suite", "lab", "openai")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ConfigError(f"unknown task(s) {unknown!r}; the suite has {sorted(TASKS)}")
    if runs < 1 or workers < 1 or not steps or min(steps) < 1:
        raise ConfigError(
            f"the suite needs runs, workers and steps >= 1; got runs={runs!r}, "
            f"workers={workers!r}, steps={list(steps)!r}"
        )
    contender_name(contender)
    profile = profile or SuiteProfile()
    cells = []
    for task in tasks:
        for n in steps:
            limit = 900.0 + 5.0 * n if timeout_s is None else timeout_s
            cell = _cell(task, n, runs, seed, profile, workers, limit, contender)
            cells.append(cell)
            if progress is not None:
                progress(cell)
    return cells


def labels_for(task: str, steps: int, seed: int, runs: int) -> list[str]:
    """The cell's run labels: the same for the same cell and seed (they seed the draws)."""
    return [f"{task}{steps}s{seed}r{i}" for i in range(runs)]


def _cell(
    task: str,
    steps: int,
    runs: int,
    seed: int,
    profile: SuiteProfile,
    workers: int,
    timeout_s: float,
    contender: Contender,
) -> SuiteCell:
    items = TASKS[task].items(steps)
    with tempfile.TemporaryDirectory(prefix="mainspring-suite-") as tmp:
        where = Path(tmp)
        world = SuiteWorld(where / "world.db")
        world.faults.configure(seed, profile.kills, profile.provider, policy=asdict(profile.policy))
        labels = labels_for(task, steps, seed, runs)
        for label in labels:
            world.add_run(task, label, items)
        server = SuiteModelServer(world.path).start()
        # Room for the clean path three times over: errors cost turns.
        max_steps = int(steps * 3 + 30)
        env = {
            **child_env(server.base_url, server.client_timeout_s),
            "MAINSPRING_SUITE_WORLD": world.path,
            "MAINSPRING_SUITE_MAX_STEPS": str(max_steps),
        }
        drive = CellDrive(
            task=task,
            labels=labels,
            world=world,
            env=env,
            where=where,
            workers=workers,
            timeout_s=timeout_s,
            max_steps=max_steps,
            kill_every=profile.kill_every,
        )
        try:
            started = time.monotonic()
            if isinstance(contender, RunnerContender):
                outcome = drive_runners(drive, contender)
            else:
                outcome = drive_mainspring(
                    drive,
                    model_attempts=profile.model_attempts,
                    kill_before_commit=profile.kill_before_commit,
                    other=contender if isinstance(contender, AppContender) else None,
                )
            wall = time.monotonic() - started
            return _audit(drive, steps, items, outcome, contender_name(contender), wall)
        finally:
            server.stop()
            world.close()


def _audit(
    drive: CellDrive,
    steps: int,
    items: int,
    outcome: dict[str, str | None],
    contender: str,
    wall: float,
) -> SuiteCell:
    world = drive.world
    succeeded = 0
    failures: list[str] = []
    for label in drive.labels:
        problems = world.check(label)
        ended = outcome.get(label, "never ran")
        if ended is not None:
            problems.insert(0, f"{label}: {ended}")
        duplicated = world.duplicate_effects(label)
        if duplicated:
            problems.append(f"{label}: {duplicated} duplicate effect(s)")
        succeeded += not problems
        failures.extend(problems)
    calls, tokens = world.model_calls()
    by_phase = world.faults.kills()
    if drive.external_kills:
        by_phase["external"] = drive.external_kills
    return SuiteCell(
        task=drive.task,
        steps=steps,
        items=items,
        runs=len(drive.labels),
        succeeded=succeeded,
        duplicate_effects=world.duplicate_effects(),
        model_calls=calls,
        tokens=tokens,
        kills=sum(by_phase.values()),
        injected=world.injected(),
        wall_s=round(wall, 2),
        failures=failures,
        contender=contender,
        kills_by_phase=by_phase,
        provider_faults=world.faults.provider_faults(),
        asked_again=world.asked_again(),
    )


def suite_markdown(cells: Sequence[SuiteCell]) -> str:
    """The suite's table in markdown (kills as model / tool / commit, plus external
    ones when there were; provider faults as 5xx / 429 / timeout; cost per success at
    :data:`PRICE_PER_MTOK`)."""
    lines = [
        "| contender | task | steps | runs | success | Wilson 95 % | pass^k "
        "| duplicate effects | effects asked again | model calls / success "
        "| tokens / success | $ / success "
        "| kills (model/tool/commit) | provider faults (5xx/429/timeout) "
        "| policy errors | wall s |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for c in cells:
        low, high = c.interval
        pk = "n/a" if c.pass_k is None else f"{c.pass_k:.2f}"
        calls = c.per_success(c.model_calls)
        tokens = c.per_success(c.tokens)
        cost = c.cost_per_success
        k = c.kills_by_phase
        kills = f"{c.kills} ({k.get('model', 0)}/{k.get('tool', 0)}/{k.get('commit', 0)}"
        kills += f", {k['external']} external)" if k.get("external") else ")"
        f = c.provider_faults
        faults = (
            f"{sum(f.values())} ({f.get('server_error', 0)}/{f.get('rate_limited', 0)}"
            f"/{f.get('timeout', 0)})"
        )
        lines.append(
            f"| {c.contender} | {c.task} | {c.steps} | {c.runs} | {c.success_rate:.1%} "
            f"| {low:.1%} – {high:.1%} | {pk} | {c.duplicate_effects} | {c.asked_again} "
            f"| {'—' if calls is None else f'{calls:.1f}'} "
            f"| {'—' if tokens is None else f'{tokens:,.0f}'} "
            f"| {'—' if cost is None else f'{cost:.4f}'} | {kills} | {faults} "
            f"| {sum(c.injected.values())} | {c.wall_s:.1f} |"
        )
    return "\n".join(lines)
