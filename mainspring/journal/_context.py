"""``RunContext``: every durable thing a workflow does goes through it.

A thin façade over three parts of one execution of a run:

- the journal cursor (:mod:`._cursor`): sequence numbers, this session's records,
  replay lookup, buffered rows and their fenced commits;
- step execution (:mod:`._steps`): attempts, retries, timeouts, interceptors;
- waits (:mod:`._waits`): sleeps, signals, requests to humans, and suspending the run.

Each call takes the next sequence number of the session. On replay a journaled
entry at that number returns its recorded result without running anything; a
different kind or name there raises :class:`NondeterminismError`. Writes are
buffered and committed once per step: the completion of one step shares its
commit with the intent row of the next (DESIGN.md §3).
"""

from __future__ import annotations

import uuid as uuid_mod
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NoReturn, TypeVar, overload

from .._clock import Clock
from .._errors import ApprovalRejected
from .._requests import Approval, RequestKind
from .._serde import dumps, loads
from ..storage import JournalRole, ParentClose, RunRecord, Store
from . import _patches
from ._children import ChildHandle, start_child
from ._control import SimulatedCrash, _ContinueAsNew
from ._cursor import Cursor
from ._live import TokenWriter
from ._retry import RetryPolicy
from ._stepinfo import StepInfo, current_step
from ._steps import StepMode, Steps
from ._waits import MISSING, Waits
from ._workflow import Workflow

__all__ = ["RunContext", "SimulatedCrash", "StepInfo", "StepMode", "current_step"]

T = TypeVar("T")
_MISSING: Any = MISSING


class RunContext:
    """The handle a workflow uses for everything durable. Not created by users.

    Attributes:
        run_id: this run's id.
        session: the session number (0, then +1 at each ``continue_as_new``).
        handoff: the value passed to ``continue_as_new`` by the previous session,
            ``None`` in session 0.
    """

    def __init__(self, *, run: RunRecord, cursor: Cursor) -> None:
        self.run_id = run.id
        self.workflow = run.workflow
        self.session = run.session
        self.handoff: Any = loads(run.handoff)
        self._engine = cursor.engine
        self._cursor = cursor
        self._waits = Waits(self._cursor)
        self._steps = Steps(self._cursor, self._waits)

    @property
    def store(self) -> Store:
        """The store the run lives in (integrations keep what they write on the run's
        behalf outside the journal there, fenced by :attr:`epoch`)."""
        return self._engine.store

    @property
    def clock(self) -> Clock:
        """The clock the run executes on (a test's ``FakeClock``, the lab's simulated
        time). Workflow code uses :meth:`now`, which is journaled; a step function may
        read this one, its result being journaled."""
        return self._engine.clock

    @property
    def epoch(self) -> int:
        """The run's epoch this execution holds (its claim's). Anything written on the
        run's behalf outside the journal (an integration's checkpoints) is fenced by
        it, so that a worker that lost the run writes nothing more."""
        return self._cursor.epoch

    @property
    def is_replaying(self) -> bool:
        """True while the workflow re-executes journaled steps."""
        return self._cursor.is_replaying

    def upcoming_role(self) -> JournalRole | None:
        """What the journal holds where the next ``ctx`` call lands: the role of that
        step row (``"model"``, ``"tool"``, ``"rate"``...; other kinds of rows count as
        ``"step"``), or ``None`` past the journal (a first execution from here).

        For code whose steps changed in a known, harmless way (an integration, the
        runtime's own model calls) to replay a journal written before the change."""
        rec = self._cursor.upcoming()
        return None if rec is None else rec.role

    # -- steps ------------------------------------------------------------------------

    @overload
    async def step(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        name: str | None = ...,
        mode: StepMode = ...,
        retry: RetryPolicy | None = ...,
        timeout: float | None = ...,
        role: JournalRole = ...,
        **kwargs: Any,
    ) -> T: ...

    @overload
    async def step(
        self,
        fn: Callable[..., T],
        *args: Any,
        name: str | None = ...,
        mode: StepMode = ...,
        retry: RetryPolicy | None = ...,
        timeout: float | None = ...,
        role: JournalRole = ...,
        **kwargs: Any,
    ) -> T: ...

    async def step(
        self,
        fn: Callable[..., Any],
        *args: Any,
        name: str | None = None,
        mode: StepMode = "at_least_once",
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        role: JournalRole = "step",
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` as a journaled step and return its result.

        A completed step is never run again: on replay its journaled result is
        returned (decoded to ``fn``'s return annotation). The result is the same
        JSON round-trip on the first execution, so code sees identical values
        either way.

        Args:
            fn: a sync or async function. Sync functions run in a thread.
            name: journal name; defaults to the function's qualified name.
            mode: ``"at_least_once"`` (default): a step interrupted by a crash runs
                again with the same idempotency key. ``"at_most_once"``: it is not
                re-run; :class:`StepInterrupted` is raised instead.
            retry: the back-off policy for attempts that raise; the App's default
                for ``at_least_once``, no retries for ``at_most_once``.
            timeout: seconds per attempt; a timed-out attempt raises
                :class:`StepTimeout` (retryable). A sync function's thread cannot be
                killed: it is abandoned and the run goes on. For an ``at_most_once``
                step a timeout is an unknown outcome: :class:`StepInterrupted`, and
                the step is never attempted again.
            role: what the step is, journaled with it for traces, metrics, the
                dashboard and interceptors: ``"model"`` (a model call), ``"tool"`` (a
                tool call), ``"rate"`` (rate-limit bookkeeping), ``"wait"`` (a
                rate-limit wait) or ``"step"`` (default: anything else). Not part of
                the step's identity: replay matches kind and name only.

        Any exception the function raises is a failed attempt, ``SystemExit``,
        ``KeyboardInterrupt`` and a ``CancelledError`` nobody asked for included.

        Raises:
            StepFailed: the step failed for good (same on replay).
            StepInterrupted: an ``at_most_once`` step was interrupted by a crash or
                ran past its timeout.
            ConfigError: ``role`` is none of the roles above.
        """
        return await self._steps.run(
            fn, args, kwargs, name=name, mode=mode, retry=retry, timeout=timeout, role=role
        )

    # -- time -------------------------------------------------------------------------

    async def sleep(self, seconds: float) -> None:
        """Sleep durably. Long sleeps release the worker; the run wakes on time
        on any worker, even after restarts."""
        await self._waits.sleep(seconds)

    async def sleep_until(self, when: datetime | float, *, reason: str = "sleep") -> None:
        """Wait until ``when`` (an aware datetime, or seconds since the epoch).

        Unlike :meth:`sleep`, this writes nothing to the journal: ``when`` must be as
        deterministic as the workflow, computed from journaled values (a step's output,
        :meth:`now`), so that a replay waits for the same instant, or not at all once it
        has passed. A short wait holds the worker; a long one releases it and the run
        wakes on time on any worker. ``reason`` names the wait in ``show`` and the API
        (``sleep``, ``rate_limit``, ...).
        """
        wake_at = when.timestamp() if isinstance(when, datetime) else float(when)
        await self._waits.until(wake_at, reason=reason)

    # -- signals and requests to humans -----------------------------------------------

    async def wait_for(
        self, signal: str, *, timeout: float | None = None, default: Any = _MISSING
    ) -> Any:
        """Wait durably for the next signal named ``signal`` and return its payload.

        Signals are stored when they arrive, before or after this wait, and each is
        consumed once, oldest first. While waiting, the run holds no worker.

        Raises:
            WaitTimeout: ``timeout`` seconds passed with no signal and no ``default``.
            ConfigError: ``signal`` is a name reserved for requests to humans
                (``approval:…``, ``question:…``, ``budget:…``, ``checkpoint:…``,
                ``resume``): no raw signal may satisfy it; use :meth:`approval` or
                :meth:`ask`.
        """
        return await self._waits.wait_for(signal, timeout=timeout, default=default)

    @overload
    async def request(
        self,
        request_id: str,
        *,
        kind: Literal["approval"] = ...,
        title: str | None = ...,
        preview: Any = ...,
        timeout: float | None = ...,
        default: Literal["approve", "reject"] = ...,
    ) -> Approval: ...

    @overload
    async def request(
        self,
        request_id: str,
        *,
        kind: Literal["question"],
        title: str | None = ...,
        preview: Any = ...,
        choices: Sequence[str] | None = ...,
        timeout: float | None = ...,
        default: str = ...,
    ) -> str: ...

    async def request(
        self,
        request_id: str,
        *,
        kind: RequestKind = "approval",
        title: str | None = None,
        preview: Any = None,
        choices: Sequence[str] | None = None,
        timeout: float | None = None,
        default: Any = _MISSING,
    ) -> Approval | str:
        """Ask a human and wait durably for the answer: the one primitive under
        :meth:`approval`, :meth:`gate` and :meth:`ask`.

        The run parks with the request listed (``mainspring requests``, ``GET
        /requests``, the dashboard) until someone answers it with :meth:`App.answer`,
        the API or the CLI, on any worker, after any restart; while it waits it holds
        no worker. The request is journaled: a replay returns the same answer.

        Args:
            request_id: the request's id within the run, the signal its answer is
                stored as: ``"approval:<name>"`` or ``"question:<name>"`` (also
                ``"budget:…"``, ``"checkpoint:…"``, ``"resume"``). These names are
                reserved: no raw signal can answer a request.
            kind: ``"approval"`` (approve, reject, or edit arguments) or
                ``"question"`` (a free answer, or one of ``choices``).
            title: what is asked, in a line (default: ``"approve <id>"``, or the id).
            preview: what the reviewer should see (JSON data).
            choices: the allowed answers of a question.
            timeout: seconds to wait; then ``default`` applies.
            default: on timeout, an approval returns an :class:`Approval` with this
                decision (``"approve"`` or ``"reject"``, by default ``"reject"``) and
                ``timed_out=True``; a question returns this answer, or raises
                :class:`WaitTimeout` if none is given.

        Returns:
            An :class:`Approval` for an approval, the answer (``str``) for a question.

        Raises:
            ConfigError: ``request_id`` is not a name reserved for requests.
            WaitTimeout: a question timed out with no ``default``.
        """
        return await self._waits.request(
            request_id,
            kind=kind,
            title=title,
            preview=preview,
            choices=choices,
            timeout=timeout,
            default=default,
        )

    async def approval(
        self,
        name: str,
        *,
        preview: Any = None,
        title: str | None = None,
        timeout: float | None = None,
        default: Literal["approve", "reject"] = "reject",
    ) -> Approval:
        """Ask a human to approve (or reject, or edit) before going on; a durable wait.

        The request is listed with ``preview`` as ``approval:<name>`` until a reviewer
        answers through the API, the CLI or the dashboard. After ``timeout`` seconds
        the ``default`` decision applies. Short for :meth:`request` with
        ``kind="approval"``.
        """
        return await self.request(
            f"approval:{name}",
            title=title or f"approve {name!r}",
            preview=preview,
            timeout=timeout,
            default=default,
        )

    async def gate(
        self, name: str, *, preview: Any = None, timeout: float | None = None
    ) -> Approval:
        """A stage gate: like :meth:`approval`, but a rejection fails the run with
        :class:`~mainspring.ApprovalRejected` carrying the reviewer's reason."""
        decision = await self.request(
            f"approval:{name}", title=f"stage gate {name!r}", preview=preview, timeout=timeout
        )
        if not decision.approved:
            why = f": {decision.reason}" if decision.reason else ""
            who = f" by {decision.by}" if decision.by else ""
            raise ApprovalRejected(f"stage gate {name!r} rejected{who}{why}", run_id=self.run_id)
        return decision

    async def ask(
        self,
        question: str,
        *,
        choices: Sequence[str] | None = None,
        name: str | None = None,
        timeout: float | None = None,
        default: Any = _MISSING,
    ) -> str:
        """Ask a human a question and wait durably for the answer (one of ``choices``
        when given). The request is ``question:<name>`` (by default its journal
        position). Short for :meth:`request` with ``kind="question"``.

        Raises:
            WaitTimeout: ``timeout`` seconds passed with no answer and no ``default``.
        """
        key = name if name is not None else f"{self.session}.{self._cursor.next_seq()}"
        return await self.request(
            f"question:{key}",
            kind="question",
            title=question,
            choices=choices,
            timeout=timeout,
            default=default,
        )

    # -- code that changes under running runs -----------------------------------------

    def patched(self, change_id: str) -> bool:
        """Whether this run takes the code after the change ``change_id``: ``True`` for
        a run that reaches this point under the changed code (a marker is journaled)
        and on every replay of it, ``False`` when replaying a journal written before the
        change, whose old steps the ``else`` branch must then ask for
        (docs/workflows.md, "Changing code under running runs")."""
        return _patches.patched(self._cursor, change_id)

    def deprecate_patch(self, change_id: str) -> None:
        """Mark that the code of ``patched(change_id)``'s old branch is gone: keeps the
        marker (so workers still on the patched code replay this run), and raises
        :class:`NondeterminismError` for a run from before the change."""
        _patches.deprecate_patch(self._cursor, change_id)

    def version(self, change_id: str, min_supported: int, max_supported: int) -> int:
        """The version of the change ``change_id`` this run is on: ``max_supported`` for
        a run that reaches this point now (journaled), the journaled one on replay, and
        0 for a journal written before the first version of the change.

        Raises:
            NondeterminismError: the run's version is outside ``min_supported`` to
                ``max_supported`` (its code was removed while it was in flight).
        """
        return _patches.version(self._cursor, change_id, min_supported, max_supported)

    # -- child runs -------------------------------------------------------------------

    async def start_child(
        self,
        workflow: Workflow[..., T] | str,
        /,
        *args: Any,
        key: str | None = None,
        on_parent_close: ParentClose = "cancel",
        **kwargs: Any,
    ) -> ChildHandle[T]:
        """Start ``workflow`` (a registered workflow or agent, or its name) as a child
        run and return a :class:`ChildHandle`; ``await handle`` gives its result.

        The child is a run of its own (journal, lease, status, retries), listed as a
        child of this run. Its start is journaled here and its idempotency key is
        derived from this run and position (or from ``key``, which must then name one
        child of this run only), so a crash or replay never starts it twice.

        When this run ends (succeeds, fails, is cancelled) while the child has not,
        the child is cancelled with its own children (``on_parent_close="cancel"``,
        the default); with ``on_parent_close="abandon"`` it runs on, on its own, and
        nothing this run does after starting it, a cancel included, cancels it.

        Raises:
            ConfigError: the workflow is not registered, the arguments do not fit, or
                ``on_parent_close`` is neither ``"cancel"`` nor ``"abandon"``.
        """
        return start_child(self._cursor, self._waits, workflow, args, kwargs, key, on_parent_close)

    async def child(
        self,
        workflow: Workflow[..., T] | str,
        /,
        *args: Any,
        key: str | None = None,
        on_parent_close: ParentClose = "cancel",
        **kwargs: Any,
    ) -> T:
        """Run ``workflow`` (or an agent: ``await ctx.child(researcher, "task")``) as a
        durable child run and return its result: :meth:`start_child` then wait. While
        the child runs, this run waits (status ``waiting``, wait reason
        ``child:<id>``), holding no worker. Several children run at once with
        ``asyncio.gather(ctx.child(a, 1), ctx.child(b, 2))``.

        Raises:
            ChildFailed: the child failed (``.child_id``, ``.error``).
            ChildCancelled: the child was cancelled.
        """
        handle: ChildHandle[T] = await self.start_child(
            workflow, *args, key=key, on_parent_close=on_parent_close, **kwargs
        )
        return await handle.result()

    # -- journaled values and sessions ------------------------------------------------

    def now(self) -> datetime:
        """The current time, journaled: a replay sees the same value."""
        return datetime.fromtimestamp(self._cursor.record("now", self._cursor.now), UTC)

    def uuid(self) -> uuid_mod.UUID:
        """A random UUID (version 4), journaled."""
        rng = self._engine.rng
        text = self._cursor.record(
            "uuid", lambda: str(uuid_mod.UUID(int=rng.getrandbits(128), version=4))
        )
        return uuid_mod.UUID(text)

    def token_writer(self) -> TokenWriter:
        """A live token stream for the step running now (its text, shown while it
        runs, never journaled: see docs/streaming.md). Call it from a step function."""
        engine = self._engine
        return TokenWriter(
            engine.store,
            engine.clock,
            current_step(),
            self._cursor.epoch,
            redaction=engine.live_redaction,
        )

    def random(self) -> float:
        """A random float in [0, 1), journaled."""
        return float(self._cursor.record("random", self._engine.rng.random))

    def continue_as_new(self, handoff: Any = None) -> NoReturn:
        """End this session and start the next from ``handoff``.

        The workflow function runs again from the top with ``ctx.session``
        incremented and ``ctx.handoff`` set to this value; replay never reads an
        older session's journal, so a run of any length stays cheap to recover.
        """
        life = self._cursor.life
        life.boundary()
        raise life.decide(_ContinueAsNew(dumps(handoff, what="hand-off")))
