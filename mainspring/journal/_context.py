"""``RunContext``: every durable thing a workflow does goes through it.

Each call takes the next sequence number of the session. On replay a journaled
entry at that number returns its recorded result without running anything; a
different kind or name there raises :class:`NondeterminismError`. Writes are
buffered and committed once per step: the completion of one step shares its
commit with the intent row of the next (DESIGN.md §3).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import logging
import uuid as uuid_mod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar, get_type_hints, overload

from .._describe import safe_str, safe_traceback
from .._errors import (
    Cancelled,
    ConfigError,
    LeaseLost,
    MainspringError,
    NondeterminismError,
    SerializationError,
    StepFailed,
    StepInterrupted,
    StepTimeout,
    StoreError,
    StoreUnavailable,
    WaitTimeout,
)
from .._serde import decode, dumps, loads
from .._signals import is_request_signal
from .._stepnames import same_step_name
from ..storage import RunRecord, RunTransition, RunWrite, StepKind, StepRecord, StepStatus
from ..storage._records import WAIT_SIGNAL_SEP, join_wait_signals
from ._engine import Engine, RunControl
from ._retry import RetryPolicy

if TYPE_CHECKING:
    from ..hitl import Approval

__all__ = ["RunContext", "SimulatedCrash", "StepInfo", "StepMode", "current_step"]

log = logging.getLogger("mainspring.worker")

T = TypeVar("T")
StepMode = Literal["at_least_once", "at_most_once"]
_MISSING: Any = object()
log = logging.getLogger("mainspring.journal")

_PLAIN = frozenset({str, int, bool, type(None)})


def _journaled_error(text: str | None, exc: BaseException) -> str:
    """``Type: message`` of an error as the journal holds it (secrets redacted)."""
    error = loads(text) if text else None
    if isinstance(error, dict):
        return f"{type(exc).__name__}: {error.get('message', '')}"[:300]
    return type(exc).__name__


def _journaled(result: Any, ret_type: Any, step_name: str, info: StepInfo) -> tuple[str, Any]:
    """A step's result as the journal will hold it, and as the workflow (and every
    replay) will see it. Checked before the step is recorded as completed: a result that
    cannot be stored or revived fails the step, saying that its effects did happen."""
    what = f"output of step {step_name!r}"
    try:
        output = dumps(result, what=what)
        if type(result) in _PLAIN and (ret_type is Any or ret_type is type(result)):
            return output, result  # JSON gives back exactly this value: skip the round trip
        return output, decode(output, ret_type, what=what)
    except SerializationError as exc:
        raise SerializationError(
            f"{exc.message}. The step ran to its end (any effect it had was made under "
            f"idempotency key {info.idempotency_key!r}), but its result cannot be journaled: "
            "return JSON data (str, numbers, lists, dicts) or a dataclass, pydantic model "
            "or TypedDict that matches the return annotation"
        ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepInfo:
    """The step being executed, as seen from inside its function.

    Attributes:
        idempotency_key: ``"{run_id}:{session}:{seq}"``, the same on every attempt
            and after every crash. Pass it to the outside world so that a repeated
            call is recognised as the same one.
    """

    run_id: str
    session: int
    seq: int
    name: str
    attempt: int

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}:{self.session}:{self.seq}"


_current: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar(
    "mainspring_step", default=None
)


def current_step() -> StepInfo:
    """The step whose function is running now (its idempotency key, attempt, ...).

    Raises:
        RuntimeError: called outside a step function.
    """
    info = _current.get()
    if info is None:
        raise RuntimeError(
            "mainspring.current_step() was called outside a step: call it from a "
            "function run by ctx.step(...)"
        )
    return info


class _Suspend(BaseException):
    """Control flow: the run leaves its worker until a time or a signal."""

    def __init__(self, transition: RunTransition) -> None:
        self.transition = transition


class _ContinueAsNew(BaseException):
    """Control flow: end this session and start the next from a hand-off."""

    def __init__(self, handoff: str) -> None:
        self.handoff = handoff


class _Release(BaseException):
    """Control flow: the worker is shutting down; give the run back."""


class _EngineFailure(BaseException):
    """Control flow: the engine failed under the workflow (the store stayed down, the
    lease was lost, replay met a different step).

    A ``BaseException`` carrying the public error, so that ``except Exception`` in
    workflow code cannot take it for a failed step and go on: the run waits for the
    store (it is abandoned to recovery), stops (lease lost) or fails with the error
    (nondeterminism), whatever the workflow does with it.
    """

    def __init__(self, error: MainspringError) -> None:
        super().__init__(error)
        self.error = error

    def __str__(self) -> str:
        return safe_str(self.error)


class _Closed(BaseException):
    """Control flow: the run's outcome is decided; a task still using the context
    (a sibling of ``gather``) must stop, and nothing more is journaled."""


class SimulatedCrash(BaseException):
    """Raise it in a test, from a step or a workflow, to stand for the process dying
    at that point: nothing after it is journaled, the run keeps its lease until it
    expires, and then a worker recovers it as after a real crash.

    Every other exception from user code, ``SystemExit`` included, is a failed step
    or a failed run; this one is the test's way of pulling the plug.
    """


# Mainspring's own control flow: passes through a step untouched, never a step failure.
_CONTROL = (
    _Suspend,
    _ContinueAsNew,
    _Release,
    _EngineFailure,
    _Closed,
    Cancelled,
    SimulatedCrash,
    GeneratorExit,
)

# Loop iterations with no activity in the context, while some wait is parked and no
# step runs, before the run is suspended. Enough for the callbacks that carry one
# task's end to the tasks awaiting it (``gather``, ``asyncio.wait``, nested a few
# deep) to run, so that a wait that just completed is seen before the run leaves.
_QUIET_ROUNDS = 16
# How long a finished run's leftover tasks may take to obey their cancellation.
_SETTLE_S = 10.0


def _fn_info(fn: Callable[..., Any]) -> tuple[bool, Any]:
    """``(is a coroutine function, return annotation)``, cached per code object.

    Keyed by code, not by function: a closure made afresh for every step (holding
    that step's arguments) must neither miss the cache nor be kept alive by it.
    """
    plain = getattr(fn, "__func__", fn)
    code = getattr(plain, "__code__", None)
    if code is None:
        return _inspect_fn(fn)
    try:  # closures of one def may carry different annotations: they are in the key
        key = (code, tuple(getattr(plain, "__annotations__", {}).items()))
        found = _fn_info_by_code.get(key)
    except TypeError:  # an unhashable annotation
        return _inspect_fn(fn)
    if found is None:
        found = _fn_info_by_code[key] = _inspect_fn(fn)
    return found


def _inspect_fn(fn: Callable[..., Any]) -> tuple[bool, Any]:
    is_coro = inspect.iscoroutinefunction(fn)
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
        return is_coro, Any
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolvable annotations: fall back to plain JSON
        return is_coro, Any
    return is_coro, hints.get("return", Any)


# Code objects live as long as their module; the functions made from them need not.
_fn_info_by_code: dict[Any, tuple[bool, Any]] = {}


def _error_json(exc: BaseException, **extra: Any) -> str:
    tb = safe_traceback(exc, limit=8)  # user exceptions may fail to render: never raise
    payload = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        # A mainspring error's bare message: the run and step have fields of their own.
        "message": safe_str(exc.message) if isinstance(exc, MainspringError) else safe_str(exc),
        **({"step": exc.step} if isinstance(exc, MainspringError) and exc.step else {}),
        "retryable": bool(getattr(exc, "retryable", True)),
        "traceback": tb[-4000:],
        **extra,
    }
    return dumps(payload, what="error")


class RunContext:
    """The handle a workflow uses for everything durable. Not created by users.

    Attributes:
        run_id: this run's id.
        session: the session number (0, then +1 at each ``continue_as_new``).
        handoff: the value passed to ``continue_as_new`` by the previous session,
            ``None`` in session 0.
    """

    def __init__(
        self,
        *,
        run: RunRecord,
        journal: list[StepRecord],
        engine: Engine,
        control: RunControl,
    ) -> None:
        self.run_id = run.id
        self.workflow = run.workflow
        self.session = run.session
        self.handoff: Any = loads(run.handoff)
        self._epoch = run.epoch
        self._engine = engine
        self._control = control
        self._journal = {rec.seq: rec for rec in journal}
        self._last_journaled = max(self._journal, default=-1)
        self._seq = -1
        self._pending: dict[int, StepRecord] = {}
        self._consume: list[tuple[int, str]] = []
        self._cancel = run.cancel_requested
        self._reset_recoveries = run.recoveries > 0
        self._running = 0  # step functions executing now (more than one under gather)
        # How this execution ends, once the engine has decided (a suspension, a lost
        # lease, a store outage, a cancel, the run's outcome): every later use of the
        # context raises it again, whatever the workflow did with the first one.
        self._stop: BaseException | None = None
        # The run is being finished (not suspended, released or continued) while step
        # attempts may still run: those are cancelled and journaled as such.
        self._ending = False
        try:
            self._main: asyncio.Task[Any] | None = asyncio.current_task()
        except RuntimeError:  # made outside an event loop
            self._main = None
        self._tasks: set[asyncio.Task[Any]] = set()  # other tasks that used the context
        self._no_steps = asyncio.Event()  # set while no step function runs
        self._no_steps.set()
        self._busy = 0  # commits in flight from workflow code
        # Waits that cannot complete in this execution: seq -> (signal, wake_at, reason).
        # The run suspends once nothing else can happen, waking on any of them.
        self._parked: dict[int, tuple[str | None, float | None, str]] = {}
        self._activity = 0  # bumped by every use of the context
        self._sleeps = 0
        self._quiet_seen = -1
        self._quiet_rounds = 0
        self._quiet_polling = False
        self._cancelled_main = False  # the context cancelled the main task to suspend

    # -- public API -------------------------------------------------------------------

    @property
    def is_replaying(self) -> bool:
        """True while the workflow re-executes journaled steps."""
        return self._seq < self._last_journaled

    @overload
    async def step(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        name: str | None = ...,
        mode: StepMode = ...,
        retry: RetryPolicy | None = ...,
        timeout: float | None = ...,
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

        Any exception the function raises is a failed attempt, ``SystemExit``,
        ``KeyboardInterrupt`` and a ``CancelledError`` nobody asked for included.

        Raises:
            StepFailed: the step failed for good (same on replay).
            StepInterrupted: an ``at_most_once`` step was interrupted by a crash or
                ran past its timeout.
        """
        if mode not in ("at_least_once", "at_most_once"):
            raise ValueError(f"mode must be 'at_least_once' or 'at_most_once', got {mode!r}")
        self._boundary()
        step_name = name or getattr(fn, "__qualname__", None) or repr(fn)
        seq = self._take("step", step_name)
        rec = self._journal.get(seq)
        is_coro, ret_type = _fn_info(fn)
        if retry is None:
            retry = self._engine.default_retry if mode == "at_least_once" else RetryPolicy.never()
        failures = 0
        attempt = 1
        last_error: str | None = None
        if rec is not None:
            if rec.status == "completed":
                return decode(rec.output, ret_type, what=f"journaled output of {step_name!r}")
            if rec.status == "failed":
                raise self._failed_from_journal(rec)
            previous = loads(rec.error) or {}
            failures = int(previous.get("failures", 0))
            last_error = rec.error
            if rec.status == "started":
                # The attempt began and never ended: its worker died or lost the run.
                last_error = dumps(
                    {
                        "type": "WorkerLost",
                        "message": f"attempt {rec.attempt} was interrupted: its worker "
                        f"(epoch {rec.epoch}) stopped before the step ended",
                        "retryable": True,
                        "failures": failures,
                    }
                )
            if rec.status == "started" and mode == "at_most_once":
                err = StepInterrupted(
                    f"at_most_once step {step_name!r} started (attempt {rec.attempt}) and "
                    "its end was never journaled; it may or may not have taken effect",
                    run_id=self.run_id,
                    step=self._where(seq, step_name),
                )
                self._put(
                    rec,
                    status="failed",
                    error=_error_json(err, failures=failures),
                    finished_at=self._now(),
                )
                await self._commit()
                raise err
            if rec.status == "retrying" and rec.wake_at is not None:
                await self._wait_until(rec.wake_at, reason=f"retry:{step_name}")
            attempt = rec.attempt + 1
        while True:
            started = self._put(
                StepRecord(
                    run_id=self.run_id,
                    session=self.session,
                    seq=seq,
                    kind="step",
                    name=step_name,
                    status="started",
                    attempt=attempt,
                    epoch=self._epoch,
                    error=last_error,  # why the previous attempt failed, kept for traces
                    started_at=self._now(),
                )
            )
            await self._commit()  # the intent row (and the previous completion) is durable
            info = StepInfo(
                run_id=self.run_id, session=self.session, seq=seq, name=step_name, attempt=attempt
            )
            error: BaseException | None = None
            self._running += 1
            self._no_steps.clear()
            try:
                if self._engine.interceptors:
                    result = await self._intercepted(fn, args, kwargs, info, timeout, is_coro)
                else:
                    result = await self._invoke(fn, args, kwargs, info, timeout, is_coro)
                output, value = _journaled(result, ret_type, step_name, info)
            except BaseException as exc:
                # User code can raise anything (SystemExit from argparse, a stray
                # CancelledError): all of it is a failed attempt, but for mainspring's
                # own control flow and a cancellation someone really asked for.
                if self._passes_through(exc):
                    if self._ending and isinstance(exc, asyncio.CancelledError):
                        # The run ends without this attempt (a gather sibling failed and
                        # the workflow returned): no row of a finished run stays started.
                        self._put(
                            started,
                            status="failed",
                            error=dumps(
                                {
                                    "type": "Cancelled",
                                    "message": f"the run ended while attempt {attempt} of "
                                    f"step {step_name!r} ran: it was cancelled, and may or "
                                    "may not have taken effect",
                                    "retryable": False,
                                    "failures": failures + 1,
                                }
                            ),
                            finished_at=self._now(),
                        )
                    raise
                error = exc
            finally:
                self._running -= 1
                if not self._running:
                    self._no_steps.set()
                self._touch()
            if error is not None:
                failures += 1
                if mode == "at_most_once" and isinstance(error, StepTimeout):
                    # The attempt may still be running (a thread cannot be killed): its
                    # outcome is unknown, so it is never attempted again.
                    err = StepInterrupted(
                        f"at_most_once step {step_name!r} attempt {attempt} ran past its "
                        f"timeout of {timeout}s and may still be running; it may or may "
                        "not take effect, so it is not attempted again",
                        run_id=self.run_id,
                        step=self._where(seq, step_name),
                    )
                    self._put(
                        started,
                        status="failed",
                        error=_error_json(err, failures=failures),
                        finished_at=self._now(),
                    )
                    await self._commit()
                    raise err from error
                delay = retry.next_delay(failures, error, self._engine.rng)
                if delay is None:
                    self._put(
                        started,
                        status="failed",
                        error=_error_json(error, failures=failures),
                        finished_at=self._now(),
                    )
                    if mode == "at_most_once":
                        await self._commit()
                    raise StepFailed(
                        f"step {step_name!r} failed after {attempt} attempt(s): "
                        f"{type(error).__name__}: {safe_str(error)}",
                        error_type=f"{type(error).__module__}.{type(error).__qualname__}",
                        attempts=attempt,
                        run_id=self.run_id,
                        step=self._where(seq, step_name),
                    ) from error
                wake_at = self._now() + delay
                retrying = self._put(
                    started,
                    status="retrying",
                    error=_error_json(error, failures=failures),
                    wake_at=wake_at,
                )
                last_error = retrying.error  # as journaled (redacted)
                log.info(
                    "event=retry run=%s step=%s attempt=%d error=%r retry_in_s=%.3f",
                    self.run_id,
                    self._where(seq, step_name),
                    attempt,
                    _journaled_error(retrying.error, error),  # redacted, as journaled
                    delay,
                )
                await self._wait_until(wake_at, reason=f"retry:{step_name}")
                attempt += 1
                continue
            done = self._put(started, status="completed", output=output, finished_at=self._now())
            if mode == "at_most_once" or self._running:
                # at_most_once: its end must never be in doubt. Other steps still running
                # in parallel: don't let a crash in one of them cost this one's result.
                await self._commit()
            if done.output is not output:
                # Secrets were redacted: the live run sees what a replay will see.
                return decode(done.output, ret_type, what=f"output of step {step_name!r}")
            return value

    async def sleep(self, seconds: float) -> None:
        """Sleep durably. Long sleeps release the worker; the run wakes on time
        on any worker, even after restarts."""
        self._boundary()
        seq = self._take("sleep", "sleep")
        rec = self._journal.get(seq)
        if rec is not None:
            if rec.status == "completed":
                return
            wake_at = rec.wake_at if rec.wake_at is not None else self._now()
        else:
            wake_at = self._now() + max(0.0, float(seconds))
            rec = self._put(self._new(seq, "sleep", "sleep", status="started", wake_at=wake_at))
        await self._wait_until(wake_at, reason="sleep")
        self._put(rec, status="completed", finished_at=self._now())

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
        if is_request_signal(signal):
            raise ConfigError(
                f"ctx.wait_for({signal!r}): that name is reserved for requests to humans "
                "and no raw signal can answer it; use ctx.approval(...) or ctx.ask(...), "
                "or wait for another name",
                run_id=self.run_id,
            )
        return await self._wait(signal, timeout=timeout, default=default)

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
        the ``default`` decision applies.
        """
        from ..hitl._wait import approval

        return await approval(
            self,
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
        from ..hitl._wait import gate

        return await gate(self, name, preview=preview, timeout=timeout)

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
        position).

        Raises:
            WaitTimeout: ``timeout`` seconds passed with no answer and no ``default``.
        """
        from ..hitl._wait import ask

        key = name if name is not None else f"{self.session}.{self._seq + 1}"
        return await ask(
            self, f"question:{key}", question, choices=choices, timeout=timeout, default=default
        )

    async def _wait(
        self,
        signal: str,
        *,
        timeout: float | None,
        default: Any = _MISSING,
        request: str | None = None,
    ) -> Any:
        """``wait_for``; ``request`` (JSON) marks the wait as a request to a human and
        stays in the journal row, listed while pending and kept once answered."""
        if WAIT_SIGNAL_SEP in signal:
            raise ValueError(f"a signal name cannot contain {WAIT_SIGNAL_SEP!r}: {signal!r}")
        self._boundary()
        seq = self._take("signal", signal)
        rec = self._journal.get(seq)
        if rec is not None and rec.status == "completed":
            if (loads(rec.output) or {}).get("cancelled") is True:
                await self._forever()  # the workflow cancelled this wait: it will again
            return self._wait_result(rec, signal, default)
        if rec is None:
            deadline = None if timeout is None else self._now() + max(0.0, timeout)
            rec = self._put(
                self._new(
                    seq,
                    "signal",
                    signal,
                    status="started",
                    wake_at=deadline,
                    output=None if request is None else '{"request":' + request + "}",
                )
            )
        meta = "" if rec.output is None else rec.output[1:-1] + ","  # '"request":{…},'
        deadline = rec.wake_at
        # A signal another wait of this run took but has not committed is not ours.
        taken = [sid for sid, _ in self._consume]
        try:
            found = self._engine.store.next_signal(self.run_id, signal, skip=taken)
        except (StoreUnavailable, StoreError) as exc:
            raise self._fail(exc) from exc
        if found is not None:
            done = self._put(
                rec,
                status="completed",
                output="{" + meta + '"signal":' + found.payload + "}",
                finished_at=self._now(),
            )
            self._consume.append((found.id, f"{self.session}:{seq}"))
            await self._commit()
            return self._wait_result(done, signal, default)
        if deadline is not None and self._now() >= deadline:
            done = self._put(
                rec,
                status="completed",
                output="{" + meta + '"timeout":true}',
                finished_at=self._now(),
            )
            return self._wait_result(done, signal, default)
        try:
            await self._park(seq, signal, deadline, f"signal:{signal}")
        except asyncio.CancelledError:
            if self._stop is None:  # the workflow cancelled it (the loser of a race)
                self._put(
                    rec,
                    status="completed",
                    output="{" + meta + '"cancelled":true}',
                    finished_at=self._now(),
                )
            raise

    def now(self) -> datetime:
        """The current time, journaled: a replay sees the same value."""
        return datetime.fromtimestamp(self._record("now", self._now), UTC)

    def uuid(self) -> uuid_mod.UUID:
        """A random UUID (version 4), journaled."""
        text = self._record(
            "uuid", lambda: str(uuid_mod.UUID(int=self._engine.rng.getrandbits(128), version=4))
        )
        return uuid_mod.UUID(text)

    def random(self) -> float:
        """A random float in [0, 1), journaled."""
        return float(self._record("random", self._engine.rng.random))

    def continue_as_new(self, handoff: Any = None) -> NoReturn:
        """End this session and start the next from ``handoff``.

        The workflow function runs again from the top with ``ctx.session``
        incremented and ``ctx.handoff`` set to this value; replay never reads an
        older session's journal, so a run of any length stays cheap to recover.
        """
        self._boundary()
        raise self._set_stop(_ContinueAsNew(dumps(handoff, what="hand-off")))

    # -- machinery ----------------------------------------------------------------------

    def _now(self) -> float:
        return self._engine.clock.now()

    def _where(self, seq: int, name: str) -> str:
        return f"{self.session}:{seq} {name!r}"

    def _boundary(self) -> None:
        if self._stop is not None:
            raise self._stop
        task = asyncio.current_task()
        if task is not self._main and task is not None:
            if len(self._tasks) > 256:  # a long run of many gathers: forget the done ones
                self._tasks = {t for t in self._tasks if not t.done()}
            self._tasks.add(task)
        self._activity += 1
        if self._cancel:
            raise self._set_stop(Cancelled(self.run_id))
        if self._control.draining:
            raise self._set_stop(_Release())

    def _set_stop(self, stop: BaseException) -> BaseException:
        """Decide how this execution ends (the first decision stands) and return it."""
        if self._stop is None:
            self._stop = stop
        return self._stop

    def _fail(self, error: MainspringError) -> _EngineFailure:
        """An engine failure, as workflow code must see it (see :class:`_EngineFailure`)."""
        failure = _EngineFailure(error)
        self._set_stop(failure)
        return failure

    def _passes_through(self, exc: BaseException) -> bool:
        """Whether an exception out of a step function is not the attempt's failure:
        mainspring's control flow, or a cancellation of this task that was asked for
        (by the worker, by the engine settling the run, by the workflow's own
        ``asyncio.wait_for`` or ``task.cancel()``). A ``CancelledError`` that the
        function raised by itself is an ordinary failure."""
        if isinstance(exc, _CONTROL):
            return True
        if isinstance(exc, asyncio.CancelledError):
            task = asyncio.current_task()
            return self._stop is not None or (task is not None and task.cancelling() > 0)
        return False

    def _take(self, kind: StepKind, name: str) -> int:
        self._seq += 1
        seq = self._seq
        rec = self._journal.get(seq)
        if rec is not None and (rec.kind != kind or not same_step_name(rec.name, name)):
            raise self._fail(
                NondeterminismError(
                    f"replay expected {rec.kind} {rec.name!r} at position {seq} of session "
                    f"{self.session} but the workflow asked for {kind} {name!r}: the "
                    "workflow's code changed while the run was in flight",
                    run_id=self.run_id,
                    step=self._where(seq, name),
                )
            )
        return seq

    def _new(self, seq: int, kind: StepKind, name: str, **fields: Any) -> StepRecord:
        return StepRecord(
            run_id=self.run_id,
            session=self.session,
            seq=seq,
            kind=kind,
            name=name,
            attempt=1,
            epoch=self._epoch,
            started_at=self._now(),
            **fields,
        )

    def _put(
        self,
        rec: StepRecord,
        *,
        status: StepStatus | None = None,
        output: str | None = None,
        error: str | None = None,
        finished_at: float | None = None,
        wake_at: float | None = None,
    ) -> StepRecord:
        """Buffer a journal row: a fresh copy of ``rec`` with these fields changed
        (``None`` keeps the old value), so buffered rows never alias. New output and
        error text is redacted here, before it can reach the store."""
        redact = self._engine.redact
        if redact is not None:
            if output is not None:
                output = redact(output)
            if error is not None:
                error = redact(error)
        new = StepRecord(
            run_id=rec.run_id,
            session=rec.session,
            seq=rec.seq,
            kind=rec.kind,
            name=rec.name,
            status=status or rec.status,
            attempt=rec.attempt,
            epoch=self._epoch,
            output=rec.output if output is None else output,
            error=rec.error if error is None else error,
            started_at=rec.started_at,
            finished_at=rec.finished_at if finished_at is None else finished_at,
            wake_at=rec.wake_at if wake_at is None else wake_at,
        )
        self._pending[new.seq] = new
        return new

    def _record(self, kind: StepKind, make: Callable[[], Any]) -> Any:
        self._boundary()
        seq = self._take(kind, kind)
        rec = self._journal.get(seq)
        if rec is not None:
            return loads(rec.output)
        value = make()
        now = self._now()
        self._put(
            self._new(seq, kind, kind, status="completed", output=dumps(value), finished_at=now)
        )
        return value

    def _wait_result(self, rec: StepRecord, signal: str, default: Any) -> Any:
        out = loads(rec.output) or {}
        if "signal" in out:
            return out["signal"]
        if default is not _MISSING:
            return default
        raise WaitTimeout(
            f"no signal {signal!r} arrived before the wait's timeout",
            run_id=self.run_id,
            step=self._where(rec.seq, signal),
        )

    def _failed_from_journal(self, rec: StepRecord) -> MainspringError:
        err = loads(rec.error) or {}
        error_type = str(err.get("type", "Exception"))
        if error_type.endswith("StepInterrupted"):
            return StepInterrupted(
                str(err.get("message", "")), run_id=self.run_id, step=self._where(rec.seq, rec.name)
            )
        return StepFailed(
            f"step {rec.name!r} failed after {rec.attempt} attempt(s): "
            f"{error_type.rsplit('.', 1)[-1]}: {err.get('message', '')}",
            error_type=error_type,
            attempts=rec.attempt,
            run_id=self.run_id,
            step=self._where(rec.seq, rec.name),
        )

    async def _intercepted(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        info: StepInfo,
        timeout: float | None,
        is_coro: bool,
    ) -> Any:
        from ._intercept import StepCall, intercept

        call = StepCall(info=info, fn=fn, args=args, kwargs=kwargs)
        return await intercept(
            self._engine.interceptors,
            call,
            lambda: self._invoke(fn, args, kwargs, info, timeout, is_coro),
        )

    async def _invoke(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        info: StepInfo,
        timeout: float | None,
        is_coro: bool,
    ) -> Any:
        token = _current.set(info)
        try:
            # asyncio.timeout, not wait_for: user code runs in this task, never in a task
            # of its own, whose SystemExit or KeyboardInterrupt would stop the event loop.
            if is_coro:
                if timeout is None:
                    return await fn(*args, **kwargs)
                async with asyncio.timeout(timeout):
                    return await fn(*args, **kwargs)
            loop = asyncio.get_running_loop()
            call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
            fut = loop.run_in_executor(self._engine.threads, call)
            result = await asyncio.wait_for(fut, timeout)
            if inspect.isawaitable(result):
                async with asyncio.timeout(timeout):
                    result = await result
            return result
        except TimeoutError:
            raise StepTimeout(
                f"step {info.name!r} attempt {info.attempt} ran past its timeout of {timeout}s",
                run_id=self.run_id,
                step=self._where(info.seq, info.name),
            ) from None
        finally:
            _current.reset(token)

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
        await self._wait_until(wake_at, reason=reason)

    async def _wait_until(self, wake_at: float, *, reason: str) -> None:
        delay = wake_at - self._now()
        if delay <= 0:
            return
        if delay <= self._engine.inline_wait_s:
            await self._commit()
            self._busy += 1  # a short sleep is activity: the run does not suspend under it
            try:
                await self._engine.clock.sleep(delay)
            finally:
                self._busy -= 1
                self._touch()
            self._boundary()
            return
        self._sleeps += 1  # parked sleeps take negative keys: seqs are for waits
        await self._park(-self._sleeps, None, wake_at, reason)

    # -- ending an execution -------------------------------------------------------------

    async def _commit(self) -> None:
        """Flush on behalf of workflow code. A store that stays down or a lost lease
        becomes an :class:`_EngineFailure`, which ``except Exception`` cannot catch."""
        if self._stop is not None:
            raise self._stop
        self._busy += 1
        try:
            await self._flush()
        except (StoreUnavailable, StoreError, LeaseLost) as exc:
            raise self._fail(exc) from exc
        finally:
            self._busy -= 1
            self._touch()

    async def _forever(self) -> NoReturn:
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable: the future is never resolved")

    async def _park(
        self, key: int, signal: str | None, wake_at: float | None, reason: str
    ) -> NoReturn:
        """Wait here until the run suspends: it wakes on any parked wait's signal and at
        the earliest parked deadline, and replays; each wait then checks again.

        A wait in the workflow's own task with no other task using the context
        suspends at once (the common case). Otherwise the run suspends when the
        context has been quiet (no step running, no commit, no call) for
        :data:`_QUIET_ROUNDS` loop iterations, so that all of ``gather(wait_for("a"),
        wait_for("b"))`` is parked, and an ``asyncio.wait`` whose other wait just
        completed gets to see it first.
        """
        self._parked[key] = (signal, wake_at, reason)
        try:
            if (
                asyncio.current_task() is self._main
                and not self._running
                and not self._busy
                and all(t.done() for t in self._tasks)
            ):
                raise self._set_stop(_Suspend(self._suspension()))
            self._touch()
            await self._forever()
        finally:
            del self._parked[key]

    def _touch(self) -> None:
        """Note activity; start watching for quiet if some wait is parked."""
        self._activity += 1
        if self._parked and not self._quiet_polling and self._stop is None:
            self._quiet_polling = True
            self._quiet_rounds = 0
            asyncio.get_running_loop().call_soon(self._check_quiet)

    def _check_quiet(self) -> None:
        if self._stop is not None or not self._parked or self._running or self._busy:
            self._quiet_polling = False  # a step or commit ends with _touch(): watch again
            return
        if self._activity != self._quiet_seen:
            self._quiet_seen = self._activity
            self._quiet_rounds = 0
        else:
            self._quiet_rounds += 1
            if self._quiet_rounds >= _QUIET_ROUNDS:
                self._quiet_polling = False
                self._set_stop(_Suspend(self._suspension()))
                if self._main is not None and not self._main.done():
                    self._cancelled_main = True
                    self._main.cancel()
                for task in self._tasks:
                    task.cancel()
                return
        asyncio.get_running_loop().call_soon(self._check_quiet)

    def _suspension(self) -> RunTransition:
        """One suspension for every parked wait: any of their signals wakes the run, and
        so does the earliest of their deadlines."""
        waits = [self._parked[key] for key in sorted(self._parked)]
        signals = list(dict.fromkeys(s for s, _, _ in waits if s is not None))
        deadlines = [w for _, w, _ in waits if w is not None]
        return RunTransition(
            kind="suspend",
            status="waiting" if signals else "sleeping",
            wake_at=min(deadlines) if deadlines else None,
            wait_reason=" | ".join(dict.fromkeys(r for _, _, r in waits)),
            wait_signal=join_wait_signals(signals) if signals else None,
        )

    async def _settle(self) -> None:
        """Before the run's outcome is committed: no task may act for it any more.

        On a release or a new session, step functions already running finish first
        (their ends are journaled with the transition); then every other task that
        used the context is cancelled and awaited, so none can write into the
        finished (or suspended) run.
        """
        patient = isinstance(self._stop, _Release | _ContinueAsNew)
        self._ending = not patient and not isinstance(self._stop, _Suspend)
        self._set_stop(_Closed())
        me = asyncio.current_task()
        try:
            if patient and self._running:
                await self._no_steps.wait()
        finally:  # even if the worker stops waiting (shutdown grace over): cancel them
            others = [t for t in self._tasks if t is not me and not t.done()]
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

    async def _flush(self, transition: RunTransition | None = None) -> None:
        """Commit buffered rows (and a status change) in one fenced transaction.

        Retried on store errors: the writes are idempotent upserts, so a commit
        that succeeded but reported failure (an ambiguous commit) is harmless to
        repeat, and a completed step is never re-run because of it.
        """
        if not self._pending and not self._consume and transition is None:
            return
        redact = self._engine.redact
        if transition is not None and redact is not None:
            transition = dataclasses.replace(
                transition,
                output=None if transition.output is None else redact(transition.output),
                error=None if transition.error is None else redact(transition.error),
                handoff=None if transition.handoff is None else redact(transition.handoff),
            )
        engine = self._engine
        delay = 0.05
        for attempt in range(1, engine.commit_attempts + 1):
            # Built anew for each attempt: a retry sends the rows buffered now, never
            # the snapshot of a failed attempt, which a parallel step's flush may
            # have overtaken meanwhile.
            sent = dict(self._pending)
            consumed = list(self._consume)
            write = RunWrite(
                run_id=self.run_id,
                epoch=self._epoch,
                steps=list(sent.values()),
                consume=consumed,
                transition=transition,
                # Only real progress (a step ended, or the run moved on) clears the count
                # of recoveries: an intent row alone is what a poison step writes forever.
                reset_recoveries=self._reset_recoveries
                and (
                    transition is not None
                    or any(r.status in ("completed", "failed") for r in sent.values())
                ),
            )
            try:
                result = await engine.committer.commit(write)
                if result.busy:  # the run's row is locked elsewhere: back off and retry
                    raise StoreUnavailable(
                        f"the row of run {self.run_id!r} is locked by another transaction",
                        run_id=self.run_id,
                    )
                break
            except (StoreUnavailable, StoreError):
                if attempt == engine.commit_attempts:
                    raise
                await asyncio.sleep(delay)  # real time: the database needs it, not the run
                delay = min(delay * 2, 2.0)
        if not result.ok:
            raise LeaseLost(
                result.conflict
                or f"epoch {self._epoch} is no longer current, or the run is no longer running:"
                " another worker owns it, or it was finished, cancelled or retried",
                run_id=self.run_id,
            )
        # Steps running in parallel (asyncio.gather) may have buffered rows while this
        # commit was in flight: forget only what was sent and has not changed since.
        for seq, rec in sent.items():
            if self._pending.get(seq) is rec:
                del self._pending[seq]
        # Another flush may have committed some of these already: drop what was sent.
        self._consume = [c for c in self._consume if c not in consumed]
        if write.reset_recoveries:
            self._reset_recoveries = False
            self._control.progressed = True
        if result.cancel_requested:
            self._cancel = True
