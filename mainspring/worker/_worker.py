"""The worker: claims runnable runs, executes many at once, keeps their leases.

One asyncio loop runs up to ``concurrency`` runs. A heartbeat thread extends the
leases of the runs it holds; a run whose lease is gone (another worker took it
over) or that was asked to cancel is stopped at once. On SIGTERM/SIGINT the worker
drains: each run finishes the step it is in and is given back, so no run is lost
and none waits for a lease to expire.

A run recovered twice in a row without progress (its worker died twice while it was
in hand) is a *suspect*: the worker takes it only when it holds nothing else, and
takes nothing else until the suspect makes progress. If the suspect's step is what
kills workers (a native crash, an out-of-memory kill), only its own count of
recoveries grows, and it is dead-lettered without taking its neighbours with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from .._clock import SystemClock
from .._describe import safe_traceback
from .._errors import ConfigError, StoreError, StoreUnavailable
from ..journal import BatchCommitter, Committer, Engine, Execution, Outcome, RunControl, execute
from ..storage import DatabaseGone, Heartbeat, RunRecord, WorkerBeat
from ._heartbeat import Beater
from ._host import WorkerHost
from ._kept import Kept
from ._offload import Offload
from ._outcomes import outcome_fields
from ._refusals import Refusals
from ._upkeep import WalWatch

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("mainspring.worker")

_SCHEDULE_TICK_S = 1.0  # how often a worker fires due schedules (seconds of the App's clock)
# Outcomes logged as warnings: a run failed, left to recovery, or taken from this
# worker (its lease lost, or a write refused) while it still held it.
_WARNED = ("failed", "abandoned", "lost")


@dataclass
class WorkerStats:
    """Counts of how runs left this worker."""

    claimed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    # claims that resumed a kept execution instead of replaying (sticky executions)
    resumed: int = 0


@dataclass
class _Active:
    run: RunRecord
    task: asyncio.Task[Outcome]
    control: RunControl


class Worker:
    """Executes runs of an :class:`~mainspring.App`'s workflows.

    Args:
        app: whose workflows and store to use (any :class:`WorkerHost`).
        concurrency: how many runs may execute at once.
        worker_id: a name for leases and logs (host, pid and a random suffix by default).
        batch: share commits between runs (group commit); off, every run commits alone.
        shutdown_grace_s: on stop, how long runs may take to reach a step boundary
            before they are interrupted (and replayed elsewhere).
        sticky: keep the live execution of each run that suspends here, and resume it
            instead of replaying the run from the top when this worker claims it
            again with nothing else having happened to it (docs/workflows.md,
            "Sticky executions"). ``False``: every wake-up replays.
        sticky_runs: at most this many kept executions (the least recently
            suspended are dropped first, and replay when they wake).
        sticky_bytes: a rough bound on the memory they take (journal rows and a
            fixed cost each; what the workflow's own variables hold is not counted).
        versions: the code versions of the runs this worker claims (a run's version
            is the submitting App's ``version``): a list of versions, ``None`` in it
            for runs submitted with no version, or ``"any"`` for every run. By default,
            the host's version and ``None`` when the host declares a version, else
            every run. So old and new code drain side by side: each fleet claims its
            own runs (docs/workflows.md, "Changing code under running runs").
        refused_skip_s: a run this worker's code cannot replay (a journal written by
            another deployment's code) is given back, never failed, and this worker
            leaves it to the others for this long (seconds of the App's clock).
    """

    def __init__(
        self,
        app: WorkerHost,
        *,
        concurrency: int = 64,
        worker_id: str | None = None,
        batch: bool = True,
        shutdown_grace_s: float = 30.0,
        sticky: bool = True,
        sticky_runs: int = 256,
        sticky_bytes: int = 256 * 1024 * 1024,
        versions: Sequence[str | None] | Literal["any"] | None = None,
        refused_skip_s: float = 300.0,
        _run_id: str | None = None,
        _return_on_wait: bool = False,
        _offload: Offload | None = None,
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
        self.sticky = sticky
        self._kept = Kept(runs=sticky_runs, bytes=sticky_bytes)
        # What to claim, by code version (None: every run). A worker for one run (app.run)
        # was asked for that run: it takes it whatever its version.
        self.versions = None if _run_id is not None else accepted_versions(app.version, versions)
        self.stats = WorkerStats()
        self._only = _run_id
        self._return_on_wait = _return_on_wait  # app.run: a run waiting for a person
        self._active: dict[str, _Active] = {}
        self._stopping = False
        self._wakeup: asyncio.Event | None = None
        self._beater: Beater | None = None
        self._isolated: _Active | None = None  # a suspect run that has not progressed
        # Runs a push named as runnable (NOTIFY's payload), claimed by id; a sweep (a
        # claim of whatever is runnable) when a push named none, or may have been
        # missed, and at every poll.
        self._named: set[str] = set()
        self._sweep = True
        self._fatal: DatabaseGone | None = None
        self._ticked_at: float | None = None  # the App's clock at the last schedule tick
        # Runs this worker's code could not replay: given back, and skipped a while.
        self.refusals = Refusals(refused_skip_s, self.worker_id)
        # Threads and monotonic time (a simulation puts both on its loop: _offload.py).
        self._offload = _offload or Offload()
        self.wal = WalWatch(self.worker_id, monotonic=self._offload.monotonic)

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

    @property
    def kept(self) -> list[str]:
        """The runs whose suspended execution this worker keeps (sticky), oldest first."""
        return list(self._kept)

    @property
    def db_clock(self) -> bool:
        """Whether leases follow the database's clock (PostgreSQL) rather than this
        process's: when the App runs on the real clock. A fake clock in tests keeps
        leases on its own time."""
        return isinstance(self.app.clock, SystemClock)

    @property
    def isolate_after(self) -> int:
        """Recoveries in a row after which a run is executed alone (see the module)."""
        return max(1, min(2, self.app.max_recoveries))

    async def run(self, *, until_idle: bool = False, idle_horizon_s: float = 5.0) -> None:
        """Work until :meth:`request_stop`.

        Args:
            until_idle: return instead once nothing is runnable, nothing is executing
                and no run sleeps (a timer, a back-off, a rate-limit slot, a wait's
                timeout) until within ``idle_horizon_s`` of now: a run due that soon
                is waited for and executed, so ``await run.result()`` after it returns.
                Runs waiting for a person or a signal with no nearer timeout do not
                hold it.
            idle_horizon_s: see ``until_idle`` (seconds of the App's clock).

        Raises:
            DatabaseGone: the SQLite file was deleted or replaced under the worker;
                it stopped every run without writing anything more.
        """
        app = self.app
        self._wakeup = asyncio.Event()
        if not await self._open_store():
            return
        committer: Committer = (
            BatchCommitter(app.store, app.clock) if self.batch else Committer(app.store, app.clock)
        )
        threads = self._offload.steps()
        engine = app.engine(committer, threads)
        engine.lease_s = app.lease_s
        app.telemetry.worker_load(self.worker_id, 0, self.concurrency)
        loop = asyncio.get_running_loop()
        beater = self._beater = Beater(
            store=app.store,
            clock=app.clock,
            lease_s=app.lease_s,
            every_s=app.heartbeat_s,
            db_clock=self.db_clock,
            worker_id=self.worker_id,
            loop=loop,
            on_beat=self._on_beat,
            on_expired=self._on_expired,
            on_fatal=self._on_fatal,
            on_alive=functools.partial(app.telemetry.worker_alive, self.worker_id),
            registration=WorkerBeat(
                id=self.worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                started_at=app.clock.now(),
                lease_s=app.lease_s,
            ),
            threaded=self._offload.heartbeat_thread,
            monotonic=self._offload.monotonic,
        )
        beater.start()
        ticking = asyncio.create_task(beater.ticking())
        wakeup = self._wakeup

        # Pushed wake-ups (LISTEN/NOTIFY on PostgreSQL); polling remains the fallback.
        def push(run_id: str | None) -> None:
            if run_id is None or len(self._named) >= self.concurrency:
                self._sweep = True
            else:
                self._named.add(run_id)
            wakeup.set()

        def pushed(run_id: str | None = None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop may have closed already
                loop.call_soon_threadsafe(push, run_id)

        stop_listening = app.store.listen(pushed, on_run=pushed)
        try:
            await self._claim_loop(engine, idle_horizon_s if until_idle else None)
        finally:
            if stop_listening is not None:
                await asyncio.to_thread(stop_listening)
            await self._drain()
            self._kept.drop_all()
            ticking.cancel()
            await asyncio.gather(ticking, return_exceptions=True)
            await beater.stop()
            await asyncio.to_thread(self._unregister)
            await committer.close()
            threads.shutdown(wait=False, cancel_futures=True)
            app.telemetry.worker_load(self.worker_id, 0, None)
            await asyncio.to_thread(app.telemetry.flush)
        if self._fatal is not None:
            raise self._fatal

    def _unregister(self) -> None:
        """Mark this worker stopped in the registry (a dead one is never marked)."""
        try:
            self.app.store.worker_stopped(self.worker_id, self.app.clock.now())
        except (StoreUnavailable, StoreError, DatabaseGone) as exc:
            log.warning("worker %s: cannot mark itself stopped: %s", self.worker_id, exc)

    async def _open_store(self) -> bool:
        """Open (and migrate) the store, waiting while it is locked or unreachable: a
        worker started during a backup or a failover waits for it instead of exiting.
        Returns False if asked to stop first."""
        assert self._wakeup is not None
        delay = 0.1
        while not self._stopping:
            try:
                await asyncio.to_thread(lambda: self.app.store)
                return True
            except StoreUnavailable as exc:
                log.warning(
                    "worker %s: cannot open the store yet (%s); retrying in %.1fs",
                    self.worker_id,
                    exc,
                    delay,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), delay)
            delay = min(delay * 2, 5.0)
        return False

    async def _claim_loop(self, engine: Engine, idle_horizon_s: float | None) -> None:
        app = self.app
        assert self._wakeup is not None
        names = list(app.workflows)
        idle_at: list[float] = []  # the clock at the last idle check (until_idle)
        while not self._stopping:
            self._wakeup.clear()
            claims = await self._claims(names)
            if claims is None:
                break  # the database is gone
            claimed, named = claims
            if self._stopping and claimed:
                # Stop was asked while the claim was in flight: give these back at once
                # rather than start them only to release them at their first boundary.
                await self._give_back(claimed)
                break
            if claimed:
                claimed = await self.refusals.hand_back(
                    app.store, app.clock, claimed, self._skipping()
                )
            self._start_claimed(engine, claimed)
            then = self._when_idle(names, idle_horizon_s, idle_at, named, idle=not claimed)
            if then == "stop":
                return
            if then == "again":
                continue
            if self._kept:
                await self._sweep_kept()
            try:
                await asyncio.wait_for(self._wakeup.wait(), self._next_poll_s())
            except TimeoutError:
                self._sweep = True

    async def _claims(self, names: list[str]) -> tuple[list[RunRecord], list[str]] | None:
        """One round's claims, in this order: kept executions, due schedules, a look at
        SQLite's log, then the store; and the runs pushes named. ``None``: the database
        is gone."""
        isolated = self._still_isolated()
        free = self.concurrency - len(self._active)
        claimed: list[RunRecord] = []
        if free > 0 and isolated is None and self._kept and self._only is None:
            claimed = await self._claim_kept(names, free)
            free -= len(claimed)
        if self._only is None:
            await self._tick_schedules()
        if self.wal.due():  # a read transaction left open lets SQLite's log grow
            await asyncio.to_thread(self.wal.look, self.app.store)
        named: list[str] = []
        if free > 0 and isolated is None:
            named = self._take_named(free)
            more = await self._claim_round(names, free, named, first=not claimed)
            if more is None:
                return None
            claimed += more
        return claimed, named

    def _when_idle(
        self,
        names: list[str],
        idle_horizon_s: float | None,
        idle_at: list[float],
        named: list[str],
        *,
        idle: bool,
    ) -> Literal["stop", "again", "wait"]:
        """After a round that started nothing (``idle``) with nothing active: stop (the
        one run is done; nothing is due soon under ``until_idle``), claim again at once,
        or wait for a push or the poll."""
        idle = idle and not self._active
        if self._only is not None:
            return "stop" if idle and self._finished_only() else "wait"
        if idle_horizon_s is None or not idle:
            idle_at.clear()  # busy: the next idle spell starts afresh
            return "wait"
        if named:
            # Only the runs pushes named were tried (one may have been woken again
            # meanwhile): a sweep sees every runnable run before this worker calls
            # itself idle, and it comes at once.
            self._sweep = True
            return "again"
        return "wait" if self._due_soon(names, idle_horizon_s, idle_at) else "stop"

    def _still_isolated(self) -> _Active | None:
        """The run executed alone, until it progresses (or leaves): then not suspect."""
        isolated = self._isolated
        if isolated is not None and (
            isolated.control.progressed or self._active.get(isolated.run.id) is not isolated
        ):
            isolated = self._isolated = None
        return isolated

    async def _claim_round(
        self, names: list[str], free: int, named: list[str], *, first: bool
    ) -> list[RunRecord] | None:
        """One claim from the store (``None``: the database is gone, the worker stops;
        a store that is busy or down claims nothing this round)."""
        try:
            return await asyncio.to_thread(
                self._claim, names, free, named, not self._active and first, self._skipping()
            )
        except DatabaseGone as exc:
            self._on_fatal(exc)
            return None
        except (StoreUnavailable, StoreError) as exc:
            log.warning("worker %s: claim failed: %s", self.worker_id, exc)
            return []

    def _start_claimed(self, engine: Engine, claimed: list[RunRecord]) -> None:
        for record in claimed:
            entry = self._start(engine, record)
            if record.recoveries >= self.isolate_after:
                log.warning(
                    "worker %s: run %s was recovered %d times in a row without progress;"
                    " executing it alone until it progresses",
                    self.worker_id,
                    record.id,
                    record.recoveries,
                )
                self._isolated = entry

    async def _tick_schedules(self) -> None:
        """Fire the due schedules, at most once a second of the App's clock (every
        worker does; the store lets one of them start each due time's run)."""
        now = self.app.clock.now()
        if self._ticked_at is not None and now - self._ticked_at < _SCHEDULE_TICK_S:
            return
        self._ticked_at = now
        try:
            if await asyncio.to_thread(self.app.schedules.tick):
                self._sweep = True  # claim what was just started without waiting a poll
        except (StoreUnavailable, StoreError) as exc:
            log.warning("worker %s: schedule tick failed: %s", self.worker_id, exc)

    def _take_named(self, free: int) -> list[str]:
        """The runs pushes named, to claim by id (up to ``free``); none when this
        claim sweeps: a push named none or may have been missed, the poll came
        round, nothing was named (a slot came free), or the worker runs one run."""
        if self._sweep or self._only is not None or not self._named:
            self._sweep = False
            self._named.clear()  # the sweep takes them, in their turn
            return []
        named = sorted(self._named)[:free]
        self._named.difference_update(named)
        return named

    def _skipping(self) -> list[str]:
        """The runs this worker's code could not replay lately, those it is giving
        back now included (read in the loop's thread, before a claim)."""
        skip = self.refusals.skipping(self.app.clock.now())
        return skip + [r for r, a in self._active.items() if a.control.refused is not None]

    def _claim(
        self, names: list[str], free: int, named: list[str], alone: bool, skip: list[str]
    ) -> list[RunRecord]:
        """Claim exactly the ``named`` runs (each by id), or, for a sweep, up to
        ``free`` of whatever is runnable, in claim order (``alone``: this worker
        executes nothing now; ``skip``: runs not to claim)."""
        app = self.app
        claimed: list[RunRecord] = []
        targets: list[str | None] = list(named) or [self._only]
        if self._only is not None and not named:
            targets += self._descendants(self._only)  # app.run runs its children too
        dead: list[tuple[str, str]] = []
        try:
            for run_id in targets:
                claimed += app.store.claim(
                    worker=self.worker_id,
                    now=app.clock.now(),
                    lease_s=app.lease_s,
                    limit=1 if named else free,
                    workflows=names,
                    max_recoveries=app.max_recoveries,
                    run_id=run_id,
                    isolate_after=self.isolate_after,
                    alone=alone and not claimed,
                    db_clock=self.db_clock,
                    versions=self.versions,
                    dead_lettered=dead,
                    skip=skip,
                )
        finally:
            self._dead_lettered(dead)
        return claimed

    def _dead_lettered(self, dead: list[tuple[str, str]]) -> None:
        for run_id, workflow in dead:
            log.warning(
                "event=dead_letter worker=%s run=%s workflow=%s max_recoveries=%d",
                self.worker_id,
                run_id,
                workflow,
                self.app.max_recoveries,
            )
            self.app.telemetry.run_dead_lettered(workflow)

    # -- sticky executions ------------------------------------------------------------

    def _next_poll_s(self) -> float:
        """Until the next poll: sooner if a kept run is due before it (on the real
        clock), so that this worker claims it at its wake time."""
        wait = self.app.poll_interval_s
        if self._kept and self.db_clock:
            return self._kept.next_wake(self.app.clock.now(), wait)
        return wait

    async def _claim_kept(self, names: list[str], free: int) -> list[RunRecord]:
        """Claim, by id, kept runs whose wake time has come (any worker may claim them
        too: whoever wins, a worker that does not hold the execution replays)."""
        app = self.app
        now = app.clock.now()
        due = self._kept.due(now)
        claimed: list[RunRecord] = []
        dead: list[tuple[str, str]] = []
        for run_id in due[:free]:
            try:
                got = await asyncio.to_thread(
                    app.store.claim,
                    worker=self.worker_id,
                    now=now,
                    lease_s=app.lease_s,
                    limit=1,
                    workflows=names,
                    max_recoveries=app.max_recoveries,
                    run_id=run_id,
                    isolate_after=self.isolate_after,
                    alone=not self._active and not claimed,
                    db_clock=self.db_clock,
                    versions=self.versions,
                    dead_lettered=dead,
                )
            except (StoreUnavailable, StoreError) as exc:
                log.warning("worker %s: claim failed: %s", self.worker_id, exc)
                break
            finally:
                self._dead_lettered(dead)
                dead.clear()
            if not got and (ex := self._kept.get(run_id)) is not None:
                ex.wake_at = None  # taken (or not due by the database): polls find it
            claimed += got
        return claimed

    def _keep(self, ex: Execution) -> None:
        """A run suspended here: keep its live execution (not once stopping)."""
        if self._stopping:
            ex.drop()
        else:
            self._kept.keep(ex)

    async def _sweep_kept(self) -> None:
        """Now and then (every lease), drop the kept executions of runs that moved on
        without this worker (taken over, cancelled, retried, deleted): they could
        never resume, and only hold memory."""
        now = self.app.clock.now()
        if self._kept.swept_at and now - self._kept.swept_at < self.app.lease_s:
            return
        self._kept.swept_at = now
        kept = self._kept.items()

        def read() -> list[str]:
            gone: list[str] = []
            for run_id, ex in kept:
                record = self.app.store.get_run(run_id)
                if record is None or record.epoch != ex.cur.epoch:
                    gone.append(run_id)
            return gone

        try:
            gone = await asyncio.to_thread(read)
        except (StoreUnavailable, StoreError):
            return
        self._kept.drop_gone(kept, gone)

    async def _give_back(self, records: list[RunRecord]) -> None:
        app = self.app
        for record in records:
            try:
                await asyncio.to_thread(app.store.release, record.id, record.epoch, app.clock.now())
            except (StoreUnavailable, StoreError) as exc:  # its lease expires instead
                log.warning(
                    "worker %s: cannot give run %s back: %s", self.worker_id, record.id, exc
                )

    def _finished_only(self) -> bool:
        assert self._only is not None
        if self._only in self.refusals.errors:
            return True  # its code cannot replay it: app.run says so instead of waiting
        record = self.app.store.get_run(self._only)
        if self._return_on_wait and record is not None and record.status == "waiting":
            # app.run says what the run waits for instead of hanging, unless it waits
            # for a child run it can still run itself.
            return not any(
                not r.finished and r.status != "waiting"
                for r in (self.app.store.get_run(c) for c in self._descendants(self._only))
                if r is not None
            )
        return record is None or record.finished

    def _descendants(self, run_id: str) -> list[str]:
        """The unfinished child runs of ``run_id``, and theirs (app.run's family)."""
        found: list[str] = []
        todo = [run_id]
        while todo:
            for r in self.app.store.list_runs(parent=todo.pop(), limit=1000, summary=True):
                if r.parent_kind == "child" and not r.finished:
                    found.append(r.id)
                    todo.append(r.id)
        return found

    def _due_soon(self, names: list[str], horizon_s: float, idle_at: list[float]) -> bool:
        """Whether a sleeping run is due within ``horizon_s`` (or a run waits in a
        queue for a slot) and waiting can reach it.

        ``idle_at`` holds the clock's reading at the previous idle check: a clock that
        did not move over a poll interval (a FakeClock) will not bring a run due by
        itself, so waiting for it would hang.
        """
        now = self.app.clock.now()
        if idle_at and now <= idle_at[0]:
            return False
        idle_at[:] = [now]
        try:
            skip = self.refusals.skipping(now)
            wake = self.app.store.next_wake(names, self.versions, skip=skip)
            if wake is not None and wake <= now + horizon_s:
                return True
            # A run waiting in a queue starts once a slot frees or the rate admits it.
            return self.app.store.queue_backlog(names, self.versions)
        except (StoreUnavailable, StoreError) as exc:
            log.warning("worker %s: reading the next wake-up failed: %s", self.worker_id, exc)
            return True  # try again at the next poll rather than leave a run behind

    def _start(self, engine: Engine, record: RunRecord) -> _Active:
        self.stats.claimed += 1
        # One structured line per event (key=value), at INFO: what an operator greps.
        log.info(
            "event=%s worker=%s run=%s workflow=%s epoch=%d recoveries=%d",
            "takeover" if record.recoveries else "claim",
            self.worker_id,
            record.id,
            record.workflow,
            record.epoch,
            record.recoveries,
        )
        self.app.telemetry.run_claimed(record)
        stale = self._active.get(record.id)
        if stale is not None:
            # Our own lease ran out (a stall longer than the lease) and we claimed the
            # run afresh: the old execution is fenced off already; stop it now.
            self._interrupt(stale, "lost")
        workflow = self.app.workflows[record.workflow]
        control = RunControl(draining=self._stopping, worker=self.worker_id)
        resume = self._kept.take(record.id)
        if resume is not None and resume.fits(record):
            self.stats.resumed += 1
        task = asyncio.create_task(
            execute(
                engine,
                record,
                workflow,
                control,
                keep=self._keep if self.sticky else None,
                resume=resume,
            ),
            name=f"mainspring-run-{record.id}",
        )
        entry = self._active[record.id] = _Active(record, task, control)
        if self._beater is not None:
            self._beater.hold(record.id, record.epoch)
        self._set_solo(engine)

        task.add_done_callback(functools.partial(self._left, engine, entry))
        return entry

    def _left(self, engine: Engine, entry: _Active, task: asyncio.Task[Outcome]) -> None:
        """A run's task ended: free its slot first, then count and log how it left, and
        wake the loop to fill the slot."""
        record, control = entry.run, entry.control
        run_id = record.id
        if self._active.get(run_id) is entry:  # not a newer claim of the same run
            del self._active[run_id]
        if self._beater is not None:
            self._beater.drop(run_id, record.epoch)
            self.app.telemetry.run_released(run_id)
        self._set_solo(engine)
        if task.cancelled():
            outcome = "lost"
        elif (exc := task.exception()) is not None:  # execute() catches all; just in case
            log.error("run %s: executor crashed\n%s", run_id, safe_traceback(exc))
            outcome = "abandoned"
        else:
            outcome = task.result()
        self.stats.outcomes[outcome] = self.stats.outcomes.get(outcome, 0) + 1
        if outcome == "refused" and control.refused is not None:
            clock = self.app.clock
            self.refusals.tell(record, control.refused, clock.now(), self.app.telemetry)
        elif log.isEnabledFor(logging.INFO) or outcome in _WARNED:
            self._log_outcome(run_id, outcome)
        if self._wakeup is not None:
            self._wakeup.set()

    def _log_outcome(self, run_id: str, outcome: str) -> None:
        fields = outcome_fields(self.app.store, self.worker_id, run_id, outcome)
        (log.warning if outcome in _WARNED else log.info)("%s", fields)

    def _set_solo(self, engine: Engine) -> None:
        self.app.telemetry.worker_load(self.worker_id, len(self._active), self.concurrency)
        engine.committer.solo = len(self._active) <= 1

    def _on_beat(self, beat: Heartbeat, held: dict[str, int]) -> None:
        for run_id in beat.lost:
            active = self._active.get(run_id)
            if active is not None and active.run.epoch == held.get(run_id):
                if active.control.committing or active.task.done():
                    # The beat raced the commit of how the run leaves (it read the
                    # run suspended or finished by that commit): the commit, fenced,
                    # says whether the lease held.
                    continue
                log.warning("worker %s: lease of run %s lost", self.worker_id, run_id)
                self._interrupt(active, "lost")
        for run_id in beat.cancel:
            active = self._active.get(run_id)
            if active is not None and active.run.epoch == held.get(run_id):
                self._interrupt(active, "cancel")

    def _on_expired(self) -> None:
        # Heartbeats failed for a whole lease: the leases are gone by now.
        for active in list(self._active.values()):
            self._interrupt(active, "lost")

    def _on_fatal(self, exc: DatabaseGone) -> None:
        if self._fatal is not None:
            return
        log.error("worker %s: %s", self.worker_id, exc)
        self._fatal = exc
        self._stopping = True
        # Nothing written now would reach the database: stop every run where it is.
        for active in list(self._active.values()):
            self._interrupt(active, "lost")
        if self._wakeup is not None:
            self._wakeup.set()

    def _interrupt(self, active: _Active, reason: str) -> None:
        control = active.control
        if control.reason is None:
            control.reason = reason  # type: ignore[assignment]
        if reason == "cancel" and control.committing:
            # Committing how it leaves: interrupted there, it would leave the run
            # running with nobody holding it (see RunControl.committing).
            return
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


def accepted_versions(
    declared: str | None, versions: Sequence[str | None] | Literal["any"] | None
) -> tuple[str | None, ...] | None:
    """The code versions a worker claims (``None``: every one), from its ``versions``
    argument and its host's declared version."""
    if versions is None:
        return None if declared is None else (declared, None)
    if versions == "any":
        return None
    if isinstance(versions, str) or not all(v is None or isinstance(v, str) for v in versions):
        raise ConfigError(
            f"versions={versions!r}: expected a list of versions (None in it for runs "
            "with no version) or 'any'"
        )
    return tuple(dict.fromkeys(versions))
