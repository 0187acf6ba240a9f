"""One execution's lifecycle: its state, how it ends, and the tasks and waits it holds.

An execution is one pass of a workflow function over a session's journal, in one
worker. It is in one of five states, and only the methods below move it between them,
each refusing (:class:`IllegalTransition`) a state it cannot come from (:data:`EDGES`
is the table; a test walks it)::

    running ──decide──▶ closing ──settle──▶ closed
      │     ▲             ▲
     park  wake       interrupt
      ▼     │             │
    parked ─┼─────────────┘
      │     │
     sleep  │
      ▼     │
    dormant ┘

``settle`` also leads to closed from running and parked, and ``drop`` from any state.

- **running**: workflow code uses the context; nothing is decided yet.
- **closing**: how the execution ends is decided (:attr:`Lifecycle.stop`: a suspension,
  a new session, a release, a cancel, an engine failure): every later use of the
  context raises it again, whatever the workflow did with the first one, while its
  code unwinds. The first decision stands.
- **parked** (sticky executions, see :mod:`._sticky`): the waits decided a suspension
  and the workflow stays alive, awaiting its wakers; the executor is told
  (:attr:`Lifecycle.parking`) and commits it. Nothing may use the context meanwhile.
- **dormant**: the suspension is committed and the worker keeps the execution, until
  the run is claimed again (:meth:`Lifecycle.wake`) or it is dropped. A use of the
  context while parked or dormant *spoils* it: the run is then replayed, not resumed.
- **closed**: settled (no task may act for the run any more) or dropped.

The journal cursor (:mod:`._cursor`) keeps the position, the lookup, the buffer and
the flush; this object keeps everything else the context's parts share about the
execution. Only this module writes its fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from .._errors import Cancelled, MainspringError
from ..storage import RunRecord, RunTransition
from ._control import _Closed, _ContinueAsNew, _EngineFailure, _Release, _Suspend
from ._engine import RunControl

__all__ = ["EDGES", "IllegalTransition", "LifeState", "Lifecycle", "Parked"]

log = logging.getLogger("mainspring.journal")

LifeState = Literal["running", "parked", "dormant", "closing", "closed"]

# Each transition: the states it may start from, and the state it leads to.
# ``decide`` outside ``running`` is not a transition: the first decision stands, and
# the standing one is returned (see Lifecycle.decide).
EDGES: dict[str, tuple[frozenset[LifeState], LifeState]] = {
    "decide": (frozenset({"running"}), "closing"),
    "park": (frozenset({"running"}), "parked"),
    "interrupt": (frozenset({"parked"}), "closing"),
    "sleep": (frozenset({"parked"}), "dormant"),
    "wake": (frozenset({"dormant"}), "running"),
    "settle": (frozenset({"running", "closing", "parked"}), "closed"),
    "drop": (frozenset({"running", "parked", "dormant", "closing", "closed"}), "closed"),
}

# How long a finished run's leftover tasks may take to obey their cancellation.
_SETTLE_S = 10.0

# A wait that cannot complete in this execution: (signal, wake_at, reason).
Parked = tuple[str | None, float | None, str]


class IllegalTransition(RuntimeError):
    """A transition asked of an execution in a state it cannot come from: a bug in
    mainspring, never something workflow code can cause."""


def _nothing() -> None:
    return None


class Lifecycle:
    """The state of one execution of a run and the only way to change it.

    Args:
        run: the run as claimed (its id, whether a cancel was asked).
        control: how the worker talks to the run.
        sticky: a suspension parks the execution (see :mod:`._sticky`) instead of
            raising through the workflow.
    """

    def __init__(self, run: RunRecord, control: RunControl, *, sticky: bool = False) -> None:
        self.run_id = run.id
        self.control = control
        self.state: LifeState = "running"
        # How this execution ends, once decided; while parked or dormant, a marker that
        # every use of the context meets (as a replay would meet the suspension).
        self.stop: BaseException | None = None
        self.cancel = run.cancel_requested
        try:
            self.main: asyncio.Task[Any] | None = asyncio.current_task()
        except RuntimeError:  # made outside an event loop
            self.main = None
        self.tasks: set[asyncio.Task[Any]] = set()  # other tasks that used the context
        self.running = 0  # step functions executing now (more than one under gather)
        self._steps_done: asyncio.Future[None] | None = None  # settle waits on it
        self.busy = 0  # commits (and short sleeps) in flight from workflow code
        self.activity = 0  # bumped by every use of the context
        self.cancelled_main = False  # the context cancelled the main task to suspend
        # The run is being finished (not suspended, released or continued) while step
        # attempts may still run: those are cancelled and journaled as such.
        self.ending = False
        # Waits that cannot complete in this execution, by key (a wait's seq, or a
        # negative number for a sleep). The run suspends once nothing else can happen.
        self.parked: dict[int, Parked] = {}
        self._on_parked_activity: Callable[[], None] = _nothing
        # Step attempts the engine stopped while their sync function still ran on a
        # thread: each journals how its thread ended before the run's outcome commits.
        self._leftovers: list[Callable[[], Awaitable[None]]] = []
        # Sticky only: resolved with the suspension when the execution parks; and the
        # futures its parked waits await, resolved in key order when it wakes.
        self.parking: asyncio.Future[RunTransition] | None = None
        if sticky:
            self.parking = asyncio.get_running_loop().create_future()
        self.wakers: dict[int, asyncio.Future[None]] = {}
        self.spoiled = False  # something used the context while parked or dormant
        self._parked_activity = -1
        self.dropped = False

    def _expect(self, edge: str) -> None:
        allowed, _ = EDGES[edge]
        if self.state not in allowed:
            raise IllegalTransition(
                f"run {self.run_id}: {edge} from {self.state!r} (allowed from "
                f"{', '.join(sorted(allowed))})"
            )

    # -- every use of the context -------------------------------------------------------

    def boundary(self) -> None:
        """Every use of the context passes here: raise how the execution ends, if that
        is decided, and note the task and the activity."""
        if self.stop is not None:
            raise self.stopped()
        task = asyncio.current_task()
        if task is not self.main and task is not None:
            if len(self.tasks) > 256:  # a long run of many gathers: forget the done ones
                self.tasks = {t for t in self.tasks if not t.done()}
            self.tasks.add(task)
        self.activity += 1
        if self.cancel:
            raise self.decide(Cancelled(self.run_id))
        if self.control.draining:
            raise self.decide(_Release())

    def stopped(self) -> BaseException:
        """The decided end, for a use of the context to raise (``None`` is a bug: call
        it only once :attr:`stop` is set). A use while parked or dormant spoils the
        execution."""
        stop = self.stop
        assert stop is not None
        if self.state == "parked" or self.state == "dormant":
            self.spoiled = True
        return stop

    def touch(self) -> None:
        """Note activity (a step or a commit ended)."""
        self.activity += 1
        if self.parked:
            self._on_parked_activity()

    def watch(self, on_parked_activity: Callable[[], None]) -> None:
        """Call ``on_parked_activity`` on activity while some wait is parked (the waits
        watch for quiet)."""
        self._on_parked_activity = on_parked_activity

    # -- deciding how it ends -----------------------------------------------------------

    def decide(self, stop: BaseException) -> BaseException:
        """Decide how this execution ends (running → closing) and return it. Once
        decided, the first decision stands: it is returned, and ``stop`` is dropped;
        asked while parked or dormant, the execution is spoiled."""
        if self.state == "running":
            self.stop = stop
            self.state = "closing"
            return stop
        return self.stopped() if self.stop is not None else stop

    def fail(self, error: MainspringError) -> _EngineFailure:
        """An engine failure, as workflow code must see it (see :class:`_EngineFailure`)."""
        failure = _EngineFailure(error)
        self.decide(failure)
        return failure

    def cancel_asked(self) -> None:
        """A commit found the run's cancel asked: the next use of the context stops."""
        self.cancel = True

    # -- steps, commits and leftovers ---------------------------------------------------

    def step_began(self) -> None:
        self.running += 1

    def step_ended(self) -> None:
        self.running -= 1
        if not self.running and self._steps_done is not None:
            if not self._steps_done.done():
                self._steps_done.set_result(None)
            self._steps_done = None
        self.activity += 1  # touch(), inline: once a step
        if self.parked:
            self._on_parked_activity()

    def busy_began(self) -> None:
        """A commit or a short sleep of workflow code began: the run does not suspend
        under it."""
        self.busy += 1

    def busy_ended(self) -> None:
        self.busy -= 1
        self.activity += 1  # touch(), inline: once a commit
        if self.parked:
            self._on_parked_activity()

    def leave(self, ended: Callable[[], Awaitable[None]]) -> None:
        """A step attempt the engine stopped still runs on its thread: ``ended``
        journals how it ended, before the run's outcome commits."""
        self._leftovers.append(ended)

    async def leftovers_ended(self) -> None:
        """Wait for the threads of step attempts the engine stopped (each until its
        step's timeout) and buffer how each ended, before the run's outcome commits:
        no step of a finished run is still running (but past its timeout)."""
        leftovers, self._leftovers = self._leftovers, []
        if leftovers:
            await asyncio.gather(*(ended() for ended in leftovers))

    # -- parked waits ---------------------------------------------------------------------

    def park_wait(self, key: int, wait: Parked) -> asyncio.Future[None] | None:
        """A wait parks: the future it awaits in a sticky execution (resolved when the
        execution wakes), else ``None`` (it waits until the run suspends)."""
        self.parked[key] = wait
        if self.parking is None:
            return None
        waker = self.wakers[key] = asyncio.get_running_loop().create_future()
        return waker

    def unpark_wait(self, key: int) -> None:
        del self.parked[key]
        self.wakers.pop(key, None)

    def adopt(self, task: asyncio.Task[Any]) -> None:
        """The workflow runs in ``task`` (a sticky execution's own), made after the
        context and before anything used it."""
        if self.state != "running" or self.activity:
            raise IllegalTransition(f"run {self.run_id}: adopt once it is in use")
        self.main = task

    def cancel_tasks(self) -> None:
        """Suspend by cancelling the workflow's tasks where they wait (the suspension is
        decided): the main task's cancellation is the context's, and the executor takes
        it back."""
        main = self.main
        if main is not None and not main.done():
            self.cancelled_main = True
            main.cancel()
        for task in self.tasks:
            task.cancel()

    # -- a sticky execution's suspension ----------------------------------------------

    def park(self, transition: RunTransition) -> None:
        """Running → parked: the waits decided this suspension; the executor commits it
        and keeps the execution, and every use of the context meanwhile spoils it."""
        self._expect("park")
        assert self.parking is not None and not self.parking.done()
        self.state = "parked"
        self.stop = _Closed()
        self._parked_activity = self.activity
        self.parking.set_result(transition)

    def interrupt(self, transition: RunTransition) -> None:
        """Parked → closing: the worker interrupted the run, or something used the
        context, before the suspension was committed: the run suspends as without
        stickiness (the only decision that replaces another: the parked marker was
        never how the run ends)."""
        self._expect("interrupt")
        self.state = "closing"
        self.stop = _Suspend(transition)

    def sleep(self) -> None:
        """Parked → dormant: the suspension is being committed and the worker keeps the
        execution."""
        self._expect("sleep")
        self.state = "dormant"

    @property
    def intact(self) -> bool:
        """Parked or dormant, and nothing used the context since."""
        return self.state in ("parked", "dormant") and not self.spoiled

    def resumable(self) -> bool:
        """Dormant and untouched (no use of the context, no activity at all since it
        parked), with waits to wake."""
        return (
            self.state == "dormant"
            and not self.spoiled
            and self.activity == self._parked_activity
            and bool(self.wakers)
        )

    def wake(self, run: RunRecord, control: RunControl) -> None:
        """Dormant → running at ``run``'s claim: the parked waits check again, in key
        order (sleeps, then waits in journal order, as a replay would reach them)."""
        self._expect("wake")
        self.state = "running"
        self.stop = None
        self.control = control
        self.cancel = run.cancel_requested
        self.parking = asyncio.get_running_loop().create_future()
        for key in sorted(self.wakers):
            waker = self.wakers[key]
            if not waker.done():
                waker.set_result(None)

    # -- the end ------------------------------------------------------------------------

    async def settle(self) -> None:
        """Running, closing or parked → closed, before the run's outcome is committed:
        no task may act for it any more.

        On a release or a new session, step functions already running finish first
        (their ends are journaled with the transition); then every other task that
        used the context is cancelled and awaited, so none can write into the
        finished (or suspended) run.
        """
        self._expect("settle")
        stop = self.stop
        patient = isinstance(stop, _Release | _ContinueAsNew)
        self.ending = not patient and not isinstance(stop, _Suspend)
        if stop is None:
            self.stop = _Closed()
        self.state = "closed"
        me = asyncio.current_task()
        try:
            if patient and self.running:
                self._steps_done = asyncio.get_running_loop().create_future()
                await self._steps_done
        finally:  # even if the worker stops waiting (shutdown grace over): cancel them
            others = [t for t in self.tasks if t is not me and not t.done()]
            for task in others:
                task.cancel()
        if others:
            _, pending = await asyncio.wait(others, timeout=_SETTLE_S)
            if pending:
                log.warning(
                    "run %s: %d task(s) ignored their cancellation; they can no longer "
                    "write to the run",
                    self.run_id,
                    len(pending),
                )

    def drop(self) -> None:
        """Any state → closed: end the execution where it is (a kept one that will not
        be resumed, or one its executor left): nothing it does can reach the run any
        more (it is closed, and its epoch is fenced off), and its tasks are cancelled."""
        if self.dropped:
            return
        self.dropped = True
        if self.stop is None:
            self.stop = _Closed()
        self.state = "closed"
        self.ending = False
        tasks = [self.main, *self.tasks] if self.main is not None else list(self.tasks)
        for task in tasks:
            if not task.done():
                task.cancel()
            task.add_done_callback(_quiet)


def _quiet(task: asyncio.Task[Any]) -> None:
    """Retrieve a dropped task's end, so that asyncio does not log it as lost."""
    with contextlib.suppress(BaseException):
        task.exception()
