"""Sticky executions: a suspended run's live coroutine, kept to resume instead of replaying.

A run that suspends after each of n steps costs O(n²) if every wake-up replays it
from the top. With stickiness on, a wait that parks does not raise through the
workflow: it awaits a *waker* while the executor commits the suspension and hands
the live execution (the workflow's task, its context and cursor) to the worker. If
the same worker claims the run next (its epoch is exactly one past the epoch of
the suspension, so nobody else held or re-opened it, and no other write reached
its journal, every one of which is fenced on the epoch), the execution takes the
new epoch and its parked waits wake and check again, exactly as a replay reaching
them would. Anything else (a takeover, an eviction, a restart, a mismatch) drops
the execution and the run is replayed.

While kept, the execution is *dormant* (see :mod:`._lifecycle`): every use of the
context meets a :class:`_Closed` marker, so that a task of the workflow still doing
something of its own cannot use it (it would be fenced anyway: the run is not running
at that epoch). If it tried, or the workflow's task ended meanwhile, the execution is
spoiled and is replayed instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..storage import RunRecord, RunTransition
from ._context import RunContext
from ._cursor import Cursor
from ._engine import RunControl
from ._workflow import Workflow

__all__ = ["Execution"]

# What a kept execution is taken to cost beyond its journal (the coroutine's frames,
# the context, the cursor): a rough figure for the worker's memory bound.
_BASE_BYTES = 16_384


class Execution:
    """One live execution of a run: the task running its workflow and its context.

    Made by :func:`~mainspring.journal.execute` when stickiness is on; a worker
    keeps the ones that suspended and passes one back to ``execute`` to resume it.
    Its state is its lifecycle's (``life``); this is the worker's handle on it.
    """

    def __init__(
        self,
        ctx: RunContext,
        cur: Cursor,
        task: asyncio.Task[tuple[BaseException | None, Any]],
        run: RunRecord,
        workflow: Workflow[Any, Any],
    ) -> None:
        self.ctx = ctx
        self.cur = cur
        self.life = cur.life
        self.task = task
        self.run = run
        self.workflow = workflow
        self.wake_at: float | None = None  # of the suspension it is kept at
        self.transition: RunTransition | None = None
        self.kept_bytes = 0  # as counted by whoever keeps it
        self._size = -1

    @property
    def run_id(self) -> str:
        return self.run.id

    @property
    def dropped(self) -> bool:
        return self.life.dropped

    @property
    def size(self) -> int:
        """A rough size in bytes (for the worker's bound on what it keeps): the journal
        it replayed (read once: it does not change) and a fixed cost."""
        if self._size < 0:
            rows = self.cur.journal.values()
            self._size = _BASE_BYTES + sum(len(r.output or "") + len(r.error or "") for r in rows)
        return self._size

    def sleep(self, transition: RunTransition) -> None:
        """Go dormant at a suspension about to be committed (the waits decided it and
        parked the execution meanwhile): the context refuses every use until :meth:`wake`."""
        self.transition = transition
        self.wake_at = transition.wake_at
        self.life.sleep()

    def fits(self, run: RunRecord) -> bool:
        """Whether ``run`` (just claimed) can resume this execution: nobody else held,
        re-opened or wrote the run since it suspended, and the execution is intact."""
        cur = self.cur
        return (
            run.id == self.run.id
            and run.workflow == self.run.workflow
            and run.session == cur.session
            and run.epoch == cur.epoch + 1
            and self.life.resumable()  # dormant, and nothing used the context since
            and not cur.pending
            and not cur.consume
            and not self.task.done()
        )

    def wake(self, run: RunRecord, control: RunControl) -> None:
        """Resume at ``run``'s epoch: the parked waits check again, in journal order."""
        self.run = run
        self.transition = None
        self.cur.reclaim(run)
        self.life.wake(run, control)

    def drop(self) -> None:
        """End the kept execution: nothing it does can reach the run any more (it is
        closed, and its epoch is fenced off), and its tasks are cancelled."""
        self.life.drop()
