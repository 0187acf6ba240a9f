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
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from .._clock import Clock
from .._errors import StoreError, StoreUnavailable
from ..storage import DatabaseGone, Heartbeat, Store, WorkerBeat

__all__ = ["Beater"]

log = logging.getLogger("mainspring.worker")

Held = dict[str, int]

# A worker silent this long is forgotten by the registry (some live worker's beat
# deletes its row), and that beat comes this often at most (real time).
FORGET_AFTER_S = 86_400.0
FORGET_EVERY_S = 600.0


class Beater:
    """Extends the leases of the runs a worker holds, every ``every_s`` seconds.

    ``on_beat(beat, held)`` runs in the loop after each beat (``held``: the
    ``run_id -> epoch`` pairs the beat was for); ``on_expired()`` when beats have
    failed for longer than a lease; ``on_fatal(exc)`` when the store says it must not
    be used any more. ``on_alive(now)`` runs in this thread after each successful beat
    (or each idle round while the loop ticks): what the liveness gauge shows.

    ``registration``: the worker's row in the registry (``ms_workers``), written by
    every beat, in the beat's own transaction when it holds runs (an idle worker's
    beat writes only that row). ``None``: the worker does not register.

    ``threaded=False`` beats from a task on ``loop`` instead of a thread, and
    ``monotonic`` is the clock of the loop's liveness tick (a simulated worker's:
    its loop's virtual time; see ``worker/_offload.py``).
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
        registration: WorkerBeat | None = None,
        threaded: bool = True,
        monotonic: Callable[[], float] = time.monotonic,
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
        self.registration = registration
        self._monotonic = monotonic
        self._forget_at = 0.0  # monotonic: when this worker next forgets the long dead
        self._held: Held = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tick = monotonic()
        # threaded=False (a simulated worker): the same beats, from a task on the loop.
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        if threaded:
            self._thread = threading.Thread(
                target=self._run, name=f"mainspring-heartbeat-{worker_id}", daemon=True
            )
        self._last_ok = 0.0
        self._stalled = False

    def hold(self, run_id: str, epoch: int) -> None:
        with self._lock:
            self._held[run_id] = epoch

    def drop(self, run_id: str, epoch: int) -> None:
        with self._lock:
            if self._held.get(run_id) == epoch:  # not a newer claim of the same run
                del self._held[run_id]

    def tick(self) -> None:
        """Called by the loop: it is alive."""
        self._tick = self._monotonic()

    async def ticking(self) -> None:
        """The loop's side: tick twice per beat, until cancelled."""
        while True:
            self.tick()
            await asyncio.sleep(self.every_s / 2)

    def start(self) -> None:
        self._last_ok = self.clock.now()
        if self._thread is not None:
            self._thread.start()
        else:
            self._task = self._loop.create_task(self._beat_in_loop())

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        elif self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.every_s) and self._round():
                pass
        finally:
            self.store.release_thread()  # one thread per worker run: leave no connection

    async def _beat_in_loop(self) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(self.every_s)
            if not self._round():
                return

    def _round(self) -> bool:
        """One beat; ``False``: the store is gone, beat no more."""
        with self._lock:
            held = dict(self._held)
        since = self._monotonic() - self._tick
        if not held:
            self._last_ok = self.clock.now()
            if since <= self.lease_s:  # idle, with a live loop: nothing to extend
                if self._register_idle() is False:
                    return False
                self._alive(self._last_ok)
            return True
        if since > self.lease_s:
            if not self._stalled:
                log.error(
                    "worker %s: its event loop has not run for %.1fs (longer than the "
                    "%.1fs lease); no longer extending its leases",
                    self.worker_id,
                    since,
                    self.lease_s,
                )
            self._stalled = True
            return True
        self._stalled = False
        try:
            beat = self.store.heartbeat(
                runs=sorted(held.items()),
                now=self.clock.now(),
                lease_s=self.lease_s,
                db_clock=self.db_clock,
                worker=self._beat(),
            )
        except DatabaseGone as exc:
            self._call(self._on_fatal, exc)
            return False
        except (StoreUnavailable, StoreError) as exc:
            log.warning("worker %s: heartbeat failed: %s", self.worker_id, exc)
            if self.clock.now() - self._last_ok > self.lease_s:
                # Our leases have expired by now: stop acting for these runs.
                self._call(self._on_expired)
            return True
        self._last_ok = self.clock.now()
        self._alive(self._last_ok)
        self._call(self._on_beat, beat, held)
        return True

    def _beat(self) -> WorkerBeat | None:
        """What this beat registers: the worker's row, and now and then the order to
        forget workers silent for a day."""
        if self.registration is None:
            return None
        if self._monotonic() < self._forget_at:
            return self.registration
        self._forget_at = self._monotonic() + FORGET_EVERY_S
        return dataclasses.replace(
            self.registration, forget_before=self.clock.now() - FORGET_AFTER_S
        )

    def _register_idle(self) -> bool | None:
        """An idle beat: only the registry row. A failure is logged and retried at
        the next beat (no lease is at stake); ``False``: the store is gone."""
        worker = self._beat()
        if worker is None:
            return None
        try:
            self.store.heartbeat(
                runs=[],
                now=self.clock.now(),
                lease_s=self.lease_s,
                db_clock=self.db_clock,
                worker=worker,
            )
        except DatabaseGone as exc:
            self._call(self._on_fatal, exc)
            return False
        except (StoreUnavailable, StoreError) as exc:
            log.debug("worker %s: registering its beat failed: %s", self.worker_id, exc)
            self._forget_at = 0.0  # the forgetting, if this beat carried it, comes next
        return True

    def _alive(self, now: float) -> None:
        if self._on_alive is not None:
            try:
                self._on_alive(now)
            except Exception:  # telemetry never stops the heartbeat
                log.exception("worker %s: liveness callback failed", self.worker_id)

    def _call(self, fn: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop may have closed already
            self._loop.call_soon_threadsafe(fn, *args)
