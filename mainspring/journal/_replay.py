"""Replay one run's journal against the code, writing nothing: the replay gate.

Before a deploy, an operator wants to know whether the new code can carry on every run
in flight. The only faithful answer is the engine's own replay: the workflow function
runs, each durable call is checked against the journal at its position
(:meth:`Cursor.take`) and answered from it, exactly as a worker would after the deploy.
What differs is where it stops: at the first thing a live execution would *write* (the
intent row of a step the journal has not finished, a suspension, a child to start),
which is where the journal ends and new work would begin. Every commit is answered
with a refusal before anything reaches the store, so the run's journal, status and
lease are untouched and no step function runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Literal

from .._describe import safe_str
from .._errors import Cancelled, NondeterminismError, StoreError
from ..storage import RunRecord, RunWrite, Store, WriteResult
from ._context import RunContext
from ._control import _ContinueAsNew, _EngineFailure, _Suspend
from ._cursor import Cursor
from ._engine import ChildStarter, Committer, Engine, RunControl
from ._executor import _run_workflow
from ._lifecycle import Lifecycle
from ._tasks import guard_workflow_tasks, in_workflow
from ._workflow import Workflow

__all__ = ["Replayed", "replay_journal"]

# What a replay's refused commit says: the journal ended here and new work would begin.
_PAST = "replay check: the journal ends here; a live execution would write from here on"

Verdict = Literal["clean", "diverged"]


@dataclass(frozen=True, slots=True)
class Replayed:
    """What replaying one run's journal against the code found.

    Attributes:
        verdict: ``"clean"``: the code asked for what the journal holds, position by
            position, up to where the run is; ``"diverged"``: it did not.
        journaled: positions in the run's current session's journal.
        reached: the last position the code took (``-1``: none).
        divergence: the replay's error when ``verdict`` is ``"diverged"``: its
            ``position``, ``expected`` (the journal's ``(kind, name)``) and ``got``.
        then: what a live execution would do next: ``"run"`` (write a new step),
            ``"wait"``, ``"finish"``, ``"fail"`` (the workflow raises on its journaled
            results, as it would live), ``"next session"``, ``"start a child"``.
        raised: with ``then == "fail"``, ``Type: message`` of what the workflow raised.
    """

    verdict: Verdict
    journaled: int
    reached: int
    then: str
    divergence: NondeterminismError | None = None
    raised: str | None = None


class _Refusing(Committer):
    """Refuses every commit before it reaches the store, and notes that one came."""

    def __init__(self, store: Store, engine_clock: Any) -> None:
        super().__init__(store, engine_clock)
        self.asked = False

    async def commit(self, write: RunWrite) -> WriteResult:
        self.asked = True
        return WriteResult(ok=False, conflict=_PAST)


class _NoStarts:
    """Resolves child workflows as the App does; starts none (a new child is new work)."""

    def __init__(self, inner: ChildStarter | None) -> None:
        self.inner = inner
        self.asked = False

    def child_workflow(self, target: Any) -> Workflow[Any, Any]:
        if self.inner is None:
            raise StoreError("this replay cannot resolve child workflows")
        return self.inner.child_workflow(target)

    def start_child(self, *args: Any, **kwargs: Any) -> str:
        self.asked = True
        raise StoreError(_PAST)


def replay_engine(engine: Engine, threads: ThreadPoolExecutor) -> Engine:
    """``engine`` as a replay check runs: commits refused, no child started, no step
    interceptor (a replay executes no step), no wait kept inline."""
    return replace(
        engine,
        committer=_Refusing(engine.store, engine.clock),
        children=_NoStarts(engine.children),
        threads=threads,
        interceptors=(),
        inline_wait_s=0.0,
        commit_attempts=1,
        lease_s=None,
    )


async def replay_journal(engine: Engine, run: RunRecord, workflow: Workflow[Any, Any]) -> Replayed:
    """Replay ``run``'s current session against ``workflow`` on ``engine`` (made by
    :func:`replay_engine`): nothing is written, no step function runs."""
    guard_workflow_tasks()
    in_workflow.set(True)
    journal = engine.store.load_steps(run.id, run.session)
    control = RunControl(worker="replay-check")
    cur = Cursor(run=run, journal=journal, engine=engine, life=Lifecycle(run, control))
    raised, _ = await _run_workflow(workflow, RunContext(run=run, cursor=cur), run)
    life = cur.life
    task = asyncio.current_task()
    if life.cancelled_main and task is not None:
        task.uncancel()  # the context cancelled this task itself, to suspend the run
    stop = life.stop  # how it ended, before settling closes the execution
    with contextlib.suppress(BaseException):  # steps it started and left: none run
        await life.settle()
    journaled = max((r.seq for r in journal), default=-1) + 1
    if isinstance(stop, _EngineFailure) and isinstance(stop.error, NondeterminismError):
        return Replayed("diverged", journaled, cur.seq, "stop", divergence=stop.error)
    then = _then(cur, stop, raised)
    ahead = [r for r in journal if r.seq > cur.seq and r.kind != "patch"]
    if then in ("finish", "fail", "next session") and ahead:
        # The code ended where the journal goes on: steps it no longer asks for.
        first = min(ahead, key=lambda r: r.seq)
        error = NondeterminismError(
            f"replay expected {first.kind} {first.name!r} at position {first.seq} of session "
            f"{run.session} but the workflow ended there ({then}): the workflow's code "
            "changed while the run was in flight",
            run_id=run.id,
            step=cur.where(first.seq, first.name),
            position=first.seq,
            expected=(first.kind, first.name),
            got=("end", then),
        )
        return Replayed("diverged", journaled, cur.seq, then, divergence=error)
    shown = None if then != "fail" or raised is None else _shown(raised)
    return Replayed("clean", journaled, cur.seq, then, raised=shown)


def _then(cur: Cursor, stop: BaseException | None, raised: BaseException | None) -> str:
    """What a live execution would do at the point the replay stopped."""
    engine = cur.engine
    if isinstance(engine.children, _NoStarts) and engine.children.asked:
        return "start a child"
    if isinstance(stop, _Suspend):
        return "wait"
    if isinstance(stop, Cancelled):
        return "cancel"
    if isinstance(stop, _ContinueAsNew):
        return "next session"
    if isinstance(engine.committer, _Refusing) and engine.committer.asked:
        return "run"
    if stop is None and raised is None:
        return "finish"
    return "fail"


def _shown(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {safe_str(exc)}"[:300]
