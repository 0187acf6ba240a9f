"""Sync step functions on the engine's threads, with a cheap hand-off back.

A sync (``def``) step function always runs on a thread of the engine's pool, never in
the event loop's thread: a hung one holds its own thread only, and ``timeout=`` is
enforced by the awaiting task (the thread is abandoned, since it cannot be killed).

Handing a call over is cheap: one thread is kept warm and takes a call with a queue
put (the pool, with its futures and work items, takes the calls it is busy for).
What is cheap too is the way back. ``loop.run_in_executor`` wakes the event loop
through its self-pipe for every call (a wrapped future, a thread-safe callback, a
pass through the selector). When the run is alone in its worker nothing else needs the
loop meanwhile, so the loop's thread first blocks on a lock that the step's thread
releases as it returns: a short function's result comes back without the loop waking
up. The wait is capped (:data:`SHORT_WAIT_S`, and never past the step's timeout); a
function still running after it is awaited the ordinary way, so a slow or hung one
blocks the loop for that cap at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

__all__ = ["SHORT_WAIT_S", "call_in_thread"]

#: How long the loop's thread may block for a sync step of a run alone in its worker
#: before it awaits it instead (about one fsync).
SHORT_WAIT_S = 0.001


class _Call:
    """One call of a sync function on a pool thread, and how its end is told."""

    __slots__ = ("ended", "error", "fn", "lock", "loop", "value", "waiter")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.ended = threading.Lock()  # held until the call returns or raises
        self.ended.acquire()
        self.lock = threading.Lock()  # orders the end against a waiter arriving
        self.value: Any = None
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def run(self, free: threading.Lock | None = None) -> None:
        """In a pool's thread: call, keep the outcome, tell whoever waits (after
        releasing ``free``, so that the next step finds the warm thread free)."""
        try:
            self.value = self.fn()
        except BaseException as exc:  # a failed attempt, as run_in_executor had it
            self.error = exc
        if free is not None:
            free.release()
        with self.lock:
            self.ended.release()
            waiter, loop = self.waiter, self.loop
        if waiter is not None and loop is not None:
            _wake(loop, waiter, None)

    def wait_async(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None] | None:
        """A future settled when the call ends, or ``None`` if it has already ended."""
        with self.lock:
            if self.ended.acquire(blocking=False):
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
    """One thread kept warm for sync steps: handing a call to it is a queue put, not
    an executor's submit. It takes one call at a time (a step still running, or hung
    and abandoned after its timeout, sends the next ones to the pool) and ends after
    :data:`_IDLE_S` without work, so it never outlives its use for long."""

    def __init__(self) -> None:
        self._free = threading.Lock()  # held from a call's hand-off to its end
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._state = threading.Lock()  # orders a hand-off against the thread ending
        self._alive = False

    def try_call(self, call: _Call) -> bool:
        """Hand ``call`` over, or ``False`` if the thread is busy."""
        if not self._free.acquire(blocking=False):
            return False
        with self._state:
            self._calls.put(call)
            if not self._alive:
                self._alive = True
                threading.Thread(target=self._loop, name="mainspring-step", daemon=True).start()
        return True

    def _loop(self) -> None:
        while True:
            try:
                call = self._calls.get(timeout=_IDLE_S)
            except queue.Empty:
                with self._state:
                    if self._calls.empty():
                        self._alive = False
                        return
                continue
            call.run(self._free)


_IDLE_S = 2.0
_warm = _WarmThread()


def _forked() -> None:
    """A forked child has none of its parent's threads: a fresh warm thread."""
    global _warm
    _warm = _WarmThread()


os.register_at_fork(after_in_child=_forked)


async def call_in_thread(
    threads: Executor, fn: Callable[[], Any], timeout: float | None, short_wait_s: float
) -> Any:
    """``fn()`` on one of ``threads``; ``TimeoutError`` past ``timeout`` seconds.

    With ``short_wait_s > 0`` the loop's thread blocks up to that long (never past
    ``timeout``) for the result before awaiting it.
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    call = _Call(fn)
    submitted = None if _warm.try_call(call) else threads.submit(call.run)
    ended = False
    if short_wait_s > 0:
        wait = short_wait_s if timeout is None else max(0.0, min(short_wait_s, timeout))
        ended = call.ended.acquire(timeout=wait)
    waiter = None if ended else call.wait_async(loop)
    if waiter is not None:
        if submitted is not None:
            # A pool shut down with cancel_futures drops queued calls: they never run.
            submitted.add_done_callback(lambda f: _dropped(f, loop, waiter))
        if deadline is None:
            await waiter
        else:  # the short wait counts: the deadline was set before it
            async with asyncio.timeout_at(deadline):
                await waiter
    # One line for both ways back: a failure's traceback (journaled with its error)
    # is the same whichever way the result came.
    return call.outcome()


def _dropped(
    f: Future[None], loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None]
) -> None:
    if f.cancelled():
        _wake(loop, waiter, asyncio.CancelledError())
