"""What a run's context needs from the process it runs in."""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .._clock import Clock
from .._errors import MainspringError
from ..storage import ParentClose, RunWrite, Store, WriteResult
from ._intercept import StepInterceptor
from ._live import LiveRedaction
from ._retry import RetryPolicy
from ._workflow import Workflow

__all__ = ["ChildStarter", "Committer", "Engine", "RunControl"]


class Committer:
    """Commits a run's writes: inline in the event loop's thread (one run in a
    script), or, in a worker, through :class:`BatchCommitter` so that the writes of
    many runs share one transaction."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        # Called in the run's event loop after each commit (telemetry counts what
        # became durable here; a fork's copied rows and replays never pass by).
        self.observers: list[Callable[[RunWrite, WriteResult], None]] = []
        # Set by the worker while it executes a single run: nothing else needs the
        # event loop meanwhile (see BatchCommitter.commit and journal/_threads.py).
        self.solo = False

    async def commit(self, write: RunWrite) -> WriteResult:
        return self.observed(write, self.store.commit([write], self.clock.now())[0])

    def observed(self, write: RunWrite, result: WriteResult) -> WriteResult:
        for observe in self.observers:
            observe(write, result)
        return result

    async def close(self) -> None:
        return None


class ChildStarter(Protocol):
    """What the engine needs from the application to start child runs (the
    :class:`~mainspring.App` is one)."""

    def child_workflow(self, target: Any) -> Workflow[Any, Any]:
        """The registered workflow ``target`` names (a :class:`Workflow` or a name)."""

    def start_child(
        self,
        workflow: Workflow[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        key: str,
        parent: str,
        parent_step: str,
        on_parent_close: ParentClose = "cancel",
    ) -> str:
        """Create the child run (or find the one ``key`` names) and return its id."""


@dataclass(slots=True)
class Engine:
    """Shared, per-process parts: the store, time, randomness and settings."""

    store: Store
    clock: Clock
    rng: random.Random
    committer: Committer
    threads: Executor
    default_retry: RetryPolicy
    inline_wait_s: float
    commit_attempts: int = 6
    # JSON text -> JSON text with secrets replaced, applied before anything is journaled
    # (returns its argument itself when there is nothing to hide).
    redact: Callable[[str], str] | None = None
    # makes the redaction of one live token stream's text (the App's redactor's
    # ``live``): secrets never reach the stream table either
    live_redaction: Callable[[], LiveRedaction] | None = None
    # wrap every executed step attempt (the App's ``interceptors``), outermost first
    interceptors: tuple[StepInterceptor, ...] = ()
    # starts child runs (``ctx.child``); None: this engine cannot (no App behind it)
    children: ChildStarter | None = None
    # The lease a worker holds its runs by (None: no worker, no lease). A step function
    # about to start more than half a lease after its run was last proven this
    # execution's (a commit the fence let through) proves it again first: a worker
    # frozen between a step's intent and its function, and thawed after another took
    # the run over, starts nothing of a run it no longer holds.
    lease_s: float | None = None
    # A journaled step name -> the name the same step has today (None: names are only
    # ever equal). The journal knows nothing of what a step name means: the floor that
    # names steps supplies this (the App passes the models floor's ``without_endpoint``,
    # which maps a model step's older ``model:P:M@<url>`` spelling to ``model:P:M``).
    canonical_step_name: Callable[[str], str] | None = None


@dataclass(slots=True)
class RunControl:
    """How a worker talks to one run it executes: why its task was cancelled, and
    whether the worker is draining (shutting down)."""

    reason: Literal["cancel", "lost", "shutdown"] | None = None
    draining: bool = False
    # Set while the execution commits how it leaves its worker (a finish, a
    # suspension, a new session, a release). A cancel request does not interrupt
    # that commit: stopped there, the run would be left running with nobody
    # holding it, until its lease expired and a recovery was charged for a worker
    # that never died. The store honours the request in the commit instead (a finish
    # ends the run cancelled, a suspension wakes it at once to be cancelled).
    committing: bool = False
    # Set once the run has committed progress (a step ended, or the run moved on)
    # that cleared its count of recoveries: a worker isolating a suspect run waits
    # for this before it takes other runs again.
    progressed: bool = False
    # The worker's id, named on the run when its code cannot replay it.
    worker: str = ""
    # Set when this code could not replay the run and left it for another worker
    # (outcome ``refused``): the replay error.
    refused: MainspringError | None = None
