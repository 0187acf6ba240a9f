"""One simulated run of the whole system: N workers, one store, one seed.

Each simulated worker process is a real :class:`~mainspring.worker.Worker` of its own
:class:`~mainspring.App` (its own store connection, through a
:class:`~mainspring.testing.FaultyStore`) over one SQLite file, on one
:class:`SimLoop`. The outside world (a client App) submits the workload's runs and acts
on them at random moments. Faults come from the seed (:class:`FaultMix`). At the end
the engine's invariants (:func:`~mainspring.testing.check_invariants`, with the
effect ledger) and the workload's own check are the oracles.

Everything random is drawn from ``random.Random(seed)`` in one thread, in an order
the seed fixes, so a seed replays the same interleaving, faults and result: the
trace (:attr:`SimResult.trace`) is the same byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import os
import random
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import App
from ..journal import InlineExecutor
from ..storage import SQLiteStore, StepRecord
from ..worker import Offload, Worker
from ._faults import FaultyStore
from ._invariants import StoreHistory, check_invariants
from ._ledger import EffectLedger
from ._sim_faults import FaultMix, store_faults
from ._sim_loop import OWNER, SimLoop, SimStalled

if TYPE_CHECKING:
    from ._sim_workloads import Workload

__all__ = ["SimClock", "SimResult", "simulate"]

_EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: virtual time 0
LEASE_S = 10.0


class SimClock:
    """The App clock of a simulated process: the loop's virtual time, plus the
    process's skew."""

    def __init__(self, loop: SimLoop, skew: float = 0.0) -> None:
        self._loop = loop
        self.skew = skew

    def now(self) -> float:
        return _EPOCH + self._loop.time() + self.skew

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """What one simulated run did.

    Attributes:
        seed: the seed that replays it.
        workload: its workload's name.
        trace: every fault, outside action and outcome, in order, with the virtual
            time, and a digest of every scheduling decision: equal seeds give equal
            traces, byte for byte.
        violations: what the oracles found (empty: the run passed).
        steps: journal rows completed (the simulated steps).
        turns: callbacks the loop ran.
        virtual_s: virtual seconds simulated.
        cpu_s: CPU seconds it took.
        command: the one line that replays it.
    """

    seed: int
    workload: str
    trace: tuple[str, ...]
    violations: tuple[str, ...]
    steps: int
    turns: int
    virtual_s: float
    cpu_s: float
    command: str

    @property
    def ok(self) -> bool:
        return not self.violations

    def text(self) -> str:
        return "\n".join(self.trace)


@dataclass
class _Process:
    owner: int
    app: App
    worker: Worker
    task: asyncio.Task[None]
    dead: bool = False


@dataclass
class _Sim:
    seed: int
    workload: Workload
    workers: int
    mix: FaultMix
    root: Path
    loop: SimLoop
    rng: random.Random
    ledger: EffectLedger
    history: StoreHistory
    inner: SQLiteStore
    client: App
    trace: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    rows: _Completed = field(default_factory=lambda: _Completed())
    procs: dict[int, _Process] = field(default_factory=dict)
    next_owner: int = 0
    stopping: bool = False  # the end: no process starts any more
    alive_target: int = 0

    def note(self, what: str) -> None:
        self.trace.append(f"{self.loop.time():12.6f} {what}")

    # -- processes --------------------------------------------------------------------

    def start_worker(self) -> None:
        owner = self.next_owner
        self.next_owner += 1
        proc_rng = random.Random(self.rng.getrandbits(64))
        holder: list[_Process] = []
        faulty = FaultyStore(
            SQLiteStore(self.inner.path, synchronous="OFF", migrate=False),
            store_faults(
                self.mix,
                self.rng,
                dead=lambda: bool(holder) and holder[0].dead,
                note=lambda what: self.note(f"w{owner} store {what}"),
            ),
            after_call=self.captured,
        )
        skew = self.rng.uniform(-self.mix.skew, self.mix.skew) if self.mix.skew else 0.0
        app = self.app(faulty, SimClock(self.loop, skew), proc_rng)
        worker = Worker(
            app,
            worker_id=f"w{owner}",
            batch=False,
            concurrency=8,
            shutdown_grace_s=LEASE_S / 2,
            _offload=Offload(
                steps=InlineExecutor, heartbeat_thread=False, monotonic=self.loop.time
            ),
        )
        ctx = contextvars.copy_context()
        ctx.run(OWNER.set, owner)
        task = self.loop.create_task(worker.run(), context=ctx)
        proc = _Process(owner, app, worker, task)
        holder.append(proc)
        self.procs[owner] = proc
        self.note(f"w{owner} start" + (f" skew {skew:+.3f}s" if skew else ""))

    def captured(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
    ) -> None:
        """After a store call: watch the journal rows each landed commit wrote (a
        completed row must never change), and remember each run a commit finished (a
        finished run must never change: the end's capture compares). Reading only what
        a commit wrote keeps the watch linear in the run's length."""
        if method != "commit":
            return
        batch = kwargs.get("batch", args[0] if args else [])
        finished = set()
        for write, landed in zip(batch, result, strict=True):
            if not landed.ok or landed.already:
                continue
            self.violations += self.rows.written(write.steps)
            if write.transition is not None and write.transition.kind == "finish":
                finished.add(write.run_id)
        if finished:
            self.history.capture(self.inner, finished)

    def app(self, store: FaultyStore | SQLiteStore, clock: SimClock, rng: random.Random) -> App:
        app = App(
            store,
            clock=clock,
            rng=rng,
            lease_s=LEASE_S,
            max_recoveries=self.workload.max_recoveries,
            poll_interval_s=1.0,
            rate_limits=False,
        )
        self.workload.register(app, self.ledger, self.mix)
        return app

    def on_turn(self, owner: int) -> bool:
        """A fault at this await point of process ``owner``, perhaps."""
        mix = self.mix
        if not (mix.crash or mix.freeze):
            return True
        draw = self.rng.random()
        if draw < mix.crash:
            self.kill(owner)
            return False
        if draw < mix.crash + mix.freeze:
            pause = self.rng.uniform(0.5, 3.0) * LEASE_S
            self.note(f"w{owner} freeze {pause:.3f}s")
            self.loop.freeze(owner, self.loop.time() + pause)
            return False
        return True

    def kill(self, owner: int) -> None:
        proc = self.procs[owner]
        proc.dead = True
        self.loop.kill(owner)
        self.note(f"w{owner} crash")
        # Another process starts after a while (the orchestrator's restart).
        self.loop.call_later(self.rng.uniform(0.5, 2.0) * LEASE_S, self.restart)

    def restart(self) -> None:
        if not self.stopping and len(self.alive()) < self.alive_target:
            self.start_worker()

    def alive(self) -> list[_Process]:
        return [p for p in self.procs.values() if not p.dead]


class _Completed:
    """Completed journal rows as their commits wrote them: a later write that changes
    one (its kind, name, attempt or output) is a violation."""

    def __init__(self) -> None:
        self._fixed: dict[tuple[str, int, int], tuple[Any, ...]] = {}

    def written(self, steps: list[StepRecord]) -> list[str]:
        found = []
        for row in steps:
            where = (row.run_id, row.session, row.seq)
            was = self._fixed.get(where)
            now = (row.kind, row.name, row.status, row.attempt, row.output)
            if was is not None and was != now:
                found.append(
                    f"[completed_row_changed] run {row.run_id}: completed row "
                    f"{row.session}:{row.seq} was {was!r}, a commit wrote {now!r}"
                )
            elif was is None and row.status == "completed":
                self._fixed[where] = now
        return found

    def missing(self, store: SQLiteStore) -> list[str]:
        """Completed rows the store no longer holds as written (at the end)."""
        with contextlib.closing(sqlite3.connect(store.path)) as conn:
            rows = conn.execute(
                "SELECT run_id, session, seq, kind, name, status, attempt, output FROM ms_steps"
            ).fetchall()
        present = {(r[0], r[1], r[2]): tuple(r[3:]) for r in rows}
        runs = {r[0] for r in rows}  # a run deleted whole (pruned) took its rows legitimately
        return [
            f"[completed_row_changed] run {where[0]}: completed row {where[1]}:{where[2]} "
            f"was {fixed!r}, is {present.get(where)!r} at the end"
            for where, fixed in self._fixed.items()
            if present.get(where) != fixed and where[0] in runs
        ]


async def _drive(sim: _Sim, max_virtual_s: float) -> list[str]:
    """Start the workers, submit the workload, act from outside until every run has
    ended (or the time is up), stop the workers; what was left unfinished."""
    loop, rng, mix = sim.loop, sim.rng, sim.mix
    sim.alive_target = sim.workers
    for _ in range(sim.workers):
        sim.start_worker()
    runs = sim.workload.submit(sim.client, rng)
    sim.note(f"submitted {len(runs)}")
    next_action = loop.time() + (rng.expovariate(1 / mix.outside) if mix.outside else 1e18)
    left = list(runs)
    while True:
        await asyncio.sleep(1.0)
        left = [r for r in left if not sim.client.get_run(r).finished]
        if not left or loop.time() > max_virtual_s:
            break
        next_action = _outside(sim, runs, next_action)
    await _stop_workers(sim)
    return left


def _outside(sim: _Sim, runs: list[str], next_action: float) -> float:
    """The outside world's second: a clock jump perhaps, and the actions now due;
    when the next one is."""
    loop, rng, mix = sim.loop, sim.rng, sim.mix
    if mix.clock_jump and rng.random() < mix.clock_jump:
        jump = rng.uniform(1.0, 2.0) * LEASE_S
        sim.note(f"clock jump {jump:.3f}s")
        loop.jump(jump)
    while loop.time() >= next_action:
        did = sim.workload.act(sim.client, rng, runs)
        if did is not None:
            sim.note(f"outside {did}")
        next_action += rng.expovariate(1 / mix.outside)
    return next_action


async def _stop_workers(sim: _Sim) -> None:
    """Ask every live worker to stop and wait for it: one that ended with an error
    (rather than being killed on purpose) is a violation. A frozen one thaws first:
    the wait covers the longest freeze and a drain."""
    sim.stopping = True
    for proc in sim.alive():
        proc.worker.request_stop()
    alive = [p.task for p in sim.alive()]
    if alive:
        await asyncio.wait(alive, timeout=5 * LEASE_S)
    for proc in sim.alive():
        if not proc.task.done():
            sim.violations.append(f"[worker] w{proc.owner} did not stop when asked")
        elif not proc.task.cancelled() and (error := proc.task.exception()) is not None:
            sim.violations.append(f"[worker] w{proc.owner} ended with {error!r}")


def simulate(
    workload: Workload,
    *,
    seed: int,
    workers: int = 3,
    faults: FaultMix | None = None,
    max_virtual_s: float = 6 * 3600.0,
    directory: str | os.PathLike[str] | None = None,
) -> SimResult:
    """Run ``workload`` once under the simulator with ``seed``; see the module.

    Args:
        workload: what to run and how to check it (:mod:`mainspring.testing.sim`
            has ready ones).
        seed: everything random is drawn from it.
        workers: simulated worker processes (a crashed one is replaced).
        faults: what goes wrong, and how often (:class:`FaultMix`); the default mix
            when None.
        max_virtual_s: a run not ended by then is a violation (stuck).
        directory: where the SQLite files go (a fresh temporary directory, in
            ``/dev/shm`` when there is one, by default; removed afterwards).
    """
    mix = faults or FaultMix()
    started = time.process_time()
    root = Path(tempfile.mkdtemp(prefix="mainspring-sim-", dir=directory or _fast_dir()))
    rng = random.Random(seed)
    loop = SimLoop(random.Random(rng.getrandbits(64)))
    inner = SQLiteStore(root / "sim.db", synchronous="OFF")
    ledger = EffectLedger(root / "ledger.db")
    history = StoreHistory()
    sim = _Sim(
        seed=seed,
        workload=workload,
        workers=workers,
        mix=mix,
        root=root,
        loop=loop,
        rng=rng,
        ledger=ledger,
        history=history,
        inner=inner,
        client=None,  # type: ignore[arg-type]  # set below: it needs the sim's clock
    )
    sim.client = sim.app(
        SQLiteStore(inner.path, synchronous="OFF", migrate=False), SimClock(loop), rng
    )
    loop.on_turn = sim.on_turn
    violations: list[str] = []
    try:
        with _seeded_ids(rng), _quiet():
            try:
                left = loop.run_until_complete(_drive(sim, max_virtual_s))
            except SimStalled as exc:
                left, violations = [], [f"[stalled] {exc}"]
            loop.bury()
        now = SimClock(loop).now()
        for v in check_invariants(
            inner,
            history=history,
            ledger=ledger,
            at_most_once_effects=workload.at_most_once_effects,
            now=now,
        ):
            violations.append(str(v))
        violations += sim.violations + sim.rows.missing(inner)
        violations += [f"[stuck] run {r}: not ended after {max_virtual_s:.0f}s" for r in left]
        violations += workload.check(sim.client, ledger)
        steps = _completed_steps(inner)
        trace = _summary(sim, violations, steps)
    finally:
        for owner in sim.procs:  # whatever is left of them goes without a word
            loop.kill(owner)
        loop.bury()
        loop.close()
        ledger.close()
        inner.close()
        for proc in sim.procs.values():
            proc.app.store.close()
        sim.client.store.close()
        shutil.rmtree(root, ignore_errors=True)
    return SimResult(
        seed=seed,
        workload=workload.name,
        trace=tuple(trace),
        violations=tuple(violations),
        steps=steps,
        turns=loop.turns,
        virtual_s=loop.time(),
        cpu_s=time.process_time() - started,
        command=replay_command(seed, workload.name, workers, mix),
    )


def replay_command(seed: int, workload: str, workers: int, mix: FaultMix) -> str:
    """The one line that replays a simulated run (the CLI knows two fault mixes, the
    default and none: a run under another mix is replayed by calling
    :func:`simulate` with the same arguments)."""
    line = f"mainspring lab sim --seed {seed} --runs 1 --workload {workload} --workers {workers}"
    if mix == FaultMix.none():
        return line + " --no-faults"
    if mix != FaultMix():
        return f"simulate({workload!r} workload, seed={seed}, workers={workers}, faults={mix!r})"
    return line


def _summary(sim: _Sim, violations: list[str], steps: int) -> list[str]:
    trace = list(sim.trace)
    digest = hashlib.sha256(bytes(sim.loop.decisions)).hexdigest()[:16]
    trace.append(f"turns {sim.loop.turns} decisions {digest}")
    for record in sorted(sim.inner.list_runs(limit=100_000, summary=True), key=lambda r: r.id):
        trace.append(f"run {record.id} {record.status} epoch={record.epoch}")
    trace.append(f"steps {steps}")
    trace += [f"violation {v}" for v in violations]
    return trace


def _completed_steps(store: SQLiteStore) -> int:
    with contextlib.closing(sqlite3.connect(store.path)) as conn:
        row = conn.execute("SELECT COUNT(*) FROM ms_steps WHERE status = 'completed'").fetchone()
    return int(row[0])


def _fast_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@contextlib.contextmanager
def _seeded_ids(rng: random.Random) -> Iterator[None]:
    """Run ids (``uuid.uuid4``) drawn from the seed for the simulation's length: the
    operating system's randomness is the one input a seed cannot otherwise fix."""
    real = uuid.uuid4
    uuid.uuid4 = lambda: uuid.UUID(int=rng.getrandbits(128), version=4)
    try:
        yield
    finally:
        uuid.uuid4 = real


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The workers' warnings (a lease lost, a busy store) are the faults working, not
    news: the trace tells them."""
    logger = logging.getLogger("mainspring")
    level, logger.level = logger.level, logging.CRITICAL + 1
    try:
        yield
    finally:
        logger.setLevel(level)
