"""An asyncio event loop that runs on virtual time and lets a seed choose what runs.

The loop is asyncio's own (timers, futures, tasks and ``asyncio.to_thread`` behave as
in production); only three things differ:

* **time is virtual.** ``loop.time()`` reads a number that moves only when nothing is
  ready: then it jumps to the next timer. A simulated hour costs what its callbacks
  cost, and the loop never sleeps or polls a selector.
* **the next callback is chosen by a seeded** ``random.Random``. Every callback
  belongs to an *owner* (a simulated worker process, or ``None`` for the outside
  world), read from the context it was scheduled in (:data:`OWNER`). Each turn the
  loop picks one owner among those with a callback ready and runs that owner's
  oldest one: each simulated process keeps asyncio's FIFO order, as a real one
  would, and the seed decides how the processes interleave, at every await point.
* **no threads.** ``run_in_executor`` (and so ``asyncio.to_thread``) runs its
  function in a callback of the caller's owner, at a turn the seed picks, as a
  thread would finish at some moment the caller cannot know.

An owner can be **killed** (its callbacks and timers are dropped, now and later:
the process is gone without running one more line, ``finally`` blocks included) or
**frozen** until a virtual time (a stopped process, a GC pause: its callbacks wait
while everyone else's time moves on).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import heapq
import random
import warnings
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, cast

__all__ = ["OWNER", "SimLoop", "SimStalled"]

#: The simulated process the current code belongs to (``None``: the outside world).
OWNER: contextvars.ContextVar[int | None] = contextvars.ContextVar("mainspring_sim_owner")

_OUTSIDE = 255  # the outside world's byte in the decision record


class SimStalled(RuntimeError):
    """Nothing can ever run again: no callback ready, no timer, nobody frozen."""


class SimLoop(asyncio.SelectorEventLoop):
    """The simulated loop (see the module). ``rng`` draws every scheduling choice.

    ``on_turn(owner)``, when set, runs before each picked callback of a simulated
    process: the simulation's chance to inject a fault at exactly that await point
    (returning ``False`` skips the callback: its owner was just killed or frozen).
    """

    def __init__(self, rng: random.Random, *, start: float = 0.0) -> None:
        super().__init__()
        self.rng = rng
        self._now = start
        self.dead: set[int] = set()
        self.frozen: dict[int, float] = {}  # owner -> the virtual time it wakes
        self.on_turn: Callable[[int], bool] | None = None
        self.turns = 0
        self.decisions = bytearray()  # the owner of every turn, one byte each
        self._tasks_of: dict[int, list[asyncio.Task[Any]]] = {}
        self._failed: list[tuple[int | None, asyncio.Future[Any]]] = []
        self.set_task_factory(self._new_task)
        self.set_exception_handler(_quiet_about_the_dead)

    # -- time ---------------------------------------------------------------------------

    def time(self) -> float:
        return self._now

    def jump(self, seconds: float) -> None:
        """Move virtual time forward at once (a clock jump every process sees)."""
        self._now += seconds

    # -- owners -------------------------------------------------------------------------

    def _new_task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kw)
        context = kw.get("context")
        owner = (context or contextvars.copy_context()).get(OWNER, None)
        if owner is not None:
            self._tasks_of.setdefault(owner, []).append(task)
        return task

    def kill(self, owner: int) -> None:
        """The process is gone: none of its callbacks runs again. Its coroutines are
        kept (closing one would run its ``finally``, which a dead process never does)
        until :meth:`bury`."""
        self.dead.add(owner)
        self.frozen.pop(owner, None)
        for task in self._tasks_of.get(owner, ()):
            task._log_destroy_pending = False  # type: ignore[attr-defined]

    def freeze(self, owner: int, until: float) -> None:
        """The process stops (its callbacks wait) until virtual time ``until``."""
        if owner not in self.dead:
            self.frozen[owner] = max(until, self.frozen.get(owner, until))

    def bury(self) -> None:
        """At the end: close the coroutine of every task left pending, the killed
        processes' and any other, quietly (what their ``finally`` blocks try fails
        against their dead stores, as it would, or is moot: the simulation is over)."""
        for owner, fut in self._failed:
            if owner in self.dead:  # read for the dead process, which never will
                fut.exception()
        self._failed.clear()
        left = [t for tasks in self._tasks_of.values() for t in tasks]
        left += asyncio.all_tasks(self)
        self._tasks_of.clear()
        with warnings.catch_warnings():
            # A task that never started says its coroutine "was never awaited": true.
            warnings.simplefilter("ignore", RuntimeWarning)
            for task in left:
                if not task.done():
                    task._log_destroy_pending = False  # type: ignore[attr-defined]
                    with contextlib.suppress(BaseException):  # a dead process's last gasp
                        task.get_coro().close()
            del left
            gc.collect()  # what their frames held, cycles included, goes now, quietly

    # -- the executor: no threads --------------------------------------------------------

    def run_in_executor(  # type: ignore[override]
        self, executor: Executor | None, func: Any, *args: Any
    ) -> asyncio.Future[Any]:
        fut = self.create_future()
        self.call_soon(self._call_into, fut, func, args)
        return fut

    def _call_into(self, fut: asyncio.Future[Any], func: Any, args: tuple[Any, ...]) -> None:
        if fut.cancelled():
            return
        try:
            result = func(*args)
        except BaseException as exc:  # what the thread's future would carry
            fut.set_exception(exc)
            # If this process dies before its task reads it, nobody will: see bury().
            self._failed.append((OWNER.get(None), fut))
        else:
            fut.set_result(result)

    def _write_to_self(self) -> None:
        """Nothing to wake: every callback comes from this thread."""

    # -- the turn -----------------------------------------------------------------------

    def _run_once(self) -> None:
        while True:
            self._drop_cancelled_timers()
            handle = self._pick()
            if handle is not None:
                handle._run()
                return
            if not self._advance():
                raise SimStalled(
                    f"nothing can run at virtual time {self._now:.3f}: no callback is ready, "
                    "no timer is set and no process is frozen"
                )

    # asyncio keeps its queues in private attributes (``_ready``, a deque of handles;
    # ``_scheduled``, a heap of timers): this loop reads them as the base loop does.

    def _drop_cancelled_timers(self) -> None:
        base: Any = self
        scheduled = base._scheduled
        if base._timer_cancelled_count > 100 and base._timer_cancelled_count > len(scheduled) / 2:
            kept = [h for h in scheduled if not h._cancelled]
            for h in scheduled:
                if h._cancelled:
                    h._scheduled = False
            heapq.heapify(kept)
            base._scheduled = scheduled = kept
            base._timer_cancelled_count = 0
        while scheduled and scheduled[0]._cancelled:
            base._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False
        while scheduled and scheduled[0]._when <= self._now:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            if not handle._cancelled:
                base._ready.append(handle)
            else:
                base._timer_cancelled_count -= 1

    def _advance(self) -> bool:
        """Nothing is runnable now: move time to the next timer or thaw."""
        scheduled = cast(Any, self)._scheduled
        nexts = [scheduled[0]._when] if scheduled else []
        nexts += self.frozen.values()
        if not nexts:
            return False
        self._now = max(self._now, min(nexts))
        for owner, until in list(self.frozen.items()):
            if until <= self._now:
                del self.frozen[owner]
        return True

    def _owners(self, ready: Any) -> tuple[list[int | None], bool]:
        """The owners that may run now, in the order of their oldest ready callback,
        and whether ``ready`` holds callbacks to drop (cancelled, or a dead owner's)."""
        owners: list[int | None] = []
        dead, frozen = self.dead, self.frozen
        stale = False
        for handle in ready:
            owner = handle._context.get(OWNER, None)
            if handle._cancelled or (owner is not None and owner in dead):
                stale = True
            elif (owner is None or owner not in frozen) and owner not in owners:
                owners.append(owner)
        return owners, stale

    def _pick(self) -> Any:
        """The next callback to run (``None``: nothing can run now)."""
        base: Any = self
        ready = base._ready
        if not ready:
            return None
        owners, stale = self._owners(ready)
        dead = self.dead
        if stale:
            base._ready = ready = type(ready)(
                h for h in ready if not h._cancelled and h._context.get(OWNER, None) not in dead
            )
        if not owners:
            return None
        chosen = owners[self.rng.randrange(len(owners))] if len(owners) > 1 else owners[0]
        for i, handle in enumerate(ready):
            if handle._context.get(OWNER, None) == chosen:
                del ready[i]
                break
        self.turns += 1
        self.decisions.append(_OUTSIDE if chosen is None else chosen & 0xFF)
        if chosen is not None and self.on_turn is not None and not self.on_turn(chosen):
            if chosen not in dead:
                ready.appendleft(handle)  # frozen: it runs first when it thaws
            return self._pick()
        return handle


def _quiet_about_the_dead(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's handler, but for a gather a killed process awaited: its children
    ended cancelled and the process that would have read that is gone."""
    error = context.get("exception")
    if isinstance(error, asyncio.CancelledError) and "never retrieved" in str(
        context.get("message")
    ):
        return
    loop.default_exception_handler(context)
