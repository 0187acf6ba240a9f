"""Step execution: attempts, retries, timeouts, threads for sync functions,
interceptors, and the commit of a step's end.

A step's first use of its sequence number writes an intent row (``started``) that
shares its commit with the end of the previous step (DESIGN.md §3). On replay a
completed or failed record answers without running anything; a ``started`` one was
interrupted by a crash, and a ``retrying`` one waits out its back-off first.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, get_type_hints

from .._describe import safe_str
from .._errors import (
    ConfigError,
    MainspringError,
    SerializationError,
    StepFailed,
    StepInterrupted,
    StepTimeout,
)
from .._serde import decode, dumps, loads
from ..storage import JOURNAL_ROLES, JournalRole, StepRecord
from ._control import CONTROL, error_json
from ._cursor import Cursor
from ._intercept import StepCall, intercept
from ._retry import RetryPolicy
from ._stepinfo import StepInfo, current
from ._threads import SHORT_WAIT_S, ThreadCall
from ._waits import Waits

# The roles a ctx.step may declare: "child" is the start of a child run, which only
# ctx.child writes (it runs no function).
STEP_ROLES = JOURNAL_ROLES - {"child"}

__all__ = ["StepMode", "Steps"]

log = logging.getLogger("mainspring.journal")

StepMode = Literal["at_least_once", "at_most_once"]

_PLAIN = frozenset({str, int, bool, type(None)})


@dataclass(slots=True)
class _Step:
    """One ``ctx.step`` call, across its attempts."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    seq: int
    name: str
    mode: StepMode
    retry: RetryPolicy
    timeout: float | None
    is_coro: bool
    ret_type: Any
    role: JournalRole = "step"
    attempt: int = 1
    failures: int = 0
    last_error: str | None = None  # why the previous attempt failed, kept for traces
    thread: ThreadCall | None = None  # the attempt's call of a sync function, if any


class Steps:
    """Runs the steps of one execution, over its journal cursor and its waits (for
    the back-off between attempts)."""

    def __init__(self, cur: Cursor, waits: Waits) -> None:
        self.cur = cur
        self.life = cur.life
        self.waits = waits
        # The seq of the last model call that returned (live or replayed): the turn the
        # steps after it belong to, for traces (StepInfo.turn).
        self.turn: int | None = None

    async def run(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        name: str | None,
        mode: StepMode,
        retry: RetryPolicy | None,
        timeout: float | None,
        role: JournalRole = "step",
    ) -> Any:
        if mode not in ("at_least_once", "at_most_once"):
            raise ValueError(f"mode must be 'at_least_once' or 'at_most_once', got {mode!r}")
        if role not in STEP_ROLES:
            raise ConfigError(
                f"ctx.step(role={role!r}): unknown role; expected one of "
                f"{', '.join(repr(r) for r in sorted(STEP_ROLES))} (an argument of the "
                "function named role is passed with functools.partial(fn, role=...))"
            )
        cur = self.cur
        self.life.boundary()
        step_name = name or getattr(fn, "__qualname__", None) or repr(fn)
        seq = cur.take("step", step_name)
        rec = cur.journal.get(seq)
        is_coro, ret_type = _fn_info(fn)
        if rec is not None and rec.status == "completed":
            if role == "model":
                self.turn = seq
            return decode(rec.output, ret_type, what=f"journaled output of {step_name!r}")
        if retry is None:
            retry = cur.engine.default_retry if mode == "at_least_once" else RetryPolicy.never()
        step = _Step(
            fn, args, kwargs, seq, step_name, mode, retry, timeout, is_coro, ret_type, role
        )
        if rec is not None:
            await self._resume(step, rec)
        while True:
            started = await self._begin(step)
            error, output, value = await self._attempt(step, started)
            if error is None:
                if role == "model":
                    self.turn = seq
                return await self._complete(step, started, output, value)
            await self._attempt_failed(step, started, error)
            step.attempt += 1

    # -- before an attempt --------------------------------------------------------------

    async def _resume(self, step: _Step, rec: StepRecord) -> None:
        """Go on from a journaled record that did not complete."""
        if rec.status == "failed":
            raise self._failed_from_journal(rec)
        previous = loads(rec.error) or {}
        step.failures = int(previous.get("failures", 0))
        step.last_error = rec.error
        if rec.status == "started":
            await self._interrupted(step, rec)
        if rec.status == "retrying" and rec.wake_at is not None:
            await self.waits.until(rec.wake_at, reason=f"retry:{step.name}", keeps_slot=True)
        step.attempt = rec.attempt + 1

    async def _interrupted(self, step: _Step, rec: StepRecord) -> None:
        """The attempt began and never ended: its worker died or lost the run. Run it
        again, unless the step is ``at_most_once``."""
        step.last_error = dumps(
            {
                "type": "WorkerLost",
                "message": f"attempt {rec.attempt} was interrupted: its worker "
                f"(epoch {rec.epoch}) stopped before the step ended",
                "retryable": True,
                "failures": step.failures,
            }
        )
        if step.mode != "at_most_once":
            return
        err = self._in_doubt(
            step,
            rec,
            f"at_most_once step {step.name!r} started (attempt {rec.attempt}) and "
            "its end was never journaled; it may or may not have taken effect",
            step.failures,
        )
        await self.cur.commit()
        raise err

    def _in_doubt(
        self, step: _Step, rec: StepRecord, message: str, failures: int
    ) -> StepInterrupted:
        """Journal ``rec``, an attempt whose effect nobody can know any more, failed
        now with a :class:`StepInterrupted` saying ``message``, and return the error
        for the caller to raise (or not, when the run is ending anyway)."""
        err = StepInterrupted(
            message, run_id=self.cur.run_id, step=self.cur.where(step.seq, step.name)
        )
        self._failed(rec, err, failures)
        return err

    def _failed(self, rec: StepRecord, error: BaseException, failures: int) -> None:
        """Journal ``rec``'s attempt failed now with ``error`` (``failures``: the
        step's failed attempts, this one counted)."""
        error_row = error_json(error, failures=failures)
        self.cur.put(rec, status="failed", error=error_row, finished_at=self.cur.now())

    async def _begin(self, step: _Step) -> StepRecord:
        """The intent row of an attempt, durable (with the previous step's end)."""
        cur = self.cur
        started = cur.add(
            StepRecord(
                run_id=cur.run_id,
                session=cur.session,
                seq=step.seq,
                kind="step",
                name=step.name,
                status="started",
                attempt=step.attempt,
                epoch=cur.epoch,
                error=step.last_error,
                started_at=cur.now(),
                role=step.role,
            )
        )
        await cur.commit()
        return started

    # -- an attempt ---------------------------------------------------------------------

    async def _attempt(
        self, step: _Step, started: StepRecord
    ) -> tuple[BaseException | None, str, Any]:
        """Call the function once: ``(None, output, value)``, or ``(error, "", None)``.

        User code can raise anything (SystemExit from argparse, a stray CancelledError):
        all of it is a failed attempt, but for mainspring's own control flow and a
        cancellation someone really asked for, which pass through.
        """
        cur = self.cur
        info = StepInfo(
            run_id=cur.run_id,
            session=cur.session,
            seq=step.seq,
            name=step.name,
            attempt=step.attempt,
            role=step.role,
            turn=self.turn,
        )
        life = self.life
        life.step_began()
        step.thread = None
        try:
            if cur.stale():  # frozen since its intent? still ours?
                await cur.prove(started)
            interceptors = cur.engine.interceptors
            if interceptors:
                call = StepCall(info=info, fn=step.fn, args=step.args, kwargs=step.kwargs)
                proceed = functools.partial(self._invoke, step, info)
                if len(interceptors) == 1:  # the usual one (telemetry): a frame less
                    result = await interceptors[0].execute_step(call, proceed)
                else:
                    result = await intercept(interceptors, call, proceed)
            else:
                result = await self._invoke(step, info)
            output, value = _journaled(result, step.ret_type, step.name, info)
            return None, output, value
        except BaseException as exc:
            if self._passes_through(exc):
                if isinstance(exc, asyncio.CancelledError):
                    self._cancelled(step, started, info)
                raise
            return exc, "", None
        finally:
            life.step_ended()

    async def _invoke(self, step: _Step, info: StepInfo) -> Any:
        fn, args, kwargs, timeout = step.fn, step.args, step.kwargs, step.timeout
        token = current.set(info)
        try:
            # asyncio.timeout, not wait_for: user code runs in this task, never in a task
            # of its own, whose SystemExit or KeyboardInterrupt would stop the event loop.
            if step.is_coro:
                if timeout is None:
                    return await fn(*args, **kwargs)
                async with asyncio.timeout(timeout):
                    return await fn(*args, **kwargs)
            engine = self.cur.engine
            call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
            short_wait = SHORT_WAIT_S if engine.committer.solo else 0.0
            step.thread = ThreadCall(engine.threads, call, timeout)
            result = await step.thread.result(short_wait)
            if inspect.isawaitable(result):
                async with asyncio.timeout(timeout):
                    result = await result
            return result
        except TimeoutError:
            raise StepTimeout(
                f"step {info.name!r} attempt {info.attempt} ran past its timeout of {timeout}s",
                run_id=self.cur.run_id,
                step=self.cur.where(info.seq, info.name),
            ) from None
        finally:
            current.reset(token)

    def _passes_through(self, exc: BaseException) -> bool:
        """Whether an exception out of a step function is not the attempt's failure:
        mainspring's control flow, or a cancellation of this task that was asked for
        (by the worker, by the engine settling the run, by the workflow's own
        ``asyncio.wait_for`` or ``task.cancel()``). A ``CancelledError`` that the
        function raised by itself is an ordinary failure."""
        if isinstance(exc, CONTROL):
            return True
        if isinstance(exc, asyncio.CancelledError):
            task = asyncio.current_task()
            return self.life.stop is not None or (task is not None and task.cancelling() > 0)
        return False

    def _cancelled(self, step: _Step, started: StepRecord, info: StepInfo) -> None:
        """The attempt's task was cancelled, and the cancellation passes through.

        A sync function's thread cannot be stopped: when the engine stopped the
        attempt (the run ends, say after a ``gather`` sibling failed, or its worker
        stops it for a cancel), its end is journaled with the run's (see
        :meth:`_thread_ended`), so that nothing of a finished run is still running
        and the journal never says an effect did not happen when it did. A
        coroutine stops where it awaits: journaled cancelled when the run ends."""
        life = self.life
        thread = step.thread
        if thread is not None and (life.stop is not None or life.control.reason is not None):
            life.leave(functools.partial(self._thread_ended, step, started, thread, info))
        elif life.ending:
            self._cancelled_by_end(step, started)

    async def _thread_ended(
        self, step: _Step, started: StepRecord, thread: ThreadCall, info: StepInfo
    ) -> None:
        """Before the run's outcome is committed: wait for the thread of an attempt
        the engine stopped (until the step's timeout, if it has one) and journal how
        it really ended: completed with its result, failed with its error, or, still
        running past its timeout, failed as :class:`StepInterrupted` (outcome unknown)."""
        cur = self.cur
        failures = step.failures + 1
        if not await thread.ended():
            self._in_doubt(
                step,
                started,
                f"step {step.name!r} attempt {step.attempt} was still running on its thread "
                f"past its timeout of {step.timeout}s when the run ended: it may or may not "
                "take effect",
                failures,
            )
            return
        try:
            value = thread.outcome()
            if inspect.isawaitable(value):  # its awaitable was never awaited: cancelled
                if inspect.iscoroutine(value):
                    value.close()
                self._cancelled_by_end(step, started)
                return
            output, _ = _journaled(value, step.ret_type, step.name, info)
        except Exception as exc:  # what the function raised, or a result it cannot store
            self._failed(started, exc, failures)
            return
        cur.put(started, status="completed", output=output, finished_at=cur.now())

    def _cancelled_by_end(self, step: _Step, started: StepRecord) -> None:
        """The run ends without this attempt (a gather sibling failed and the workflow
        returned): no row of a finished run stays started."""
        self.cur.put(
            started,
            status="failed",
            error=dumps(
                {
                    "type": "Cancelled",
                    "message": f"the run ended while attempt {step.attempt} of "
                    f"step {step.name!r} ran: it was cancelled, and may or "
                    "may not have taken effect",
                    "retryable": False,
                    "failures": step.failures + 1,
                }
            ),
            finished_at=self.cur.now(),
        )

    # -- after an attempt ---------------------------------------------------------------

    async def _complete(self, step: _Step, started: StepRecord, output: str, value: Any) -> Any:
        cur = self.cur
        done = cur.put(started, status="completed", output=output, finished_at=cur.now())
        if step.mode == "at_most_once" or self.life.running:
            # at_most_once: its end must never be in doubt. Other steps still running
            # in parallel: don't let a crash in one of them cost this one's result.
            await cur.commit()
        if done.output is not output:
            # Secrets were redacted: the live run sees what a replay will see.
            return decode(done.output, step.ret_type, what=f"output of step {step.name!r}")
        return value

    async def _attempt_failed(self, step: _Step, started: StepRecord, error: BaseException) -> None:
        """Journal a failed attempt: wait out the back-off before the next one, or
        raise the step's failure."""
        step.failures += 1
        if step.mode == "at_most_once" and isinstance(error, StepTimeout):
            await self._timed_out(step, started, error)
        delay = step.retry.next_delay(step.failures, error, self.cur.engine.rng)
        if delay is None:
            await self._give_up(step, started, error)
        await self._retry_later(step, started, error, delay)

    async def _timed_out(self, step: _Step, started: StepRecord, error: StepTimeout) -> NoReturn:
        """The attempt may still be running (a thread cannot be killed): its outcome is
        unknown, so an ``at_most_once`` step is never attempted again."""
        err = self._in_doubt(
            step,
            started,
            f"at_most_once step {step.name!r} attempt {step.attempt} ran past its "
            f"timeout of {step.timeout}s and may still be running; it may or may "
            "not take effect, so it is not attempted again",
            step.failures,
        )
        await self.cur.commit()
        raise err from error

    async def _give_up(self, step: _Step, started: StepRecord, error: BaseException) -> NoReturn:
        cur = self.cur
        self._failed(started, error, step.failures)
        if step.mode == "at_most_once":
            await cur.commit()
        raise StepFailed(
            f"step {step.name!r} failed after {step.attempt} attempt(s): "
            f"{type(error).__name__}: {safe_str(error)}",
            error_type=f"{type(error).__module__}.{type(error).__qualname__}",
            attempts=step.attempt,
            run_id=cur.run_id,
            step=cur.where(step.seq, step.name),
        ) from error

    async def _retry_later(
        self, step: _Step, started: StepRecord, error: BaseException, delay: float
    ) -> None:
        cur = self.cur
        wake_at = cur.now() + delay
        retrying = cur.put(
            started,
            status="retrying",
            error=error_json(error, failures=step.failures),
            wake_at=wake_at,
        )
        step.last_error = retrying.error  # as journaled (redacted)
        log.info(
            "event=retry run=%s step=%s attempt=%d error=%r retry_in_s=%.3f",
            cur.run_id,
            cur.where(step.seq, step.name),
            step.attempt,
            _journaled_error(retrying.error, error),  # redacted, as journaled
            delay,
        )
        await self.waits.until(wake_at, reason=f"retry:{step.name}", keeps_slot=True)

    def _failed_from_journal(self, rec: StepRecord) -> MainspringError:
        err = loads(rec.error) or {}
        error_type = str(err.get("type", "Exception"))
        where = self.cur.where(rec.seq, rec.name)
        if error_type.endswith("StepInterrupted"):
            return StepInterrupted(str(err.get("message", "")), run_id=self.cur.run_id, step=where)
        return StepFailed(
            f"step {rec.name!r} failed after {rec.attempt} attempt(s): "
            f"{error_type.rsplit('.', 1)[-1]}: {err.get('message', '')}",
            error_type=error_type,
            attempts=rec.attempt,
            run_id=self.cur.run_id,
            step=where,
        )


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
