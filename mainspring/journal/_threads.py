"""Sync step functions on the engine's threads, with a cheap hand-off back.

A sync (``def``) step function always runs on a thread of the engine's pool, never in
the event loop's thread: a hung one holds its own thread only, and ``timeout=`` is
enforced by the awaiting task (the thread is abandoned, since it cannot be killed).

What is cheap here is the way back. ``loop.run_in_executor`` wakes the event loop
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

    def run(self) -> None:
        """In the pool's thread: call, keep the outcome, tell whoever waits."""
        try:
            self.value = self.fn()
        except BaseException as exc:  # a failed attempt, as run_in_executor had it
            self.error = exc
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
    submitted = threads.submit(call.run)
    if short_wait_s > 0:
        wait = short_wait_s if timeout is None else max(0.0, min(short_wait_s, timeout))
        if call.ended.acquire(timeout=wait):
            return call.outcome()
    waiter = call.wait_async(loop)
    if waiter is not None:
        # A pool shut down with cancel_futures drops queued calls: they never run.
        submitted.add_done_callback(lambda f: _dropped(f, loop, waiter))
        if deadline is None:
            await waiter
        else:  # the short wait counts: the deadline was set before it
            async with asyncio.timeout_at(deadline):
                await waiter
    return call.outcome()


def _dropped(
    f: Future[None], loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None]
) -> None:
    if f.cancelled():
        _wake(loop, waiter, asyncio.CancelledError())
