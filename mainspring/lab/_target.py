"""``run_workflow_lab``: the user's own workflow or agent under a fault profile.

Each trial runs the workflow on a fresh App over a fresh temporary SQLite store, on a
simulated clock, with a :class:`~mainspring.lab._faults.FaultHook` among its step
interceptors. The lab App takes the workflows (and tools and agents) of the App the
target was registered on, so the module's own App and its store are never touched: a
workflow must reach the outside world through its steps, not through its module's App.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import App, ConfigError
from ..agent import Agent, AgentResult
from ..journal import RetryPolicy, Workflow
from ..storage import SQLiteStore
from ..worker import Worker
from ._chain import InstantClock, TrialOutcome, _quiet
from ._faults import FaultHook
from ._imports import import_object
from ._profile import POLICIES, FailureCause, LabProfile, Policy
from ._run import Cell, LabResult, TrialFailure, check_trials, summarise
from ._stubs import Stub, lab_stubs

__all__ = ["LabTarget", "parse_json_args", "resolve_target", "run_workflow_lab"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LabTarget:
    """What the lab runs: a workflow, the App it was registered on (if found) and, for
    an agent, its definition."""

    label: str
    workflow: Workflow[Any, Any]
    app: App | None = None
    agent: Agent | None = None


def resolve_target(
    target: str | Workflow[Any, Any] | App, *, workflow: str | None = None
) -> LabTarget:
    """``"MODULE:OBJECT"``, a :class:`Workflow` (what ``@app.workflow`` and
    ``app.agent`` return) or an :class:`App` with ``workflow=`` naming one of its
    workflows (or holding just one).

    Raises:
        ConfigError: the object is none of these, or the App has no such workflow.
    """
    apps: list[App] = []
    label = target if isinstance(target, str) else getattr(target, "name", "app")
    obj: Any = target
    if isinstance(target, str):
        obj, module = import_object(target)
        apps = [v for v in vars(module).values() if isinstance(v, App)]
    if isinstance(obj, Agent):
        apps = [a for a in apps if a.agents.get(obj.name) is obj]
        if not apps:
            raise ConfigError(
                f"{label!r} is an Agent that no App of its module registered: pass the "
                "workflow that app.agent(...) returned"
            )
        obj = apps[0].workflows[obj.name]
    if isinstance(obj, App):
        app = obj
        if workflow is None:
            if len(app.workflows) != 1:
                known = ", ".join(sorted(app.workflows)) or "none"
                raise ConfigError(
                    f"{label!r} is an App with {len(app.workflows)} workflows ({known}): "
                    "name one with --workflow NAME"
                )
            workflow = next(iter(app.workflows))
        if workflow not in app.workflows:
            known = ", ".join(sorted(app.workflows)) or "none"
            raise ConfigError(f"{label!r} has no workflow {workflow!r} (registered: {known})")
        obj = app.workflows[workflow]
        apps = [app]
    if not isinstance(obj, Workflow):
        raise ConfigError(
            f"{label!r} is a {type(obj).__name__}: the lab runs a workflow (what "
            "@app.workflow or app.agent(...) returns) or an App with --workflow NAME"
        )
    source = next((a for a in apps if a.workflows.get(obj.name) is obj), None)
    agent = source.agents.get(obj.name) if source is not None else None
    return LabTarget(label=label, workflow=obj, app=source, agent=agent)


def parse_json_args(args: str | None, kwargs: str | None) -> tuple[list[Any], dict[str, Any]]:
    """``--args '[1, "x"]'`` and ``--kwargs '{"count": 3}'``, with a clear error."""
    out: list[Any] = []
    named: dict[str, Any] = {}
    for flag, text in (("--args", args), ("--kwargs", kwargs)):
        if text is None:
            continue
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{flag} must be JSON, got {text!r}: {exc}") from None
        if flag == "--args":
            if not isinstance(value, list):
                raise ConfigError(f"--args must be a JSON list like '[1, \"x\"]', got {text!r}")
            out = value
        else:
            if not isinstance(value, dict):
                raise ConfigError(
                    f"--kwargs must be a JSON object like '{{\"n\": 3}}', got {text!r}"
                )
            named = value
    return out, named


class _Trials:
    """Runs the trials of one policy: a fresh App and store per trial."""

    def __init__(
        self,
        target: LabTarget,
        policy: Policy,
        profile: LabProfile,
        seed: int,
        directory: Path,
        stubs: Mapping[str, Stub] | None = None,
    ) -> None:
        self.target, self.policy, self.p, self.seed = target, policy, profile, seed
        self.directory = directory
        self.stubs = stubs
        self.workflow = target.workflow
        self.agent = target.agent
        if target.agent is not None and target.app is not None:
            self.agent, self.workflow = _agent_for(target.agent, target.app, policy)
        self.count = 0
        self.error = ""  # the last failed run's error, for a clear message

    def app(self, hook: FaultHook) -> App:
        p = self.p
        self.count += 1
        store = SQLiteStore(self.directory / f"{self.policy}-{self.count}.db", synchronous="OFF")
        retry = (
            RetryPolicy.never()
            if self.policy == "naive"
            else RetryPolicy(max_attempts=p.retries + 1, initial_s=1.0, max_s=8.0)
        )
        app = App(
            store,
            clock=hook.clock,
            rng=random.Random(f"{self.seed}:{hook.task}:{hook.repeat}"),
            lease_s=p.lease_s,
            inline_wait_s=1e9,  # every back-off and sleep is inline: the clock skips it
            default_retry=retry,
            poll_interval_s=0.0,
            interceptors=[hook],
        )
        source = self.target.app
        if source is not None:  # the whole registry, so runs started by name resolve
            app.workflows.update(source.workflows)
            app.tools = source.tools
            app.agents.update(source.agents)
        app.workflows[self.workflow.name] = self.workflow
        if self.agent is not None:
            app.agents[self.agent.name] = self.agent
        return app

    async def trial(
        self,
        task: int,
        repeat: int,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        check: Callable[[Any], bool] | None,
        profile: LabProfile | None = None,
    ) -> tuple[TrialOutcome, FaultHook]:
        clock = InstantClock()
        start = clock.now()
        tools = self.target.app.tools if self.target.app is not None else None
        hook = FaultHook(
            profile=profile or self.p,
            policy=self.policy,
            seed=self.seed,
            task=task,
            repeat=repeat,
            clock=clock,
            tools=tools,
            stubs=self.stubs,
            stub_effects=self.stubs is not None,
        )
        app = self.app(hook)
        out = TrialOutcome(task=task, repeat=repeat)
        try:
            run_id = out.run_id = app.enqueue(self.workflow.name, args, kwargs).run_id
            stop = await _drive(app, run_id, hook)
            if hook.config_error is not None:
                raise hook.config_error
            record = app.get_run(run_id)
            cause: FailureCause | None = None
            if stop is not None:
                cause = stop
                out.error = _STOPS.get(stop, stop) + f" (run status {record.status})"
            elif record.status == "succeeded":
                value = self.workflow.decode_output(record.output)
                if isinstance(value, AgentResult) and value.status != "done":
                    cause = "partial"
                    out.error = f"the agent ended {value.status}: {value.reason}"
                elif (swallowed := hook.unrecovered()) is not None:
                    cause = swallowed  # done, but over a step that failed for good
                    out.error = f"succeeded over a step that failed for good ({swallowed})"
                elif check is not None and not check(value):
                    cause = "wrong_result"
                    out.error = f"check() refused the result {record.output!s:.200}"
            else:
                error = json.loads(record.error) if record.error else {}
                message = str(error.get("message", "")) if isinstance(error, dict) else ""
                dead = "without progress" in message
                cause = "dead_letter" if dead else (hook.last or "workflow_error")
                kind = str(error.get("type", "?")).rsplit(".", 1)[-1]
                self.error = out.error = f"{record.status}: {kind}: {message:.300}"
            out.success = cause is None
            out.cause = cause
        finally:
            app.close()
        out.steps_done = len(hook.done)
        out.recoveries = hook.recoveries
        out.duplicate_effects = hook.duplicate_effects()
        out.calls, out.tokens, out.cost_usd = hook.calls, hook.tokens, hook.cost_usd
        out.sim_s = clock.now() - start
        return out, hook

    def database(self) -> Path:
        """The store of the latest trial."""
        return self.directory / f"{self.policy}-{self.count}.db"


async def _drive(app: App, run_id: str, hook: FaultHook) -> FailureCause | None:
    """Work the run until it ends; answer approvals as the human would (approve).

    Returns why the trial stopped early: the worker crashed under a policy with nothing
    to resume from, or the run waits for something the lab cannot give.
    """
    worker = Worker(app, concurrency=1, batch=False, _run_id=run_id)
    task = asyncio.create_task(worker.run())
    stop: FailureCause | None = None
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=0.002)
            if hook.lost:
                stop = "worker_crash"
                break
            if app.store.get_run(run_id) is None:
                continue
            if app.get_run(run_id).status == "waiting":
                pending = app.requests(run_id)
                if any(r.kind != "approval" for r in pending) or (
                    not pending and not _answered(app, run_id)
                ):
                    stop = "stalled"
                    break
                for r in pending:
                    app.answer(run_id, r.id, decision="approve", by="mainspring lab")
    finally:
        worker.request_stop()
        await asyncio.gather(task, return_exceptions=True)
    return stop


def _answered(app: App, run_id: str) -> bool:
    """Whether the run holds an answer it has not taken yet: a waiting run stays
    ``waiting`` after its approval is answered until a worker claims it again."""
    return any(s.consumed_at is None for s in app.store.list_signals(run_id))


_STOPS: dict[str, str] = {
    "worker_crash": "the worker died and this policy has no journal to resume from",
    "stalled": "the run waits for something the lab cannot give (a question, a signal)",
}


def _agent_for(agent: Agent, app: App, policy: Policy) -> tuple[Agent, Workflow[Any, Any]]:
    """The agent as the policy runs it, bound as ``app`` binds it but with no rate
    limits: below ``validate``, with no completion validators and no repair turns (a
    malformed reply fails the run)."""
    spec = agent
    if policy not in ("validate", "mainspring"):
        spec = dataclasses.replace(agent, validators=(), max_repairs=0)
    host = App(clock=app.clock, rng=app.rng, inline_wait_s=app.inline_wait_s, rate_limits=False)
    host.tools = app.tools
    return spec, host.add(spec)


def _theory(policy: Policy, p: LabProfile, roles: Sequence[str], agent: bool) -> float | None:
    """Independent faults over the steps of a fault-free run: a step fails an attempt
    with e = error + timeout (+ tool failure for non-model steps); success is
    ``Π (1 - e)`` with one attempt, ``Π (1 - e^(r+1))`` with r retries."""
    if agent or p.correlated_rate or p.malformed_rate or not roles:
        return None  # an agent adapts to its errors; the others share or repair faults
    if policy != "naive" and p.crash_rate:
        return None  # a resumed crash has no closed form
    tries = 1 if policy == "naive" else p.retries + 1
    total = 1.0
    for role in roles:
        ok = 1 - p.model_error_rate - p.timeout_rate
        if role != "model":
            ok *= 1 - p.tool_failure_rate
        if policy == "naive":
            ok *= 1 - p.crash_rate
        total *= 1 - (1 - ok) ** tries
    return total


def run_workflow_lab(
    target: str | Workflow[Any, Any] | App,
    profile: LabProfile,
    *,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    workflow: str | None = None,
    policies: Sequence[Policy] = POLICIES,
    trials: int = 100,
    repeats: int = 10,
    seed: int = 42,
    check: Callable[[Any], bool] | None = None,
    progress: Callable[[Policy, int], None] | None = None,
    live: bool = False,
    stubs: Mapping[str, Any] | None = None,
    keep: str | Path | None = None,
) -> LabResult:
    """Run a workflow or agent under ``profile`` for ``trials`` seeded trials per policy.

    The lab performs no real effect unless told to: every ``write`` and ``irreversible``
    tool of the target's App is replaced, in every trial, by a stub (see
    :func:`lab_stubs`); faults are drawn and duplicate effects counted as if it ran.
    ``read`` tools, model calls and a workflow's plain ``ctx.step`` functions run as
    they are (the lab cannot tell a plain step's reads from its writes: point the
    workflow at test doubles). Irreversible tools are approved as a reviewer would.

    Args:
        target: ``"MODULE:OBJECT"``, a workflow (``@app.workflow``, ``app.agent``) or
            an App with ``workflow=`` naming the workflow.
        args / kwargs: the workflow's arguments (after ``ctx``); an agent takes the task.
        check: judges a successful run's result (``False``: a wrong result).
        live: run the real write and irreversible tools, once or more per trial (the
            CLI's ``--live`` asks for a confirmation first).
        stubs: tool name -> the value its stub returns, or a function of the call's
            arguments returning it (for tools no placeholder fits).
        keep: a folder to copy each failed trial's store into, so that its run can be
            inspected (``TrialFailure.database``).
        policies / trials / repeats / seed: as :func:`run_lab`; the trials are
            ``trials / repeats`` tasks (correlated faults are per task) tried
            ``repeats`` times.

    Returns:
        A :class:`LabResult` with one cell per policy; its ``steps`` is the number of
        steps of a fault-free run.

    Raises:
        ConfigError: a target that is not a workflow, arguments that do not fit it, a
            workflow that does not succeed without faults, or bad counts.
    """
    check_trials(policies, trials, repeats)
    found = resolve_target(target, workflow=workflow)
    named = dict(kwargs or {})
    found.workflow.encode_input(tuple(args), named)  # wrong arguments fail here
    tools = list(found.app.tools) if found.app is not None else []
    if found.agent is not None:  # an agent calls only the tools it is allowed
        tools = [t for t in tools if t.name in found.agent.allowed]
    # Checked now, for the tools the lab can see; a tool it cannot (a workflow passed
    # without its App) is stubbed when its first step runs.
    stand_ins = None if live else lab_stubs(tools, stubs)
    kept = Path(keep) if keep is not None else None
    result = asyncio.run(
        _experiment(
            found, profile, args, named, policies, trials, repeats, seed, check, progress,
            stand_ins, kept,
        )
    )  # fmt: skip
    return dataclasses.replace(result, live=live)


async def _experiment(
    found: LabTarget,
    profile: LabProfile,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    policies: Sequence[Policy],
    trials: int,
    repeats: int,
    seed: int,
    check: Callable[[Any], bool] | None,
    progress: Callable[[Policy, int], None] | None,
    stubs: Mapping[str, Stub] | None,
    keep: Path | None,
) -> LabResult:
    tasks = trials // repeats
    failures: list[TrialFailure] = []
    stubbed: set[str] = set(stubs or ())
    with tempfile.TemporaryDirectory(prefix="mainspring-lab-") as tmp, _quiet():
        directory = Path(tmp)
        # A fault-free reference run: the step count, and whether the workflow works.
        reference = _Trials(found, "mainspring", profile, seed, directory, stubs)
        clean, hook = await reference.trial(-1, -1, args, kwargs, check, LabProfile())
        if not clean.success:
            raise ConfigError(
                f"{found.label!r} does not succeed without faults (cause: {clean.cause}"
                f"{'; ' + reference.error if reference.error else ''}); the lab needs a "
                "workflow that works before it breaks it"
            )
        names, roles = list(hook.names), list(hook.roles)
        stubbed |= hook.stubbed
        cells: list[Cell] = []
        for policy in policies:
            runner = _Trials(found, policy, profile, seed, directory, stubs)
            outs = []
            for t in range(tasks):
                for r in range(repeats):
                    out, trial_hook = await runner.trial(t, r, args, kwargs, check)
                    stubbed |= trial_hook.stubbed
                    outs.append(out)
                    if not out.success:
                        failures.append(_failure(policy, out, runner.database(), keep))
            cell = summarise(policy, profile, len(names), outs)
            theory = _theory(policy, profile, roles, found.agent is not None)
            cell = dataclasses.replace(cell, theory=theory)
            if not cell.tokens:  # no model calls: no tokens or dollars to speak of
                cell = dataclasses.replace(cell, tokens_per_success=None, cost_per_success=None)
            cells.append(cell)
            if progress is not None:
                progress(policy, len(names))
    return LabResult(
        profile=profile,
        seed=seed,
        tasks=tasks,
        repeats=repeats,
        steps=(len(names),),
        policies=tuple(policies),
        cells=tuple(cells),
        target=found.label,
        stubbed=tuple(sorted(stubbed)),
        failures=tuple(failures),
    )


def _failure(policy: Policy, out: TrialOutcome, database: Path, keep: Path | None) -> TrialFailure:
    url = None
    if keep is not None:  # the temporary folder goes: copy the store where it can be read
        keep.mkdir(parents=True, exist_ok=True)
        kept = keep / f"{policy}-task{out.task}-trial{out.repeat}.db"
        shutil.copyfile(database, kept)
        url = f"sqlite:///{kept.resolve()}"
    return TrialFailure(
        policy=policy,
        task=out.task,
        repeat=out.repeat,
        cause=out.cause or "?",
        error=out.error,
        run_id=out.run_id,
        database=url,
    )
