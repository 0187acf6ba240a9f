"""Plain values that cross the storage boundary. Payload columns hold JSON text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

__all__ = [
    "FINISHED",
    "JOURNAL_ROLES",
    "JournalRole",
    "ParentClose",
    "RunRecord",
    "RunStatus",
    "RunTransition",
    "RunWrite",
    "SignalRecord",
    "StepKind",
    "StepRecord",
    "StepStatus",
    "WriteResult",
    "join_wait_signals",
    "split_wait_signals",
]

RunStatus = Literal["queued", "running", "sleeping", "waiting", "succeeded", "failed", "cancelled"]
# ``wake_at`` of a run that must wake at once. Not the sender's "now": a client whose
# clock runs ahead of the workers' would otherwise delay the wake-up by the skew.
WAKE_NOW = 0.0

FINISHED: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})

# ``wait_signal`` of a run waiting for several signals at once (``asyncio.wait`` or
# ``gather`` of ``wait_for``): the names joined by this separator, which signal names
# may not contain. A single name is stored as it is, as it always was.
WAIT_SIGNAL_SEP = "\x1f"


def join_wait_signals(names: list[str]) -> str:
    """The ``wait_signal`` column for a run that waits for any of ``names``."""
    return WAIT_SIGNAL_SEP.join(names)


def split_wait_signals(wait_signal: str | None) -> list[str]:
    """The signal names a ``wait_signal`` column holds (none for ``None``)."""
    return [] if wait_signal is None else wait_signal.split(WAIT_SIGNAL_SEP)


ParentKind = Literal["fork", "child"]
ParentClose = Literal["cancel", "abandon"]
"""What a child run's parent's end does to it (``on_parent_close=``): ``cancel`` it
(with the parent's cascade) or ``abandon`` it (it runs on, on its own)."""
StepKind = Literal["step", "sleep", "signal", "now", "uuid", "random", "patch"]
"""What a journal row is. ``patch``: the marker of a code change a run took
(``ctx.patched``, ``ctx.version``), named by the change's id, its version as output."""
StepStatus = Literal["started", "retrying", "completed", "failed"]
JournalRole = Literal["step", "model", "tool", "rate", "wait", "child"]
"""What a ``ctx.step`` row is, as its writer declared it (``ctx.step(..., role=...)``):
``model`` a model call, ``tool`` a tool call, ``rate`` rate-limit bookkeeping (a slot
booked or given back), ``wait`` a rate-limit wait (the wake time after a provider's
refusal), ``child`` the start of a child run (``ctx.child``; its output is the
child's id), ``step`` any other step. Rows of the other kinds (sleeps, signals, recorded
values) keep the default ``step``: their kind says what they are."""

JOURNAL_ROLES: frozenset[str] = frozenset(get_args(JournalRole))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """One row of ``ms_runs``.

    ``parent`` / ``parent_step``: the run this one came from and that run's step
    (``"session:seq"``); ``parent_kind`` says how: ``"fork"`` (forked from it) or
    ``"child"`` (started by it as a step). ``None`` for a run with no parent.
    ``version``: the code version of the application that submitted it
    (``App(version=...)``), ``None`` when none was declared.
    ``queue`` / ``queue_key`` / ``priority``: the queue it was submitted to (``None``:
    none), its key within that queue (per-key limits) and its priority there
    (higher first).
    ``parent_close``: a child's parent-close policy (:data:`ParentClose`); ``None``
    for a run that is no child, or a child started before the policy existed (its
    parent's cancel cascades to it, its parent's normal end leaves it running).
    ``retries``: how many times the run was retried after it failed
    (:meth:`~mainspring.App.retry`).
    """

    id: str
    workflow: str
    key: str | None
    status: RunStatus
    input: str
    output: str | None
    error: str | None
    session: int
    handoff: str | None
    epoch: int
    owner: str | None
    lease_until: float | None
    wake_at: float | None
    wait_reason: str | None
    recoveries: int
    cancel_requested: bool
    created_at: float
    updated_at: float
    finished_at: float | None
    # The caller's W3C ``traceparent`` from submission: the run's spans join its trace.
    traceparent: str | None = None
    parent: str | None = None
    parent_step: str | None = None
    parent_kind: ParentKind | None = None
    version: str | None = None
    # The schedule that started the run (its key, ``schedule:<name>:<time>``, names
    # the due time); None: it was not started by a schedule.
    schedule: str | None = None
    queue: str | None = None
    queue_key: str | None = None
    priority: int = 0
    parent_close: ParentClose | None = None
    retries: int = 0

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


@dataclass(slots=True, kw_only=True)
class StepRecord:
    """One row of ``ms_steps``: a journal entry, keyed ``(run_id, session, seq)``.

    ``role``: what a ``kind="step"`` row is (see :data:`JournalRole`); not part of the
    step's identity, which is its kind and name.
    """

    run_id: str
    session: int
    seq: int
    kind: StepKind
    name: str
    status: StepStatus
    attempt: int
    epoch: int
    output: str | None = None
    error: str | None = None
    started_at: float
    finished_at: float | None = None
    wake_at: float | None = None
    role: JournalRole = "step"


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalRecord:
    id: int
    run_id: str
    name: str
    payload: str
    created_at: float
    consumed_at: float | None
    consumed_by: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTransition:
    """A change of a run's status committed with its last journal writes.

    ``suspend``: the run leaves its worker (``sleeping`` until ``wake_at``, or
    ``waiting`` for ``wait_signal`` and/or ``wake_at``; ``wait_signal`` may name several
    signals, see :func:`join_wait_signals`: any of them wakes the run). ``finish``: a
    final status with output or error. ``next_session``: continue-as-new with
    ``handoff``; the worker keeps the lease. ``keeps_slot``: a suspend whose every
    wait is a retry back-off; the run keeps its queue slot while it sleeps.
    """

    kind: Literal["suspend", "finish", "next_session"]
    status: RunStatus | None = None
    output: str | None = None
    error: str | None = None
    wake_at: float | None = None
    wait_reason: str | None = None
    wait_signal: str | None = None
    handoff: str | None = None
    # ``next_session``: the session this write ends. The store sets ``session + 1``
    # only where the run is still in it, so a re-sent commit cannot skip a session.
    session: int | None = None
    keeps_slot: bool = False


@dataclass(slots=True, kw_only=True)
class RunWrite:
    """Everything one run wants committed at once, fenced by ``epoch``."""

    run_id: str
    epoch: int
    steps: list[StepRecord] = field(default_factory=list)
    consume: list[tuple[int, str]] = field(default_factory=list)  # (signal id, "session:seq")
    transition: RunTransition | None = None
    reset_recoveries: bool = False


@dataclass(frozen=True, slots=True)
class WriteResult:
    """``ok`` is False when the fence refused the write: the run is no longer
    ``running`` at the writer's epoch (another worker claimed it, or it was
    finished, dead-lettered, cancelled or retried), or ``conflict`` says why."""

    ok: bool
    cancel_requested: bool = False
    # The run's row is locked by another transaction: nothing was written; retry.
    busy: bool = False
    # A re-sent finish or suspend that had already been applied (the first send
    # committed but its caller saw an error): ``ok``, and nothing was written again.
    already: bool = False
    # Why an otherwise current write was refused (a signal another wait consumed).
    conflict: str | None = None
