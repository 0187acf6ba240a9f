"""Time as a dependency.

Journal and worker code never call ``time.time()``, ``datetime.now()`` or ``random``
directly: they take a :class:`Clock`, so tests can drive time with a :class:`FakeClock`
and recorded values come only from the journal on replay.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "FakeClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Wall time and sleeping. ``now()`` is seconds since the Unix epoch."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when told to.

    ``sleep`` blocks until :meth:`advance` moves time past the wake-up, so a test
    can let an hour pass in a microsecond::

        clock = FakeClock(start=1_700_000_000)
        app = ms.App("sqlite:///t.db", clock=clock)
        ...
        clock.advance(3600)
    """

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self._now = float(start)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._ids = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._ids), fut))
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose time has come."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back: advance({seconds!r})")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.get_loop().call_soon_threadsafe(_resolve, fut)

    @property
    def sleepers(self) -> int:
        """How many coroutines are blocked in :meth:`sleep`."""
        return sum(1 for _, _, f in self._sleepers if not f.done())


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
