"""Execute one claimed run until it finishes, suspends, or the worker lets it go."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import Any, Literal

from .._describe import safe_str, safe_traceback
from .._errors import Cancelled, LeaseLost, StoreError, StoreUnavailable
from .._serde import dumps
from ..storage import RunRecord, RunTransition
from ._context import RunContext
from ._control import SimulatedCrash, _ContinueAsNew, _EngineFailure, _Release, _Suspend, error_json
from ._cursor import Cursor
from ._engine import Engine, RunControl
from ._tasks import TaskExit, guard_workflow_tasks, in_workflow
from ._workflow import Workflow

__all__ = ["Outcome", "execute"]

log = logging.getLogger("mainspring.worker")

Outcome = Literal["succeeded", "failed", "cancelled", "suspended", "released", "lost", "abandoned"]


async def execute(
    engine: Engine, run: RunRecord, workflow: Workflow[Any, Any], control: RunControl
) -> Outcome:
    """Replay and continue ``run`` (already claimed at ``run.epoch``).

    Every way out is journaled first: a result, an error, a suspension, a new
    session, or a release on shutdown. If the epoch moved on (``lost``) nothing is
    written; if the store keeps failing (``abandoned``) the lease simply expires
    and another worker replays the run.

    Nothing user code raises escapes: a worker's other runs must never pay for one
    run's ``SystemExit`` (which would stop the event loop they share).
    """
    guard_workflow_tasks()
    in_workflow.set(True)  # in this task's own context: the tasks it creates inherit it
    try:
        return await _execute(engine, run, workflow, control)
    except asyncio.CancelledError:
        raise  # the worker stopped this task; it counts the run as lost
    except BaseException as exc:
        log.error(
            "run %s: executor crashed; leaving it to recovery\n%s", run.id, safe_traceback(exc)
        )
        return "abandoned"


# How an execution ends: an outcome with nothing (more) to commit, or the transition
# to commit and then the outcome (``None``: the session ended; the run goes on).
_Decision = Outcome | tuple[RunTransition, Outcome | None]


async def _execute(
    engine: Engine, run: RunRecord, workflow: Workflow[Any, Any], control: RunControl
) -> Outcome:
    while True:
        try:
            journal = engine.store.load_steps(run.id, run.session)
        except (StoreUnavailable, StoreError) as exc:
            log.warning(
                "run %s: cannot load its journal (%s); leaving it to recovery",
                run.id,
                safe_str(exc),
            )
            return "abandoned"
        ctx = RunContext(run=run, journal=journal, engine=engine, control=control)
        cur = ctx._cursor
        raised, result = await _run_workflow(workflow, ctx, run)
        if isinstance(raised, SimulatedCrash):
            log.info("run %s: simulated crash; nothing more is written", run.id)
            return "abandoned"  # as if the process died here: the lease will expire
        task = asyncio.current_task()
        if cur.cancelled_main and task is not None:
            task.uncancel()  # the context cancelled this task itself, to suspend the run
        # What the engine decided stands, whatever the workflow did with it (swallowed
        # by `except BaseException`, or returned a value after it).
        stop = cur.stop
        with contextlib.suppress(asyncio.CancelledError):  # control.reason says why
            await cur.settle()
        if control.reason == "lost":
            log.warning(
                "run %s: lease lost (epoch %s); stopping without writing", run.id, run.epoch
            )
            return "lost"
        if control.reason == "shutdown" or isinstance(stop, _Release):
            return await _release(engine, cur, run)
        decided = _decide(run, workflow, control, stop, raised, result)
        if isinstance(decided, str):
            return decided
        transition, outcome = decided
        try:
            await cur.flush(transition)
        except LeaseLost:
            return "lost"
        except (StoreUnavailable, StoreError) as exc:
            log.warning("run %s: cannot commit its %s (%s)", run.id, transition.kind, safe_str(exc))
            return "abandoned"
        if outcome is not None:
            return outcome
        run = replace(run, session=run.session + 1, handoff=transition.handoff, recoveries=0)


async def _run_workflow(
    workflow: Workflow[Any, Any], ctx: RunContext, run: RunRecord
) -> tuple[BaseException | None, Any]:
    """Call the workflow function: ``(what it raised, what it returned)``."""
    try:
        args, kwargs = workflow.decode_input(run.input)
        return None, await workflow.fn(ctx, *args, **kwargs)
    except BaseException as exc:  # all of it is decided by the caller, nothing escapes
        return exc, None


def _decide(
    run: RunRecord,
    workflow: Workflow[Any, Any],
    control: RunControl,
    stop: BaseException | None,
    raised: BaseException | None,
    result: Any,
) -> _Decision:
    """How the execution ends, from what the engine decided (``stop``) first."""
    if isinstance(stop, _EngineFailure):
        return _engine_failed(run, stop)
    if (
        control.reason == "cancel"
        or isinstance(stop, Cancelled)
        or (stop is None and isinstance(raised, Cancelled))
    ):
        error = dumps({"type": "Cancelled", "message": "cancelled"})
        return RunTransition(kind="finish", status="cancelled", error=error), "cancelled"
    if isinstance(stop, _Suspend):
        return stop.transition, "suspended"
    if isinstance(stop, _ContinueAsNew):
        return RunTransition(kind="next_session", handoff=stop.handoff, session=run.session), None
    return _returned(run, workflow, raised, result)


def _engine_failed(run: RunRecord, stop: _EngineFailure) -> _Decision:
    error = stop.error
    if isinstance(error, LeaseLost):
        log.warning("run %s: lease lost (epoch %s); stopping without writing", run.id, run.epoch)
        return "lost"
    if isinstance(error, StoreUnavailable | StoreError):
        log.warning("run %s: store failing (%s); leaving it to recovery", run.id, safe_str(error))
        return "abandoned"
    if error.__traceback__ is None:  # never raised itself: its carrier was
        error.__traceback__ = stop.__traceback__
    return _failed(error)


def _returned(
    run: RunRecord, workflow: Workflow[Any, Any], raised: BaseException | None, result: Any
) -> _Decision:
    """The workflow function ended by itself: its result, or what it raised."""
    if isinstance(raised, asyncio.CancelledError):
        # Nobody in mainspring asked for it (the worker sets control.reason first):
        # never committed as a cancel. Another execution will replay the run.
        log.warning(
            "run %s: cancelled by something other than its worker; leaving it to recovery",
            run.id,
        )
        return "abandoned"
    if isinstance(raised, LeaseLost):
        return "lost"
    if isinstance(raised, StoreUnavailable | StoreError):
        log.warning("run %s: store failing (%s); leaving it to recovery", run.id, safe_str(raised))
        return "abandoned"
    if raised is not None:
        # Any other exception from workflow code, SystemExit and KeyboardInterrupt
        # included, fails the run; it never stops the worker.
        if isinstance(raised, TaskExit):  # from a task of its own: the original
            raised = raised.error
        return _failed(raised)
    try:
        output = dumps(result, what=f"result of workflow {workflow.name!r}")
    except Exception as exc:
        return _failed(exc)
    return RunTransition(kind="finish", status="succeeded", output=output), "succeeded"


def _failed(error: BaseException) -> _Decision:
    return RunTransition(kind="finish", status="failed", error=error_json(error)), "failed"


async def _release(engine: Engine, cur: Cursor, run: RunRecord) -> Outcome:
    try:
        await cur.flush()
        engine.store.release(run.id, run.epoch, engine.clock.now())
    except LeaseLost:
        return "lost"
    except (StoreUnavailable, StoreError):
        return "abandoned"
    return "released"
