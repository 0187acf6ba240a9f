"""``run_lab``: every policy over every chain length, and the figures of each cell."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import ConfigError
from ._chain import TrialOutcome, run_trials
from ._profile import POLICIES, LabProfile, Policy
from ._stats import pass_hat_k, theory_success, wilson

__all__ = ["PASS_K", "Cell", "LabResult", "TrialFailure", "check_trials", "parse_steps", "run_lab"]

PASS_K: tuple[int, ...] = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """The figures of one policy on one chain length.

    Attributes:
        success_rate / ci_low / ci_high: successes over trials, with its 95 % Wilson interval.
        theory: the independent-fault prediction for this policy (``p^n`` with no
            retries, ``(1-(1-p)^(r+1))^n`` with r retries), ``None`` where no closed
            form applies (crashes resumed, correlated faults, output validation).
        pass_k: tau-bench's pass^k for k = 1, 2, 4, 8 (``None`` with too few repeats).
        steps_to_failure: mean steps completed before the first unrecovered failure,
            over the failed trials (``None`` when none failed).
        causes: failures by cause.
        cost_per_success: USD of model calls over all trials, per successful trial.
    """

    policy: Policy
    steps: int
    trials: int
    successes: int
    success_rate: float
    ci_low: float
    ci_high: float
    theory: float | None
    pass_k: dict[int, float | None]
    steps_to_failure: float | None
    recoveries: int
    duplicate_effects: int
    tokens: int
    cost_usd: float
    cost_per_success: float | None
    tokens_per_success: float | None
    causes: dict[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialFailure:
    """One failed trial of ``mainspring lab run``: why, and the run to look at.

    Attributes:
        policy / task / repeat: which trial.
        cause: the failure cause (as counted in the cell's ``causes``).
        error: the run's error or what stopped the trial, in a line.
        run_id: the trial's run.
        database: the URL of the trial's store when it was kept (``keep=``, or the CLI's
            ``--out``): ``mainspring show RUN --db URL`` shows it; ``None`` otherwise.
    """

    policy: Policy
    task: int
    repeat: int
    cause: str
    error: str
    run_id: str
    database: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LabResult:
    """Every cell of one experiment, with what produced it."""

    profile: LabProfile
    seed: int
    tasks: int
    repeats: int
    steps: tuple[int, ...]
    policies: tuple[Policy, ...]
    cells: tuple[Cell, ...] = field(default=())
    target: str | None = None  # the workflow run (`mainspring lab run`); None: the chain
    live: bool = False  # `lab run`: the target's write/irreversible tools really ran
    stubbed: tuple[str, ...] = ()  # `lab run`: the tools whose effects were stubbed
    failures: tuple[TrialFailure, ...] = ()  # `lab run`: every failed trial, and why

    def cell(self, policy: Policy, steps: int) -> Cell:
        for c in self.cells:
            if c.policy == policy and c.steps == steps:
                return c
        raise KeyError((policy, steps))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (what ``mainspring lab --json`` prints)."""
        return {
            "target": self.target,
            "profile": asdict(self.profile),
            "seed": self.seed,
            "tasks": self.tasks,
            "repeats": self.repeats,
            "steps": list(self.steps),
            "policies": list(self.policies),
            "cells": [
                {**asdict(c), "pass_k": {str(k): v for k, v in c.pass_k.items()}}
                for c in self.cells
            ],
            "live": self.live,
            "stubbed": list(self.stubbed),
            "failures": [asdict(f) for f in self.failures],
        }


def parse_steps(text: str) -> tuple[int, ...]:
    """``"3,5,8"`` → ``(3, 5, 8)``; a clear error names what is wrong."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            n = int(part)
        except ValueError:
            raise ConfigError(
                f"--steps must be a comma-separated list of step counts like 3,5,8; "
                f"{part!r} in {text!r} is not an integer"
            ) from None
        if not 1 <= n <= 1000:
            raise ConfigError(f"--steps: each step count must be within 1..1000, got {n!r}")
        out.append(n)
    return tuple(sorted(set(out)))


def _theory(policy: Policy, profile: LabProfile, steps: int) -> float | None:
    """The closed form for independent faults, where one exists."""
    model = profile.model_error_rate + profile.timeout_rate + profile.malformed_rate
    tool = profile.tool_failure_rate
    if profile.correlated_rate:
        return None  # faults shared by a task's trials are not independent
    if policy == "naive":
        return theory_success(profile.step_error_rate, steps)
    if profile.crash_rate or profile.malformed_rate:
        return None  # crashes resumed, outputs repaired: no closed form
    r = profile.retries
    if tool == 0.0:
        return theory_success(model, steps, r)
    # the model call and the tool call each have their own retries
    stage = theory_success(model, 1, r) * theory_success(tool, 1, r)
    return float(stage**steps)


def summarise(
    policy: Policy, profile: LabProfile, steps: int, outs: Sequence[TrialOutcome]
) -> Cell:
    n = len(outs)
    wins = sum(o.success for o in outs)
    low, high = wilson(wins, n)
    per_task: dict[int, list[int]] = {}
    for o in outs:
        per_task.setdefault(o.task, [0, 0])
        per_task[o.task][0] += o.success
        per_task[o.task][1] += 1
    counts = [(c, t) for c, t in per_task.values()]
    failed = [o for o in outs if not o.success]
    cost = sum(o.cost_usd for o in outs)
    tokens = sum(o.tokens for o in outs)
    return Cell(
        policy=policy,
        steps=steps,
        trials=n,
        successes=wins,
        success_rate=wins / n if n else 0.0,
        ci_low=low,
        ci_high=high,
        theory=_theory(policy, profile, steps),
        pass_k={k: pass_hat_k(counts, k) for k in PASS_K},
        steps_to_failure=(sum(o.steps_done for o in failed) / len(failed)) if failed else None,
        recoveries=sum(o.recoveries for o in outs),
        duplicate_effects=sum(o.duplicate_effects for o in outs),
        tokens=tokens,
        cost_usd=round(cost, 6),
        cost_per_success=round(cost / wins, 6) if wins else None,
        tokens_per_success=tokens / wins if wins else None,
        causes=dict(Counter(o.cause for o in failed if o.cause is not None)),
    )


def check_trials(policies: Sequence[Policy], trials: int, repeats: int) -> None:
    """Refuse what no experiment can run, before any trial: ``trials`` that are not a
    positive multiple of ``repeats`` (they are ``trials / repeats`` tasks, each tried
    ``repeats`` times) or a policy the lab does not know. Both experiments (the
    simulated chains here, a real workflow in ``._target``) take these counts.

    Raises:
        ConfigError: says which count or policy.
    """
    if repeats < 1 or trials < repeats or trials % repeats:
        raise ConfigError(
            f"trials={trials!r} must be a positive multiple of repeats={repeats!r} "
            "(each task is tried `repeats` times)"
        )
    for policy in policies:
        if policy not in POLICIES:
            raise ConfigError(f"unknown policy {policy!r}: choose from {', '.join(POLICIES)}")


def run_lab(
    profile: LabProfile,
    *,
    steps: Sequence[int] = (3, 5, 8, 12, 20),
    policies: Sequence[Policy] = POLICIES,
    trials: int = 1000,
    repeats: int = 10,
    seed: int = 42,
    progress: Callable[[Policy, int], None] | None = None,
) -> LabResult:
    """Run every policy on every chain length: ``trials`` trials each, as
    ``trials / repeats`` tasks tried ``repeats`` times (for pass^k).

    Raises:
        ConfigError: ``trials`` is not a positive multiple of ``repeats``, or a policy
            or step count is unknown.
    """
    check_trials(policies, trials, repeats)
    if not steps or any(int(n) < 1 for n in steps):
        raise ConfigError(f"steps must be positive step counts, got {list(steps)!r}")
    cells = []
    for policy in policies:
        for n in steps:
            outs = run_trials(policy, profile, int(n), trials // repeats, repeats, seed)
            cells.append(summarise(policy, profile, int(n), outs))
            if progress is not None:
                progress(policy, int(n))
    return LabResult(
        profile=profile,
        seed=seed,
        tasks=trials // repeats,
        repeats=repeats,
        steps=tuple(int(n) for n in steps),
        policies=tuple(policies),
        cells=tuple(cells),
    )
