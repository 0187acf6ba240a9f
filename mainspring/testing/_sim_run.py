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
from typing import TYPE_CHECKING

from .. import App
from ..journal import InlineExecutor
from ..storage import SQLiteStore
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
    procs: dict[int, _Process] = field(default_factory=dict)
    next_owner: int = 0
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
            after_call=self.history.after_commit(self.inner),
        )
        app = self.app(faulty, SimClock(self.loop), proc_rng)
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
        self.note(f"w{owner} start")

    def app(self, store: FaultyStore | SQLiteStore, clock: SimClock, rng: random.Random) -> App:
        app = App(
            store,
            clock=clock,
            rng=rng,
            lease_s=LEASE_S,
            poll_interval_s=0.5,
            rate_limits=False,
        )
        self.workload.register(app, self.ledger)
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
        if len(self.alive()) < self.alive_target:
            self.start_worker()

    def alive(self) -> list[_Process]:
        return [p for p in self.procs.values() if not p.dead]


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
    while True:
        await asyncio.sleep(1.0)
        left = [r for r in runs if not sim.client.get_run(r).finished]
        if not left or loop.time() > max_virtual_s:
            break
        if mix.clock_jump and rng.random() < mix.clock_jump:
            jump = rng.uniform(1.0, 2.0) * LEASE_S
            sim.note(f"clock jump {jump:.3f}s")
            loop.jump(jump)
        while loop.time() >= next_action:
            sim.note(f"outside {sim.workload.act(sim.client, rng, runs)}")
            next_action += rng.expovariate(1 / mix.outside)
    for proc in sim.alive():
        proc.worker.request_stop()
    alive = [p.task for p in sim.alive()]
    if alive:
        await asyncio.wait(alive, timeout=3 * LEASE_S)
    for proc in sim.alive():
        if proc.task.done() and not proc.task.cancelled() and proc.task.exception() is not None:
            sim.note(f"w{proc.owner} ended with {type(proc.task.exception()).__name__}")
    return left


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
    """The one line that replays a simulated run."""
    default = " " if mix == FaultMix() else " --no-faults " if mix == FaultMix.none() else " "
    extra = "" if mix in (FaultMix(), FaultMix.none()) else " (with a custom fault mix)"
    return (
        f"PYTHONHASHSEED=0 mainspring lab sim --seed {seed} --runs 1 --workload {workload} "
        f"--workers {workers}{default.rstrip()}{extra}"
    )


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
