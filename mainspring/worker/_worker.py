"""The worker: claims runnable runs, executes many at once, keeps their leases.

One asyncio loop runs up to ``concurrency`` runs. A heartbeat extends the leases
of the runs it holds; a run whose lease is gone (another worker took it over) or
that was asked to cancel is stopped at once. On SIGTERM/SIGINT the worker
drains: each run finishes the step it is in and is given back, so no run is lost
and none waits for a lease to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._describe import safe_traceback
from .._errors import StoreError, StoreUnavailable
from ..journal import BatchCommitter, Committer, Engine, Outcome, RunControl, execute
from ..storage import RunRecord

if TYPE_CHECKING:
    from .._app import App

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("mainspring.worker")


@dataclass
class WorkerStats:
    """Counts of how runs left this worker."""

    claimed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


@dataclass
class _Active:
    run: RunRecord
    task: asyncio.Task[Outcome]
    control: RunControl


class Worker:
    """Executes runs of an :class:`App`'s workflows.

    Args:
        app: whose workflows and store to use.
        concurrency: how many runs may execute at once.
        worker_id: a name for leases and logs (host, pid and a random suffix by default).
        batch: share commits between runs (group commit); off, every run commits alone.
        shutdown_grace_s: on stop, how long runs may take to reach a step boundary
            before they are interrupted (and replayed elsewhere).
    """

    def __init__(
        self,
        app: App,
        *,
        concurrency: int = 64,
        worker_id: str | None = None,
        batch: bool = True,
        shutdown_grace_s: float = 30.0,
        _run_id: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
        self.app = app
        self.concurrency = concurrency
        self.worker_id = worker_id or (
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        )
        self.batch = batch
        self.shutdown_grace_s = shutdown_grace_s
        self.stats = WorkerStats()
        self._only = _run_id
        self._active: dict[str, _Active] = {}
        self._stopping = False
        self._wakeup: asyncio.Event | None = None

    def request_stop(self) -> None:
        """Stop claiming and drain (safe to call from a signal handler)."""
        self._stopping = True
        for active in self._active.values():
            active.control.draining = True  # each run stops at its next step boundary
        if self._wakeup is not None:
            self._wakeup.set()

    def wake(self) -> None:
        """Poll the store now instead of at the next interval."""
        if self._wakeup is not None:
            self._wakeup.set()

    async def run(self, *, until_idle: bool = False) -> None:
        """Work until :meth:`request_stop` (or, with ``until_idle``, until nothing is
        runnable and nothing is executing)."""
        app = self.app
        self._wakeup = asyncio.Event()
        committer: Committer = (
            BatchCommitter(app.store, app.clock) if self.batch else Committer(app.store, app.clock)
        )
        threads = ThreadPoolExecutor(max_workers=64, thread_name_prefix="mainspring-step")
        engine = Engine(
            store=app.store,
            clock=app.clock,
            rng=app.rng,
            committer=committer,
            threads=threads,
            default_retry=app.default_retry,
            inline_wait_s=app.inline_wait_s,
            redact=app.redactor.redact_json if app.redactor is not None else None,
            # telemetry outermost: it times the attempt as the step's policy sees it
            interceptors=(app.telemetry, *app.interceptors),
        )
        committer.observers.append(app.telemetry.committed)
        app.telemetry.worker_load(self.worker_id, 0, self.concurrency)
        heartbeat = asyncio.create_task(self._heartbeat_loop())
        loop = asyncio.get_running_loop()
        wakeup = self._wakeup

        # Pushed wake-ups (LISTEN/NOTIFY on PostgreSQL); polling remains the fallback.
        def pushed() -> None:
            with contextlib.suppress(RuntimeError):  # the loop may have closed already
                loop.call_soon_threadsafe(wakeup.set)

        stop_listening = app.store.listen(pushed)
        try:
            await self._claim_loop(engine, until_idle)
        finally:
            if stop_listening is not None:
                await asyncio.to_thread(stop_listening)
            await self._drain()
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
            await committer.close()
            threads.shutdown(wait=False, cancel_futures=True)
            app.telemetry.worker_load(self.worker_id, 0, None)
            await asyncio.to_thread(app.telemetry.flush)

    async def _claim_loop(self, engine: Engine, until_idle: bool) -> None:
        app = self.app
        assert self._wakeup is not None
        names = list(app.workflows)
        while not self._stopping:
            self._wakeup.clear()
            claimed: list[RunRecord] = []
            free = self.concurrency - len(self._active)
            if free > 0:
                try:
                    claimed = await asyncio.to_thread(
                        app.store.claim,
                        worker=self.worker_id,
                        now=app.clock.now(),
                        lease_s=app.lease_s,
                        limit=free,
                        workflows=names,
                        max_recoveries=app.max_recoveries,
                        run_id=self._only,
                    )
                except (StoreUnavailable, StoreError) as exc:
                    log.warning("worker %s: claim failed: %s", self.worker_id, exc)
            for record in claimed:
                self._start(engine, record)
            if self._only is not None and not self._active and not claimed:
                if self._finished_only():
                    return
            elif until_idle and not self._active and not claimed:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), app.poll_interval_s)

    def _finished_only(self) -> bool:
        assert self._only is not None
        record = self.app.store.get_run(self._only)
        return record is None or record.finished

    def _start(self, engine: Engine, record: RunRecord) -> None:
        self.stats.claimed += 1
        self.app.telemetry.run_claimed(record)
        stale = self._active.get(record.id)
        if stale is not None:
            # Our own lease ran out (a stall longer than the lease) and we claimed the
            # run afresh: the old execution is fenced off already; stop it now.
            self._interrupt(stale, "lost")
        workflow = self.app.workflows[record.workflow]
        control = RunControl(draining=self._stopping)
        task = asyncio.create_task(
            execute(engine, record, workflow, control), name=f"mainspring-run-{record.id}"
        )
        entry = self._active[record.id] = _Active(record, task, control)
        self._set_solo(engine)

        def done(t: asyncio.Task[Outcome], run_id: str = record.id) -> None:
            if self._active.get(run_id) is entry:  # not a newer claim of the same run
                del self._active[run_id]
                self.app.telemetry.run_released(run_id)
            self._set_solo(engine)
            if t.cancelled():
                outcome = "lost"
            elif (exc := t.exception()) is not None:  # execute() catches all; just in case
                log.error("run %s: executor crashed\n%s", run_id, safe_traceback(exc))
                outcome = "abandoned"
            else:
                outcome = t.result()
            self.stats.outcomes[outcome] = self.stats.outcomes.get(outcome, 0) + 1
            if self._wakeup is not None:
                self._wakeup.set()

        task.add_done_callback(done)

    def _set_solo(self, engine: Engine) -> None:
        self.app.telemetry.worker_load(self.worker_id, len(self._active), self.concurrency)
        if isinstance(engine.committer, BatchCommitter):
            engine.committer.solo = len(self._active) <= 1

    async def _heartbeat_loop(self) -> None:
        app = self.app
        last_ok = app.clock.now()
        while True:
            await asyncio.sleep(app.heartbeat_s)
            held = [(a.run.id, a.run.epoch) for a in self._active.values()]
            if not held:
                last_ok = app.clock.now()
                continue
            try:
                beat = await asyncio.to_thread(
                    app.store.heartbeat, runs=held, now=app.clock.now(), lease_s=app.lease_s
                )
            except (StoreUnavailable, StoreError) as exc:
                log.warning("worker %s: heartbeat failed: %s", self.worker_id, exc)
                if app.clock.now() - last_ok > app.lease_s:
                    # Our leases have expired by now: stop acting for these runs.
                    for active in list(self._active.values()):
                        self._interrupt(active, "lost")
                continue
            last_ok = app.clock.now()
            for run_id in beat.lost:
                if run_id in self._active:
                    log.warning("worker %s: lease of run %s lost", self.worker_id, run_id)
                    self._interrupt(self._active[run_id], "lost")
            for run_id in beat.cancel:
                if run_id in self._active:
                    self._interrupt(self._active[run_id], "cancel")

    def _interrupt(self, active: _Active, reason: str) -> None:
        if active.control.reason is None:
            active.control.reason = reason  # type: ignore[assignment]
        active.task.cancel()

    async def _drain(self) -> None:
        if not self._active:
            return
        for active in self._active.values():
            active.control.draining = True
        tasks = [a.task for a in self._active.values()]
        _, pending = await asyncio.wait(tasks, timeout=self.shutdown_grace_s)
        for active in list(self._active.values()):
            if active.task in pending:
                self._interrupt(active, "shutdown")
        if pending:
            await asyncio.wait(pending)
