"""Where a worker runs what must not hold its event loop, and how it reads
monotonic time: real threads and the real clock, unless a simulation says otherwise.

A worker uses threads in three places: sync step functions (an executor), the
heartbeat (a thread of its own, so a busy loop does not starve the leases) and
``asyncio.to_thread`` for store calls (which goes through the loop's default
executor, so a simulated loop provides it). ``mainspring.testing.sim`` runs many
workers on one simulated event loop, where every one of these must happen on the
loop, in an order its seed decides, and time is virtual: :class:`Offload` is the
one door it passes through.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

__all__ = ["Offload"]


def _pool() -> Executor:
    return ThreadPoolExecutor(max_workers=64, thread_name_prefix="mainspring-step")


@dataclass(frozen=True, slots=True, kw_only=True)
class Offload:
    """How a worker runs its blocking parts.

    Attributes:
        steps: makes the executor for sync step functions (a pool of threads).
        heartbeat_thread: beat from a thread of its own (``False``: a task on the
            worker's loop, as a simulation needs).
        monotonic: the clock of intervals that are not the App's time (the heartbeat's
            liveness tick, the write-ahead log's look); a simulation passes its loop's.
    """

    steps: Callable[[], Executor] = _pool
    heartbeat_thread: bool = True
    monotonic: Callable[[], float] = time.monotonic
