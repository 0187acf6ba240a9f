"""Group commit: the writes of every run stepping at the same moment share one
transaction, so a worker with many runs pays one commit (one fsync) per batch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from .._clock import Clock
from ..storage import RunWrite, Store, WriteResult
from ._engine import Committer

__all__ = ["BatchCommitter"]

_Item = tuple[RunWrite, "asyncio.Future[WriteResult]", asyncio.AbstractEventLoop]


class BatchCommitter(Committer):
    """Commits from one background thread; while a commit is in flight, new writes
    queue up and go together in the next one (no timer, no added latency)."""

    def __init__(self, store: Store, clock: Clock, *, max_batch: int = 512) -> None:
        super().__init__(store, clock)
        self.max_batch = max_batch
        self._queue: list[_Item] = []
        self._cv = threading.Condition()
        self._closed = False
        self._inflight = False
        self._thread: threading.Thread | None = None
        # self.solo (set by the worker): nothing to batch with, so committing in the
        # loop's own thread saves the hop to the committer thread.
        self.batches = 0
        self.writes = 0

    async def commit(self, write: RunWrite) -> WriteResult:
        if self.solo and not self._queue and not self._inflight:
            self.batches += 1
            self.writes += 1
            return self.observed(write, self.store.commit([write], self.clock.now())[0])
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[WriteResult] = loop.create_future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the committer is closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="mainspring-committer", daemon=True
                )
                self._thread.start()
            self._queue.append((write, fut, loop))
            self._cv.notify()
        return self.observed(write, await fut)

    async def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue and self._closed:
                    self.store.release_thread()  # a thread per worker run: close its connection
                    return
                batch = self._queue[: self.max_batch]
                del self._queue[: self.max_batch]
                self._inflight = True
            try:
                results: list[Any] = self.store.commit([w for w, _, _ in batch], self.clock.now())
                settle: Callable[[asyncio.Future[Any], Any], None] = _succeed
            except Exception as exc:
                results, settle = [exc] * len(batch), _fail
            self._inflight = False
            if settle is _succeed:
                self.batches += 1
                self.writes += len(batch)
            # One wake-up of each loop per batch, not one per write.
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Any, Any]]] = {}
            for (_, fut, loop), result in zip(batch, results, strict=True):
                by_loop.setdefault(loop, []).append((fut, result))
            for loop, items in by_loop.items():
                loop.call_soon_threadsafe(_settle_all, settle, items)


def _settle_all(settle: Any, items: list[tuple[Any, Any]]) -> None:
    for fut, result in items:
        settle(fut, result)


def _succeed(fut: asyncio.Future[Any], result: Any) -> None:
    if not fut.done():
        fut.set_result(result)


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
