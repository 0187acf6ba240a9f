"""Sync step functions on the engine's threads, with a cheap hand-off both ways.

A sync (``def``) step function always runs on a thread, never in the event loop's
thread: a hung one holds its own thread only, and ``timeout=`` is enforced by the
awaiting task (the thread is abandoned, since it cannot be killed).

One thread is kept warm and takes one call at a time (the engine's pool takes the
calls it is busy for). The hand-off to it and, when the run is alone in its worker,
the way back are a byte through a pipe, for a reason that costs about half of a sync
step: ``os.write`` lets go of the GIL *before* it wakes the other thread, so the
woken thread runs at once. A ``threading.Lock`` or a queue wakes it while the waker
still holds the GIL, and the woken thread goes back to sleep on the GIL: two more
context switches per hand-off (measured: 2.6 against 2.0 per call, 7 µs against
20 µs per round trip on a 2-core machine).

The way back is cheap only if nothing else needs the loop meanwhile. A run alone in
its worker does not, so the loop's thread blocks (:data:`SHORT_WAIT_S` at most, and
never past the step's timeout) on the pipe rather than being woken through the event
loop's self-pipe. A function still running after that is awaited the ordinary way, so
a slow or hung one blocks the loop for that cap at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

__all__ = ["SHORT_WAIT_S", "InlineExecutor", "ThreadCall", "call_in_thread"]

#: How long the loop's thread may block for a sync step of a run alone in its worker
#: before it awaits it instead (about one fsync).
SHORT_WAIT_S = 0.001


class _Call:
    """One call of a sync function on another thread, and how its end is told."""

    __slots__ = ("abandoned", "ended", "error", "fn", "lock", "loop", "value", "waiter")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.ended = False
        self.abandoned = False  # its caller stopped waiting without a waiter
        self.lock = threading.Lock()  # orders the end against a waiter arriving
        self.value: Any = None
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def call(self) -> bool:
        """Call, keep the outcome; ``False`` if nobody awaits it yet (whoever does will
        find it ended), ``True`` if an awaiting task has been woken or nobody will."""
        try:
            self.value = self.fn()
        except BaseException as exc:  # a failed attempt, as run_in_executor had it
            self.error = exc
        with self.lock:
            self.ended = True
            waiter, loop, abandoned = self.waiter, self.loop, self.abandoned
        if waiter is not None and loop is not None:
            _wake(loop, waiter, None)
        return waiter is not None or abandoned

    def wait_async(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None] | None:
        """A future settled when the call ends, or ``None`` if it has already ended."""
        with self.lock:
            if self.ended:
                return None
            self.waiter, self.loop = loop.create_future(), loop
            return self.waiter

    def outcome(self) -> Any:
        if self.error is not None:
            error, self.error = self.error, None  # no cycle through the traceback
            raise error
        return self.value


def _wake(
    loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None], cancelled: BaseException | None
) -> None:
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
        loop.call_soon_threadsafe(_settle, waiter, cancelled)


def _settle(waiter: asyncio.Future[None], cancelled: BaseException | None) -> None:
    if waiter.done():  # the awaiting task gave up (timeout, cancellation)
        return
    if cancelled is not None:
        waiter.set_exception(cancelled)
    else:
        waiter.set_result(None)


class _WarmThread:
    """One thread kept warm for sync steps. It takes one call at a time (a step still
    running, or hung and abandoned after its timeout, sends the next ones to the pool)
    and ends after :data:`_IDLE_S` without work, so it never outlives its use for long.

    ``_free`` is held from a hand-off until the call's end has been taken: by the
    thread if an awaiting task was woken, else by the caller once it has read the
    call's byte from ``_done`` (so a byte is always read by the caller it is for).
    """

    def __init__(self) -> None:
        self._free = threading.Lock()
        self._state = threading.Lock()  # orders a hand-off against the thread ending
        self._alive = False
        self._call: _Call | None = None
        self._go_r, self._go_w = os.pipe()  # a byte per call handed over
        self._done_r, self._done_w = os.pipe()  # a byte per call ended unawaited
        self._done = select.poll()  # only the caller holding _free polls it
        self._done.register(self._done_r, select.POLLIN)

    def try_call(self, call: _Call) -> bool:
        """Hand ``call`` over, or ``False`` if the thread is busy."""
        if not self._free.acquire(blocking=False):
            return False
        with self._state:
            self._call = call
            os.write(self._go_w, b"\0")
            if not self._alive:
                self._alive = True
                threading.Thread(target=self._loop, name="mainspring-step", daemon=True).start()
        return True

    def wait(self, call: _Call, seconds: float) -> bool:
        """Block up to ``seconds`` for the end of ``call`` (handed over by this thread
        of the caller); ``True`` if it ended, and the thread is free again."""
        try:
            ready = self._done.poll(seconds * 1e3)
        except BaseException:  # interrupted (KeyboardInterrupt): nobody will read a byte
            with call.lock:
                call.abandoned = not call.ended
            if not call.abandoned:
                os.read(self._done_r, 1)
                self._free.release()
            raise
        if not ready:
            with call.lock:
                if not call.ended:
                    return False
            # Ended just now, unawaited: its byte is written or about to be.
        os.read(self._done_r, 1)
        self._free.release()
        return True

    def _loop(self) -> None:
        go = select.poll()
        go.register(self._go_r, select.POLLIN)
        while True:
            if not go.poll(_IDLE_S * 1e3):
                with self._state:
                    if not go.poll(0):
                        self._alive = False
                        return
            os.read(self._go_r, 1)
            call, self._call = self._call, None
            assert call is not None
            if call.call():
                self._free.release()
            else:
                os.write(self._done_w, b"\0")  # the caller releases _free

    def close(self) -> None:
        for fd in (self._go_r, self._go_w, self._done_r, self._done_w):
            os.close(fd)


_IDLE_S = 2.0
_warm = _WarmThread()


def _forked() -> None:
    """A forked child has none of its parent's threads: a fresh warm thread."""
    global _warm
    _warm.close()
    _warm = _WarmThread()


os.register_at_fork(after_in_child=_forked)


class InlineExecutor(Executor):
    """Runs each call at once, in the caller's thread: no thread at all.

    For a simulated run (``mainspring.testing.sim``), where every step must happen on
    the one event loop, in an order a seed decides. A sync step given this executor
    holds the loop while it runs, and its ``timeout=`` cannot interrupt it.
    """

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # as a pool's future carries it
            done.set_exception(exc)
        return done


class ThreadCall:
    """A sync function started on another thread (the warm one, else ``threads``):
    its result awaited (:meth:`result`), and, after whoever awaited it was
    cancelled, its end awaited again (:meth:`ended`), since the thread cannot be
    stopped and what it did must still be known."""

    def __init__(self, threads: Executor, fn: Callable[[], Any], timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.deadline = None if timeout is None else loop.time() + timeout
        self._timeout = timeout
        self._call = call = _Call(fn)
        self._warm = _warm
        inline = isinstance(threads, InlineExecutor)  # no thread, warm or not
        self._submitted = None if not inline and _warm.try_call(call) else threads.submit(call.call)
        self.dropped = False  # a pool shut down with cancel_futures: it never ran
        if self._submitted is not None:
            # Whoever waits for it then (a first waiter or a later one) is woken.
            self._submitted.add_done_callback(self._dropped)

    async def result(self, short_wait_s: float) -> Any:
        """The call's result (or what it raised); ``TimeoutError`` past its timeout.

        With ``short_wait_s > 0`` the loop's thread blocks up to that long (never past
        the timeout) for the result of a call on the warm thread before awaiting it.
        """
        call, warm, timeout = self._call, self._warm, self._timeout
        ended = False
        if short_wait_s > 0 and self._submitted is None:
            wait = short_wait_s if timeout is None else max(0.0, min(short_wait_s, timeout))
            ended = warm.wait(call, wait)
        waiter = None if ended else call.wait_async(self._loop)
        if waiter is None and not ended and self._submitted is None:
            warm.wait(call, 0.0)  # ended in between, unawaited: take its byte
        if waiter is not None:
            if self.dropped:  # dropped before anyone waited: it will never run
                raise asyncio.CancelledError
            if self.deadline is None:
                await waiter
            else:  # the short wait counts: the deadline was set before it
                async with asyncio.timeout_at(self.deadline):
                    await waiter
        # One line for both ways back: a failure's traceback (journaled with its error)
        # is the same whichever way the result came.
        return call.outcome()

    async def ended(self) -> bool:
        """After :meth:`result` was cancelled: wait until the call ends, or until its
        deadline (``False``: it may still be running, its outcome unknown). Then
        :meth:`outcome` gives what it returned or raised."""
        if self.dropped:
            return True
        waiter = self._call.wait_async(self._loop)
        if waiter is None:
            return True
        try:
            if self.deadline is None:
                await waiter
            else:
                async with asyncio.timeout_at(self.deadline):
                    await waiter
        except TimeoutError:
            return False
        except asyncio.CancelledError:
            if not self.dropped:
                raise
        return True

    def outcome(self) -> Any:
        """What the ended call returned (or raise what it raised)."""
        if self.dropped:
            raise RuntimeError("the step function never ran: its thread pool was shut down")
        return self._call.outcome()

    def _dropped(self, f: Future[Any]) -> None:
        if f.cancelled():  # a pool shut down with cancel_futures drops queued calls
            self.dropped = True
            waiter = self._call.waiter
            if waiter is not None:
                _wake(self._loop, waiter, asyncio.CancelledError())


async def call_in_thread(
    threads: Executor, fn: Callable[[], Any], timeout: float | None, short_wait_s: float
) -> Any:
    """``fn()`` on another thread (``threads`` when the warm one is busy);
    ``TimeoutError`` past ``timeout`` seconds. See :meth:`ThreadCall.result`."""
    return await ThreadCall(threads, fn, timeout).result(short_wait_s)
