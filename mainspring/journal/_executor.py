"""Execute one claimed run until it finishes, suspends, or the worker lets it go."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

from .._describe import safe_str, safe_traceback
from .._errors import Cancelled, LeaseLost, NondeterminismError, StoreError, StoreUnavailable
from .._serde import dumps
from ..storage import RunRecord, RunTransition, StepRecord
from ._context import RunContext
from ._control import SimulatedCrash, _ContinueAsNew, _EngineFailure, _Release, _Suspend, error_json
from ._cursor import Cursor
from ._engine import Engine, RunControl
from ._lifecycle import Lifecycle
from ._sticky import Execution
from ._tasks import TaskExit, guard_workflow_tasks, in_workflow
from ._workflow import Workflow

__all__ = ["Outcome", "execute"]

log = logging.getLogger("mainspring.worker")

Outcome = Literal[
    "succeeded", "failed", "cancelled", "suspended", "released", "lost", "abandoned", "refused"
]


async def execute(
    engine: Engine,
    run: RunRecord,
    workflow: Workflow[Any, Any],
    control: RunControl,
    *,
    keep: Callable[[Execution], None] | None = None,
    resume: Execution | None = None,
) -> Outcome:
    """Replay and continue ``run`` (already claimed at ``run.epoch``).

    With ``keep`` (sticky executions, see :mod:`._sticky`), the workflow runs in a
    task of its own, and a suspension leaves it alive, parked: once the suspension
    is committed, ``keep`` receives the :class:`Execution` and the outcome is
    ``suspended``. Passed back as ``resume`` with the run claimed again, it resumes
    where it was if nothing else happened to the run meanwhile; otherwise it is
    dropped and the run is replayed.

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
        if keep is not None:
            return await _execute_sticky(engine, run, workflow, control, keep, resume)
        if resume is not None:
            resume.drop()
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
        journal = _load_journal(engine, run)
        if journal is None:
            return "abandoned"
        cur = Cursor(run=run, journal=journal, engine=engine, life=Lifecycle(run, control))
        raised, result = await _run_workflow(workflow, RunContext(run=run, cursor=cur), run)
        if isinstance(raised, SimulatedCrash):
            log.info("run %s: simulated crash; nothing more is written", run.id)
            return "abandoned"  # as if the process died here: the lease will expire
        task = asyncio.current_task()
        if cur.life.cancelled_main and task is not None:
            task.uncancel()  # the context cancelled this task itself, to suspend the run
        ended = await _end(engine, run, workflow, cur, raised, result)
        if isinstance(ended, str):
            return ended
        run = ended


def _load_journal(engine: Engine, run: RunRecord) -> list[StepRecord] | None:
    """The journal of the run's session, or ``None`` when the store cannot give it:
    both executors then abandon the run (its lease expires and another worker
    replays it), never run the workflow on a journal it could not read."""
    try:
        return engine.store.load_steps(run.id, run.session)
    except (StoreUnavailable, StoreError) as exc:
        log.warning(
            "run %s: cannot load its journal (%s); leaving it to recovery", run.id, safe_str(exc)
        )
        return None


async def _end(
    engine: Engine,
    run: RunRecord,
    workflow: Workflow[Any, Any],
    cur: Cursor,
    raised: BaseException | None,
    result: Any,
) -> Outcome | RunRecord:
    """Commit how the workflow's execution ended: the outcome, or the run record of
    the next session (a continue-as-new)."""
    life = cur.life
    control = life.control
    # What the engine decided stands, whatever the workflow did with it (swallowed
    # by `except BaseException`, or returned a value after it).
    stop = life.stop
    with contextlib.suppress(asyncio.CancelledError):  # control.reason says why
        await life.settle()
    if control.reason == "lost":
        log.warning("run %s: lease lost (epoch %s); stopping without writing", run.id, run.epoch)
        return "lost"
    if control.reason == "shutdown" or isinstance(stop, _Release):
        return await _release(engine, cur, run)
    if (
        control.reason is None
        and isinstance(stop, _EngineFailure)
        and isinstance(stop.error, NondeterminismError)
    ):
        return await _refuse(engine, cur, run, control, stop.error)
    decided = _decide(run, workflow, control, stop, raised, result)
    if isinstance(decided, str):
        return decided
    transition, outcome = decided
    control.committing = True  # a cancel asked now is the store's to honour
    try:
        await life.leftovers_ended()  # steps the end stopped, still on their threads
        await cur.flush(transition)
    except LeaseLost as exc:
        _refused(run, transition, exc)
        return "lost"
    except (StoreUnavailable, StoreError) as exc:
        log.warning("run %s: cannot commit its %s (%s)", run.id, transition.kind, safe_str(exc))
        return "abandoned"
    finally:
        control.committing = False
    if transition.kind == "finish" and life.cancel and outcome != "cancelled":
        # Asked to cancel before its end committed: the store ended it cancelled.
        log.info(
            "run %s: cancelled before it could end %s; its result is discarded", run.id, outcome
        )
        return "cancelled"
    if outcome is not None:
        return outcome
    return replace(run, session=run.session + 1, handoff=transition.handoff, recoveries=0)


async def _execute_sticky(
    engine: Engine,
    run: RunRecord,
    workflow: Workflow[Any, Any],
    control: RunControl,
    keep: Callable[[Execution], None],
    resume: Execution | None,
) -> Outcome:
    """:func:`_execute` with the workflow in a task of its own, kept when it suspends."""
    ex: Execution | None = None
    if resume is not None:
        if resume.fits(run):
            resume.wake(run, control)
            ex = resume
        else:
            resume.drop()
    try:
        return await _sessions(engine, run, workflow, control, keep, ex)
    finally:
        if resume is not None and resume.transition is None:
            resume.drop()  # not kept again: nothing may ever resume it


async def _sessions(
    engine: Engine,
    run: RunRecord,
    workflow: Workflow[Any, Any],
    control: RunControl,
    keep: Callable[[Execution], None],
    ex: Execution | None,
) -> Outcome:
    while True:
        if ex is None:
            journal = _load_journal(engine, run)
            if journal is None:
                return "abandoned"
            life = Lifecycle(run, control, sticky=True)
            cur = Cursor(run=run, journal=journal, engine=engine, life=life)
            ctx = RunContext(run=run, cursor=cur)
            task = asyncio.create_task(
                _run_workflow(workflow, ctx, run), name=f"mainspring-workflow-{run.id}"
            )
            life.adopt(task)
            ex = Execution(ctx, cur, task, run, workflow)
        cur = ex.cur
        try:
            kept = await _until_suspended(ex, control)
            if kept is not None:
                return await _keep(ex, kept, keep)
        finally:
            if ex.transition is None and not ex.task.done():
                ex.drop()  # this executor is leaving (it was stopped): so does the workflow
        raised: BaseException | None
        if ex.task.cancelled():  # before it began: as if the worker stopped it there
            raised, result = asyncio.CancelledError(), None
        else:
            raised, result = ex.task.result()
        if isinstance(raised, SimulatedCrash):
            log.info("run %s: simulated crash; nothing more is written", run.id)
            return "abandoned"  # as if the process died here: the lease will expire
        ended = await _end(engine, ex.run, workflow, cur, raised, result)
        if isinstance(ended, str):
            return ended
        run, ex = ended, None


async def _until_suspended(ex: Execution, control: RunControl) -> RunTransition | None:
    """Wait for the workflow's task to end (``None``) or for it to suspend in a way
    that keeps it (the suspension). The worker's interruptions are passed on to the
    workflow's task, as if it ran in the worker's own task."""
    life = ex.life
    while not ex.task.done():
        parking = life.parking
        # Parked: at once to the check below (also after the worker's interruption).
        # Once the execution is closing, only the task's end is awaited.
        waits: tuple[asyncio.Future[Any], ...] = (ex.task,)
        if parking is not None and life.state in ("running", "parked"):
            waits = (ex.task, parking)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            ex.task.cancel()  # control.reason says why; the workflow sees it where it is
            continue
        if life.state == "parked" and not ex.task.done():
            assert parking is not None
            transition = parking.result()
            if control.reason is None and life.intact:  # nothing moved on meanwhile
                return transition
            # Interrupted meanwhile: suspend as without stickiness (control.reason,
            # read first by the end, says how the run leaves).
            life.interrupt(transition)
            ex.task.cancel()
    return None


async def _keep(
    ex: Execution, transition: RunTransition, keep: Callable[[Execution], None]
) -> Outcome:
    """Commit the suspension and hand the live execution to the worker."""
    cur = ex.cur
    ex.sleep(transition)  # dormant first: nothing else may use the context meanwhile
    control = ex.life.control
    control.committing = True  # a cancel asked now is the store's to honour
    try:
        await cur.flush(transition)
    except LeaseLost as exc:
        ex.drop()
        _refused(ex.run, transition, exc)
        return "lost"
    except (StoreUnavailable, StoreError) as exc:
        ex.drop()
        log.warning("run %s: cannot commit its suspend (%s)", ex.run_id, safe_str(exc))
        return "abandoned"
    except asyncio.CancelledError:
        ex.drop()
        raise
    finally:
        control.committing = False
    keep(ex)
    return "suspended"


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


async def _refuse(
    engine: Engine, cur: Cursor, run: RunRecord, control: RunControl, error: NondeterminismError
) -> Outcome:
    """This code cannot replay the run: its journal holds a step, a patch marker or a
    version the code does not produce (a worker of an older or a newer deployment
    wrote it). Never fail it for that: leave it, unfinished and with nothing this
    execution buffered, for a worker whose code can (``Store.refuse``), as Temporal
    fails only the workflow task and lets another worker take it."""
    control.refused = error
    note = dumps(
        {
            "type": f"{type(error).__module__}.{type(error).__qualname__}",
            "message": safe_str(error.message),
            **({"step": error.step} if error.step else {}),
        }
    )
    try:
        status = engine.store.refuse(
            run.id,
            run.epoch,
            engine.clock.now(),
            error=note,
            at=f"{run.session}:{cur.last_journaled}",
            worker=control.worker,
        )
    except (StoreUnavailable, StoreError) as exc:
        log.warning("run %s: cannot give it back (%s); its lease will expire", run.id, exc)
        return "abandoned"
    return "lost" if status is None else "refused"


async def _release(engine: Engine, cur: Cursor, run: RunRecord) -> Outcome:
    control = cur.life.control
    control.committing = True  # a cancel asked now: the next claim carries it out
    try:
        await cur.flush()
        engine.store.release(run.id, run.epoch, engine.clock.now())
    except LeaseLost as exc:
        log.warning("run %s: cannot give it back (%s)", run.id, safe_str(exc))
        return "lost"
    except (StoreUnavailable, StoreError):
        return "abandoned"
    finally:
        control.committing = False
    return "released"


def _refused(run: RunRecord, transition: RunTransition, exc: LeaseLost) -> None:
    log.warning(
        "run %s: its %s was refused (epoch %s): %s; stopping without writing",
        run.id,
        transition.kind,
        run.epoch,
        safe_str(exc),
    )
