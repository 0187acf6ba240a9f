"""Seed 000's sandbox, generalised: an n-step chain run under injected faults.

Each step of the chain asks a model for ``value + 1`` (seed 000's ``RandomModel``)
and then applies the result to the outside world through a tool (a write with an
effect). Every fault is drawn from the experiment's seed, the trial and the
attempt, so a trial meets the same faults under every policy (common random
numbers) and a rerun reproduces every figure.

The policies ``naive`` and ``retries`` are plain loops, as such scripts are written.
``checkpoint``, ``validate`` and ``mainspring`` run the chain as a real mainspring
workflow on a SQLite store: journaled steps, the App's retry policy, a worker
that dies in the middle of a step (the executor is torn down with a
``BaseException``, leaving the intent row and the lease behind) and a claim of the
expired lease that replays the journal, exactly as after a SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .. import App, RunFailed, StepTimeout, TransientError
from ..journal import RetryPolicy, RunContext, current_step
from ..storage import SQLiteStore
from ..testing import SimulatedCrash
from ._profile import FailureCause, LabProfile, Policy

__all__ = ["InstantClock", "TrialOutcome", "run_trials"]


class InstantClock:
    """A clock on which every sleep returns at once, moving time forward by its length.

    Back-offs, timeouts and lease expiries cost simulated seconds, never real ones.
    """

    def __init__(self, start: float = 1_767_225_600.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        self._now += max(0.0, float(seconds))
        await asyncio.sleep(0)

    def jump(self, seconds: float) -> None:
        self._now += max(0.0, float(seconds))


@dataclass(slots=True, kw_only=True)
class TrialOutcome:
    """One trial of one policy.

    Attributes:
        task / repeat: which task, and which of its repeated trials.
        success: the run finished with the right result.
        cause: why it failed (``None`` on success).
        steps_done: steps completed before the first unrecovered failure (the
            chain's length on success).
        recoveries: faults the policy recovered from (retried attempts, resumed crashes,
            repaired outputs).
        duplicate_effects: effects applied more than once for one logical write.
        calls / tokens / cost_usd: model calls made, their tokens and their price.
        sim_s: simulated seconds (back-offs, timeouts, lease expiries).
    """

    task: int
    repeat: int
    success: bool = False
    cause: FailureCause | None = None
    steps_done: int = 0
    recoveries: int = 0
    duplicate_effects: int = 0
    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    sim_s: float = 0.0
    run_id: str = ""  # `mainspring lab run`: the trial's run (its store is kept if asked)
    error: str = ""  # why it failed, in a line (the run's error, or what stopped it)
    corrupt_at: int | None = field(default=None, repr=False)
    last_fault: FailureCause | None = field(default=None, repr=False)


class _Draws:
    """Uniform draws keyed by what they decide: the same key gives the same number in
    every policy and every process."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def u(self, *key: object) -> float:
        return random.Random(f"mainspring-lab:{self.seed}:{key!r}").random()


class _Ledger:
    """The outside world the tool writes to: how often each logical effect took place."""

    def __init__(self) -> None:
        self.applied: Counter[tuple[int, int, int]] = Counter()
        self._keys: set[str] = set()

    def apply(self, effect: tuple[int, int, int], key: str | None) -> None:
        if key is not None:
            if key in self._keys:
                return  # the system deduplicates by idempotency key
            self._keys.add(key)
        self.applied[effect] += 1

    def duplicates(self, task: int, repeat: int) -> int:
        return sum(
            n - 1 for (t, r, _), n in self.applied.items() if (t, r) == (task, repeat) and n > 1
        )


class _SimulatedCrash(SimulatedCrash):
    """The worker process dies here: the engine lets it through, writes nothing more."""


class _ModelError(TransientError):
    pass


class _ToolFailure(TransientError):
    pass


class _Correlated(TransientError):
    pass


class _Malformed(Exception):
    """A validator rejected the model's output; the model is asked again."""


def _model_fault(
    d: _Draws, p: LabProfile, task: int, rep: int, stage: int, attempt: int
) -> FailureCause | None:
    if p.correlated_rate and d.u("corr", task, stage) < p.correlated_rate:
        return "correlated"
    x = d.u("model", task, rep, stage, attempt)
    if x < p.model_error_rate:
        return "model_error"
    if x < p.model_error_rate + p.timeout_rate:
        return "timeout"
    if x < p.model_error_rate + p.timeout_rate + p.malformed_rate:
        return "malformed"
    return None


def _tool_fault(
    d: _Draws, p: LabProfile, task: int, rep: int, stage: int, attempt: int
) -> tuple[str | None, bool]:
    """``(fault, after_effect)``: fault is ``"tool_failure"``, ``"worker_crash"`` or None."""
    if p.crash_rate and d.u("crash", task, rep, stage, attempt) < p.crash_rate:
        return "worker_crash", d.u("crash-after", task, rep, stage, attempt) < 0.5
    if p.tool_failure_rate and d.u("tool", task, rep, stage, attempt) < p.tool_failure_rate:
        return "tool_failure", d.u("tool-after", task, rep, stage, attempt) < 0.5
    return None, False


def _spend(out: TrialOutcome, p: LabProfile, fault: FailureCause | None) -> None:
    """A model call; a 5xx costs no tokens, anything that answered or hung does."""
    out.calls += 1
    if fault not in ("model_error", "correlated"):
        out.tokens += p.input_tokens + p.output_tokens
        out.cost_usd += p.call_cost()


# -- the plain loops ---------------------------------------------------------------------


def _plain_trial(
    policy: Policy, d: _Draws, p: LabProfile, steps: int, task: int, rep: int, ledger: _Ledger
) -> TrialOutcome:
    out = TrialOutcome(task=task, repeat=rep)
    tries = 1 if policy == "naive" else p.retries + 1
    value = 1
    for stage in range(steps):
        answer = _plain_model_call(out, d, p, (task, rep, stage), tries)
        if answer == "failed":
            return out
        value = value + 1 if answer == "ok" else -1
        if not _plain_tool_call(out, d, p, (task, rep, stage), tries, ledger):
            return out
    return _judge(out, value, steps)


def _plain_model_call(
    out: TrialOutcome, d: _Draws, p: LabProfile, at: tuple[int, int, int], tries: int
) -> Literal["ok", "malformed", "failed"]:
    """A plain loop's model call at stage ``at`` (task, repeat, stage), tried up to
    ``tries`` times: answered (``"malformed"``: wrongly, and nobody checks), or
    ``"failed"`` with the cause in ``out``."""
    task, rep, stage = at
    for attempt in range(1, tries + 1):
        fault = _model_fault(d, p, task, rep, stage, attempt)
        _spend(out, p, fault)
        if fault == "timeout":
            out.sim_s += p.timeout_s
        if fault is None or fault == "malformed":
            if fault == "malformed" and out.corrupt_at is None:
                out.corrupt_at = stage  # nobody checks the output: it flows on
            out.recoveries += attempt - 1
            return "ok" if fault is None else "malformed"
        if attempt == tries:
            out.cause, out.steps_done = fault, stage
    return "failed"


def _plain_tool_call(
    out: TrialOutcome,
    d: _Draws,
    p: LabProfile,
    at: tuple[int, int, int],
    tries: int,
    ledger: _Ledger,
) -> bool:
    """A plain loop's tool call at stage ``at``, tried up to ``tries`` times, each
    effect applied with no idempotency key; ``False``: it failed (the cause in
    ``out``)."""
    task, rep, stage = at
    for attempt in range(1, tries + 1):
        tfault, after = _tool_fault(d, p, task, rep, stage, attempt)
        if tfault is None or after:
            ledger.apply(at, None)  # no idempotency key
        if tfault == "worker_crash":
            out.cause, out.steps_done = "worker_crash", stage  # the script is gone
            return False
        if tfault is None:
            out.recoveries += attempt - 1
            return True
        if attempt == tries:
            out.cause, out.steps_done = "tool_failure", stage
    return False


def _judge(out: TrialOutcome, value: int, steps: int) -> TrialOutcome:
    """The completion check: the chain's result must be ``1 + steps``."""
    if value == steps + 1 and out.corrupt_at is None:
        out.success, out.steps_done = True, steps
    else:  # done, but wrong
        out.cause = "malformed"
        out.steps_done = out.corrupt_at if out.corrupt_at is not None else steps
    return out


# -- the journaled policies -----------------------------------------------------------------


class _Journaled:
    """One App on a temporary SQLite store running the chain as a workflow."""

    def __init__(
        self, policy: Policy, d: _Draws, p: LabProfile, ledger: _Ledger, directory: Path
    ) -> None:
        self.policy, self.d, self.p, self.ledger = policy, d, p, ledger
        self.clock = InstantClock()
        store = SQLiteStore(directory / f"{policy}.db", synchronous="NORMAL")
        retry = RetryPolicy(max_attempts=p.retries + 1, initial_s=1.0, max_s=8.0)
        self.app = App(
            store,
            clock=self.clock,
            rng=random.Random(d.seed),
            lease_s=p.lease_s,
            inline_wait_s=1e9,  # every back-off is inline: the instant clock skips it
            default_retry=retry,
            poll_interval_s=0.0,
        )
        self.current: TrialOutcome | None = None
        self.app.workflow(name="lab_chain")(self._chain)

    async def _chain(self, ctx: RunContext, task: int, rep: int, steps: int) -> dict[str, Any]:
        value: Any = 1
        corrupt_at: int | None = None
        for stage in range(steps):
            value = await ctx.step(
                self._model, task, rep, stage, value, name=f"model:{stage}", role="model"
            )
            if corrupt_at is None and not isinstance(value, int):
                corrupt_at = stage
            await ctx.step(self._tool, task, rep, stage, value, name=f"tool:{stage}", role="tool")
            self._out().steps_done = stage + 1
        return {"value": value, "corrupt_at": corrupt_at}

    def _out(self) -> TrialOutcome:
        assert self.current is not None
        return self.current

    async def _model(self, task: int, rep: int, stage: int, value: Any) -> Any:
        out = self._out()
        attempt = current_step().attempt
        fault = _model_fault(self.d, self.p, task, rep, stage, attempt)
        _spend(out, self.p, fault)
        if fault is not None:
            out.last_fault = fault
        if fault == "timeout":
            self.clock.jump(self.p.timeout_s)
            raise StepTimeout(f"model call of step {stage} timed out after {self.p.timeout_s}s")
        if fault == "model_error":
            raise _ModelError(f"model call of step {stage}: HTTP 503")
        if fault == "correlated":
            raise _Correlated(f"step {stage} is broken for task {task}")
        if fault == "malformed":
            answer: Any = {"val": "oops"}
        else:  # garbage in, garbage out: a spoilt value flows on unnoticed
            answer = value + 1 if isinstance(value, int) else value
        if self.policy in ("validate", "mainspring") and not isinstance(answer, int):
            raise _Malformed(f"output {answer!r} of step {stage} is not an integer")
        out.recoveries += attempt > 1
        return answer

    async def _tool(self, task: int, rep: int, stage: int, value: Any) -> None:
        out = self._out()
        info = current_step()
        fault, after = _tool_fault(self.d, self.p, task, rep, stage, info.attempt)
        keyed = info.idempotency_key if self.policy == "mainspring" else None
        if fault is None or after:
            self.ledger.apply((task, rep, stage), keyed)
        if fault == "worker_crash":
            out.recoveries += 1  # the journal resumes it (unless the run dead-letters)
            out.last_fault = "worker_crash"
            self.clock.jump(self.p.lease_s + 1.0)  # nobody heartbeats: the lease expires
            raise _SimulatedCrash()
        if fault == "tool_failure":
            out.last_fault = "tool_failure"
            raise _ToolFailure(f"tool of step {stage} failed")
        out.recoveries += info.attempt > 1

    async def trial(self, steps: int, task: int, rep: int) -> TrialOutcome:
        out = self.current = TrialOutcome(task=task, repeat=rep)
        start = self.clock.now()
        try:
            result: dict[str, Any] = await self.app.run(
                "lab_chain", task, rep, steps, key=f"{task}:{rep}"
            )
        except RunFailed as exc:
            error = exc.error if isinstance(exc.error, dict) else {}
            dead = "without progress" in str(error.get("message", ""))
            out.cause = "dead_letter" if dead else (out.last_fault or "model_error")
        else:
            out.corrupt_at = result["corrupt_at"]
            _judge(out, result["value"] if isinstance(result["value"], int) else -1, steps)
        out.sim_s = self.clock.now() - start
        return out

    def close(self) -> None:
        self.app.close()


class _QuietCrashes(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, _SimulatedCrash)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    log = logging.getLogger("mainspring.worker")
    quiet = _QuietCrashes()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


def run_trials(
    policy: Policy, profile: LabProfile, steps: int, tasks: int, repeats: int, seed: int
) -> list[TrialOutcome]:
    """Run ``tasks × repeats`` trials of the ``steps``-step chain under ``policy``."""
    d = _Draws(seed)
    ledger = _Ledger()
    if policy in ("naive", "retries"):
        outs = [
            _plain_trial(policy, d, profile, steps, t, r, ledger)
            for t in range(tasks)
            for r in range(repeats)
        ]
    else:
        outs = asyncio.run(_journaled(policy, d, profile, steps, tasks, repeats, ledger))
    for out in outs:
        out.duplicate_effects = ledger.duplicates(out.task, out.repeat)
    return outs


async def _journaled(
    policy: Policy,
    d: _Draws,
    p: LabProfile,
    steps: int,
    tasks: int,
    repeats: int,
    ledger: _Ledger,
) -> list[TrialOutcome]:
    with tempfile.TemporaryDirectory(prefix="mainspring-lab-") as tmp, _quiet():
        runner = _Journaled(policy, d, p, ledger, Path(tmp))
        try:
            return [await runner.trial(steps, t, r) for t in range(tasks) for r in range(repeats)]
        finally:
            runner.close()
