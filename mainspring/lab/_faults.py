"""``FaultHook``: the step interceptor that puts a user's workflow under a fault profile.

Every executed attempt of every step meets a fault drawn from the experiment's seed, the
task, the trial, the step's journal position and the attempt, so each policy meets the
same faults and a rerun reproduces every figure. What a fault does depends on the step:

* ``model:…`` steps (an agent's model calls): the call fails (a 503, before any token),
  hangs until its timeout, or answers with a garbled tool call (malformed output);
* every other step (``tool:…`` and plain ``ctx.step`` functions): the step raises a
  transient error, hangs until its timeout, or fails as a tool does, half the time
  *after* its function ran (the effect took place and the response was lost);
* any step: the worker dies during it (before or after the function ran), or the step
  is broken for the task (correlated: every attempt of every trial of the task fails).

The hook also counts what the lab reports: recoveries, steps done, model tokens, and step
functions that completed more than once for one idempotency key (duplicate effects).
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from .. import ConfigError, MainspringError, StepInfo, StepTimeout, TransientError
from ..journal import StepCall, StepInterceptor
from ..models import ModelResponse, ToolCall
from ..tools import ToolRegistry, step_effect, tool_of
from ._chain import InstantClock, _Draws
from ._chain import _SimulatedCrash as SimulatedCrash
from ._profile import FailureCause, LabProfile, Policy
from ._stubs import Stub, stub_for

__all__ = ["FaultHook", "SimulatedCrash"]

_RETRYING: Final = ("retries", "checkpoint", "validate", "mainspring")


class InjectedFault(TransientError):
    """A fault the lab injected; retryable while the policy has attempts left."""


class InjectedFinalFault(MainspringError):
    """A fault the lab injected at the last attempt the policy allows (not retried)."""


class FaultHook(StepInterceptor):
    """Injects one trial's faults into the steps of a workflow and counts the outcome.

    Args:
        profile / policy / seed: the experiment.
        task / repeat: which task (correlated faults are shared by its trials) and trial.
        clock: the trial's simulated clock (timeouts and lease expiries jump it).
        tools: the App's tool registry, to tell write tools from reads and keyed
            tools (``ctx: ToolContext``) from unkeyed ones.
        stubs: tool name -> a function of the call's arguments that stands in for the
            tool: its step returns that instead of running the tool (no real effect).
            Faults are drawn and effects counted as if it had run.
        stub_effects: stub every ``write`` and ``irreversible`` tool, those not in
            ``stubs`` with a placeholder (:func:`~mainspring.lab._stubs.stub_for`).
    """

    def __init__(
        self,
        *,
        profile: LabProfile,
        policy: Policy,
        seed: int,
        task: int,
        repeat: int,
        clock: InstantClock,
        tools: ToolRegistry | None = None,
        stubs: Mapping[str, Stub] | None = None,
        stub_effects: bool = False,
    ) -> None:
        self.p, self.policy, self.task, self.repeat = profile, policy, task, repeat
        self.stubs = dict(stubs or {})
        self.stub_effects = stub_effects
        self.stubbed: set[str] = set()  # tools that ran as stubs in this trial
        self.config_error: ConfigError | None = None  # a tool no stub could stand in for
        self.d = _Draws(seed)
        self.clock = clock
        self.tools = tools
        self.tries = profile.retries + 1 if policy in _RETRYING else 1
        self.lost = False  # a crash under a policy with no journal to resume from
        self.last: FailureCause | None = None  # outcome of the latest attempt
        self.final: dict[str, FailureCause | None] = {}  # step key -> its latest outcome
        self.done: set[str] = set()
        self.names: list[str] = []  # completed steps' names, in order
        self.roles: list[str] = []  # and their roles
        self.completions: Counter[str] = Counter()  # effect steps whose function returned
        self.unkeyed: set[str] = set()  # of those, the ones that cannot pass the key on
        self.recoveries = 0
        self.calls = 0
        self.tokens = 0
        self.cost_usd = 0.0

    # -- what the lab reads --------------------------------------------------------

    def duplicate_effects(self) -> int:
        """Step functions that completed again for a key that had completed before.

        Under ``mainspring`` a re-execution is deduplicated when the step can pass its
        idempotency key on (a tool taking ``ctx: ToolContext``, a function that reads
        ``current_step().idempotency_key``); the others still count.
        """
        keys = self.completions
        if self.policy == "mainspring":
            return sum(n - 1 for k, n in keys.items() if n > 1 and k in self.unkeyed)
        return sum(n - 1 for n in keys.values() if n > 1)

    def unrecovered(self) -> FailureCause | None:
        """A fault that failed its step for good (a run can swallow a failed step)."""
        return next((f for f in self.final.values() if f not in (None, "worker_crash")), None)

    # -- the interceptor -----------------------------------------------------------

    async def execute_step(self, call: StepCall, proceed: Callable[[], Awaitable[Any]]) -> Any:
        info = call.info
        if info.role in ("rate", "wait"):  # the rate limiter's bookkeeping, not work
            return await proceed()
        model = info.role == "model"
        fault, after = self._draw(model, (info.session, info.seq), info.attempt)
        self._strike_before(info, fault, after, model)
        result = await self._perform(call, proceed, model)
        if model:
            result = self._model_answer(result, fault, info.attempt)
        else:
            self._effect(call, info.idempotency_key)
        if fault == "worker_crash":
            self._crash()
        if fault == "tool_failure":
            raise self._error(fault, info.name, info.attempt)
        self._completed(info, fault)
        return result

    def _strike_before(
        self, info: StepInfo, fault: FailureCause | None, after: bool, model: bool
    ) -> None:
        """Note the fault drawn for this attempt, and strike what comes before the
        step's function runs: a crash, or an error in the function's place."""
        if fault is not None:
            self.last = fault
            if fault != "malformed":  # a garbled reply still completes its step
                self.final[info.idempotency_key] = fault
        if fault == "worker_crash" and not after:
            self._crash()
        if fault in ("model_error", "step_error", "timeout", "correlated") or (
            fault == "tool_failure" and not after
        ):
            if model:
                self.calls += 1
            if fault == "timeout":
                self.clock.jump(self.p.timeout_s)
            raise self._error(fault, info.name, info.attempt)

    async def _perform(
        self, call: StepCall, proceed: Callable[[], Awaitable[Any]], model: bool
    ) -> Any:
        """The step's function, or the stub that stands in for a tool's effect."""
        stub = None if model else self._stub(call)
        if stub is not None:
            return stub(dict(call.args[0]) if call.args else {})  # no real effect
        return await proceed()

    def _completed(self, info: StepInfo, fault: FailureCause | None) -> None:
        """An attempt that completed its step (``fault``: ``"malformed"`` or none)."""
        key = info.idempotency_key
        self.final[key] = None
        if fault != "malformed":
            self.last = None
        if key not in self.done:
            self.done.add(key)
            self.names.append(info.name)
            self.roles.append(info.role)
        self.recoveries += info.attempt > 1

    # -- helpers -------------------------------------------------------------------

    def _draw(
        self, model: bool, where: tuple[int, int], attempt: int
    ) -> tuple[FailureCause | None, bool]:
        """``(fault, after the function ran)`` for one attempt of one step."""
        p, d, t, r = self.p, self.d, self.task, self.repeat
        if p.correlated_rate and d.u("corr", t, where) < p.correlated_rate:
            return "correlated", False
        if p.crash_rate and d.u("crash", t, r, where, attempt) < p.crash_rate:
            return "worker_crash", d.u("crash-after", t, r, where, attempt) < 0.5
        x = d.u("model" if model else "step", t, r, where, attempt)
        if x < p.model_error_rate:
            return ("model_error" if model else "step_error"), False
        if x < p.model_error_rate + p.timeout_rate:
            return "timeout", False
        if model:
            return (
                "malformed" if x < p.model_error_rate + p.timeout_rate + p.malformed_rate else None
            ), False
        if p.tool_failure_rate and d.u("tool", t, r, where, attempt) < p.tool_failure_rate:
            return "tool_failure", d.u("tool-after", t, r, where, attempt) < 0.5
        return None, False

    def _error(self, fault: FailureCause, step: str, attempt: int) -> MainspringError:
        what = {
            "model_error": "the model call failed: HTTP 503",
            "step_error": "the step failed: HTTP 503",
            "timeout": f"the call timed out after {self.p.timeout_s:g}s (simulated)",
            "correlated": f"the step is broken for task {self.task} (correlated fault)",
            "tool_failure": "the tool call failed",
        }[fault]
        message = f"lab: {what} (step {step!r}, attempt {attempt})"
        if attempt >= self.tries:  # the policy's last attempt: no retry, whatever the step's
            return InjectedFinalFault(message)
        if fault == "timeout":
            return StepTimeout(message)
        return InjectedFault(message)

    def _crash(self) -> None:
        if self.policy in ("naive", "retries"):
            self.lost = True  # a plain script is gone with its process
        else:
            self.recoveries += 1  # the journal resumes it (unless the run dead-letters)
            self.clock.jump(self.p.lease_s + 1.0)  # nobody heartbeats: the lease expires
        raise SimulatedCrash()

    def _model_answer(self, result: Any, fault: FailureCause | None, attempt: int) -> Any:
        self.calls += 1
        if isinstance(result, ModelResponse):
            used = result.usage.input_tokens + result.usage.output_tokens
            self.tokens += used
            self.cost_usd += (
                result.usage.input_tokens * self.p.price_in
                + result.usage.output_tokens * self.p.price_out
            ) / 1_000_000
            if fault == "malformed":
                if self.policy in ("validate", "mainspring"):
                    self.recoveries += 1  # the agent sends it back for repair
                # a tool call with broken JSON and no name: what a garbled reply looks like
                call = ToolCall(id=f"lab_{attempt}", name="", arguments='{"value": ')
                return ModelResponse(
                    tool_calls=(call,),
                    finish_reason="tool_calls",
                    usage=result.usage,
                    model=result.model,
                )
        elif fault == "malformed":
            self.last = None  # not a model reply: nothing to garble
        return result

    def _stub(self, call: StepCall) -> Stub | None:
        tool = tool_of(call.fn)
        if tool is None or tool.effect == "read":
            return None
        stub = self.stubs.get(tool.name)
        if stub is None and self.stub_effects:
            try:
                stub = self.stubs[tool.name] = stub_for(tool)
            except ConfigError as exc:
                self.config_error = exc  # the lab stops: an agent would take it as a tool error
                raise
        if stub is not None:
            self.stubbed.add(tool.name)
        return stub

    def _effect(self, call: StepCall, key: str) -> None:
        tool = None
        if call.info.role == "tool" and self.tools is not None:
            ran = tool_of(call.fn)  # the tool whose step function this is
            tool = self.tools.get(ran.name) if ran is not None else None
        effect = tool.effect if tool is not None else step_effect(call.fn)
        if effect == "read":
            return  # a read has no effect to duplicate
        self.completions[key] += 1
        keyed = tool.schema.context_param is not None if tool is not None else _reads_key(call.fn)
        if not keyed:
            self.unkeyed.add(key)


def _reads_key(fn: Callable[..., Any]) -> bool:
    """Whether a plain step function uses its idempotency key (read from its source)."""
    try:
        return "idempotency_key" in inspect.getsource(fn)
    except (OSError, TypeError):
        return False
