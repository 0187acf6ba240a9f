"""Leases kept from a thread of their own.

The worker's event loop runs workflow code and, for a single run, its commits: either
can hold the loop for a while (a slow fsync, a busy database, CPU-bound workflow
code). A heartbeat that needs the loop would wait behind them and let healthy leases
expire under load. This thread beats on its own schedule and hands what it learned
(lost leases, cancel requests) back to the loop.

It only vouches for a loop that is alive: the loop ticks a timestamp, and if the loop
has not ticked for a whole lease the thread stops extending leases, so a process
whose loop is wedged lets its runs go to other workers instead of holding them
forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from .._clock import Clock
from .._errors import StoreError, StoreUnavailable
from ..storage import DatabaseGone, Heartbeat, Store

__all__ = ["Beater"]

log = logging.getLogger("mainspring.worker")

Held = dict[str, int]


class Beater:
    """Extends the leases of the runs a worker holds, every ``every_s`` seconds.

    ``on_beat(beat, held)`` runs in the loop after each beat (``held``: the
    ``run_id -> epoch`` pairs the beat was for); ``on_expired()`` when beats have
    failed for longer than a lease; ``on_fatal(exc)`` when the store says it must not
    be used any more. ``on_alive(now)`` runs in this thread after each successful beat
    (or each idle round while the loop ticks): what the liveness gauge shows.
    """

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        lease_s: float,
        every_s: float,
        db_clock: bool,
        worker_id: str,
        loop: asyncio.AbstractEventLoop,
        on_beat: Callable[[Heartbeat, Held], None],
        on_expired: Callable[[], None],
        on_fatal: Callable[[DatabaseGone], None],
        on_alive: Callable[[float], None] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.lease_s = lease_s
        self.every_s = every_s
        self.db_clock = db_clock
        self.worker_id = worker_id
        self._loop = loop
        self._on_beat = on_beat
        self._on_expired = on_expired
        self._on_fatal = on_fatal
        self._on_alive = on_alive
        self._held: Held = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tick = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, name=f"mainspring-heartbeat-{worker_id}", daemon=True
        )

    def hold(self, run_id: str, epoch: int) -> None:
        with self._lock:
            self._held[run_id] = epoch

    def drop(self, run_id: str, epoch: int) -> None:
        with self._lock:
            if self._held.get(run_id) == epoch:  # not a newer claim of the same run
                del self._held[run_id]

    def tick(self) -> None:
        """Called by the loop: it is alive."""
        self._tick = time.monotonic()

    async def ticking(self) -> None:
        """The loop's side: tick twice per beat, until cancelled."""
        while True:
            self.tick()
            await asyncio.sleep(self.every_s / 2)

    def start(self) -> None:
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join)

    def _run(self) -> None:
        try:
            self._beat_until_stopped()
        finally:
            self.store.release_thread()  # one thread per worker run: leave no connection

    def _beat_until_stopped(self) -> None:
        last_ok = self.clock.now()
        stalled = False
        while not self._stop.wait(self.every_s):
            with self._lock:
                held = dict(self._held)
            since = time.monotonic() - self._tick
            if not held:
                last_ok = self.clock.now()
                if since <= self.lease_s:  # idle, with a live loop: nothing to extend
                    self._alive(last_ok)
                continue
            if since > self.lease_s:
                if not stalled:
                    log.error(
                        "worker %s: its event loop has not run for %.1fs (longer than the "
                        "%.1fs lease); no longer extending its leases",
                        self.worker_id,
                        since,
                        self.lease_s,
                    )
                stalled = True
                continue
            stalled = False
            try:
                beat = self.store.heartbeat(
                    runs=sorted(held.items()),
                    now=self.clock.now(),
                    lease_s=self.lease_s,
                    db_clock=self.db_clock,
                )
            except DatabaseGone as exc:
                self._call(self._on_fatal, exc)
                return
            except (StoreUnavailable, StoreError) as exc:
                log.warning("worker %s: heartbeat failed: %s", self.worker_id, exc)
                if self.clock.now() - last_ok > self.lease_s:
                    # Our leases have expired by now: stop acting for these runs.
                    self._call(self._on_expired)
                continue
            last_ok = self.clock.now()
            self._alive(last_ok)
            self._call(self._on_beat, beat, held)

    def _alive(self, now: float) -> None:
        if self._on_alive is not None:
            try:
                self._on_alive(now)
            except Exception:  # telemetry never stops the heartbeat
                log.exception("worker %s: liveness callback failed", self.worker_id)

    def _call(self, fn: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop may have closed already
            self._loop.call_soon_threadsafe(fn, *args)
