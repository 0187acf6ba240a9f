"""Chaos mode: real worker processes, SIGKILLed at random, then an audit.

The harness submits runs of :mod:`._chaos_app`'s workflow, keeps a few
``mainspring worker`` processes busy on them, and kills one with SIGKILL at random
moments (starting a replacement each time). When every kill is done it lets the
survivors finish and audits what happened instead of trusting the workers:

* lost runs: runs that did not end ``succeeded``;
* duplicated effects: idempotency keys whose effect took place more than once in the
  :class:`~mainspring.testing.EffectLedger`, and ``at_most_once`` steps called twice;
* journal consistency: each run's journal is one row per position, every row ended,
  every completed write applied exactly once, and the result adds up;
* the engine's invariants (:func:`mainspring.testing.check_invariants`), with the
  journal captured after every kill so that a completed row or a finished run that
  changed later is caught too.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import ConfigError
from ..storage import Store, open_store
from ..testing import EffectLedger, StoreHistory, check_invariants
from ._chaos_app import WORKFLOW, build_app

__all__ = ["ChaosResult", "run_chaos"]

_APP_SPEC = "mainspring.lab._chaos_app:app"


@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosResult:
    """What a chaos run did and what the audit found.

    Attributes:
        kills: SIGKILLs sent; ``kills_mid_run`` of them hit a worker holding a run.
        runs / succeeded / lost: runs submitted, finished ``succeeded``, and not.
        steps: journal rows audited; ``reexecuted_steps`` ran more than one attempt.
        duplicate_effects: keys whose effect happened more than once (always a bug).
        duplicate_calls: keys called more than once but applied once (deduplicated
            re-executions: the idempotency key at work).
        interrupted_at_most_once: ``at_most_once`` steps a kill interrupted (they
            raise ``StepInterrupted`` and are not re-run).
        journal_problems: inconsistencies found (empty when the journal is whole).
        wall_s: seconds the chaos phase and the drain took.
    """

    store: str
    kills: int
    kills_mid_run: int
    runs: int
    succeeded: int
    lost: int
    steps: int
    reexecuted_steps: int
    duplicate_effects: int
    duplicate_calls: int
    interrupted_at_most_once: int
    journal_problems: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicate_effects == 0 and not self.journal_problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


class _Workers:
    def __init__(self, env: dict[str, str], logs: Path, concurrency: int) -> None:
        self.env, self.logs, self.concurrency = env, logs, concurrency
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        with open(self.logs / f"worker-{self.started}.log", "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mainspring",
                    "worker",
                    _APP_SPEC,
                    "--concurrency",
                    str(self.concurrency),
                    *extra,
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.started += 1
        self.procs.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)


def run_chaos(
    *,
    url: str | None = None,
    runs: int = 20,
    steps: int = 40,
    kills: int = 20,
    workers: int = 2,
    seed: int = 0,
    lease_s: float = 1.0,
    step_s: float = 0.005,
    kill_every_s: tuple[float, float] = (0.3, 0.9),
    drain_timeout_s: float = 300.0,
    workdir: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ChaosResult:
    """Kill ``kills`` workers at random while ``runs`` runs of ``steps`` steps execute.

    Args:
        url: the store (``sqlite:///...`` or ``postgresql://...``); a temporary SQLite
            file when None. Only the runs this call submits are audited.
        workers: worker processes kept alive at once.
        kill_every_s: the random pause between two kills, in seconds.
        workdir: where the ledger, the SQLite file and the worker logs go (a
            temporary directory when None).
        progress: called with ``(kills done, kills)`` after each kill.

    Raises:
        ConfigError: a bad count, or the runs did not finish within ``drain_timeout_s``
            after the last kill.
    """
    if runs < 1 or steps < 1 or kills < 0 or workers < 1:
        raise ConfigError(
            f"chaos needs runs, steps and workers >= 1 and kills >= 0; got runs={runs!r}, "
            f"steps={steps!r}, workers={workers!r}, kills={kills!r}"
        )
    with tempfile.TemporaryDirectory(prefix="mainspring-chaos-") as tmp:
        where = Path(workdir) if workdir is not None else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        return _chaos(
            url or f"sqlite:///{where / 'chaos.db'}",
            where,
            runs=runs,
            steps=steps,
            kills=kills,
            workers=workers,
            rng=random.Random(seed),
            lease_s=lease_s,
            step_s=step_s,
            kill_every_s=kill_every_s,
            drain_timeout_s=drain_timeout_s,
            progress=progress,
        )


def _chaos(
    url: str,
    where: Path,
    *,
    runs: int,
    steps: int,
    kills: int,
    workers: int,
    rng: random.Random,
    lease_s: float,
    step_s: float,
    kill_every_s: tuple[float, float],
    drain_timeout_s: float,
    progress: Callable[[int, int], None] | None,
) -> ChaosResult:
    ledger_path = where / f"ledger-{uuid.uuid4().hex[:8]}.db"
    env = {
        **os.environ,
        "MAINSPRING_DATABASE_URL": url,
        "MAINSPRING_LAB_LEDGER": str(ledger_path),
        "MAINSPRING_LAB_LEASE_S": str(lease_s),
        "MAINSPRING_LAB_STEP_S": str(step_s),
    }
    app = build_app(url)
    batch = uuid.uuid4().hex[:8]
    try:
        ids = [app.submit(WORKFLOW, steps, key=f"chaos-{batch}-{i}").run_id for i in range(runs)]
    finally:
        app.close()
    store = open_store(url)
    history = StoreHistory()
    pool = _Workers(env, where, concurrency=max(4, runs // workers + 1))
    started = time.monotonic()
    mid_run = 0
    try:
        for _ in range(workers):
            pool.start()
        ready = time.monotonic() + 60
        while not _running_owners(store, ids) and time.monotonic() < ready:
            time.sleep(0.05)  # the first workers are importing; a kill now tests nothing
        for done in range(1, kills + 1):
            time.sleep(rng.uniform(*kill_every_s))
            alive = pool.alive()
            if not alive:
                pool.start()
                continue
            # A random moment, and a worker holding runs when there is one: killing a
            # worker still importing would test nothing.
            owners = _running_owners(store, ids)
            holders = [p for p in alive if any(f":{p.pid}:" in o for o in owners)]
            victim = rng.choice(holders or alive)
            victim.send_signal(signal.SIGKILL)
            victim.wait(30)
            mid_run += bool(holders)
            history.capture(store, ids)  # what is completed now must never change
            pool.start()  # a replacement, as a supervisor would
            if progress is not None:
                progress(done, kills)
        deadline = time.monotonic() + drain_timeout_s
        while not _all_finished(store, ids):
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"chaos: the runs did not finish within {drain_timeout_s}s after the "
                    f"last kill; worker logs are in {where}"
                )
            if not pool.alive():
                pool.start()
            time.sleep(0.1)
        wall = time.monotonic() - started
    finally:
        pool.stop_all()
    try:
        return _audit(store, url, ids, steps, ledger_path, kills, mid_run, wall, history)
    finally:
        store.close()


def _running_owners(store: Store, ids: list[str]) -> list[str]:
    wanted = set(ids)
    return [
        r.owner
        for r in store.list_runs(statuses=["running"], limit=len(ids) * 4)
        if r.id in wanted and r.owner is not None
    ]


def _all_finished(store: Store, ids: list[str]) -> bool:
    for run_id in ids:
        record = store.get_run(run_id)
        if record is None or not record.finished:
            return False
    return True


def _audit(
    store: Store,
    url: str,
    ids: list[str],
    steps: int,
    ledger_path: Path,
    kills: int,
    mid_run: int,
    wall: float,
    history: StoreHistory,
) -> ChaosResult:
    ledger = EffectLedger(ledger_path)
    report = ledger.report()
    # The invariants every fault test checks: at most once, effects once, signals
    # once, completed rows and finished runs unchanged since the captures above.
    problems = [
        str(v)
        for v in check_invariants(
            store, history=history, ledger=ledger, at_most_once_effects={"launch"}, run_ids=ids
        )
    ]
    succeeded = rows_seen = reexecuted = interrupted = 0
    expected_paid = sum(i for i in range(steps) if i % 10 != 9)
    for run_id in ids:
        record = store.get_run(run_id)
        if record is None or record.status != "succeeded":
            continue
        succeeded += 1
        rows = store.load_steps(run_id)
        rows_seen += len(rows)
        if [r.seq for r in rows] != list(range(steps)):
            problems.append(f"run {run_id}: journal positions {[r.seq for r in rows]!r}")
        for row in rows:
            key = f"{run_id}:{row.session}:{row.seq}"
            reexecuted += row.attempt > 1
            if row.name.endswith("launch"):  # called at most once: an invariant above
                if row.status == "failed":
                    interrupted += 1
                elif row.status != "completed":
                    problems.append(f"step {key} ended {row.status!r}")
            elif row.status != "completed" or ledger.applied(key) != 1:
                problems.append(
                    f"step {key} is {row.status!r} with its effect applied {ledger.applied(key)}×"
                )
        result = json.loads(record.output or "{}")
        if result.get("paid") != expected_paid:
            problems.append(f"run {run_id}: paid {result.get('paid')!r}, expected {expected_paid}")
    ledger.close()
    return ChaosResult(
        store=url.split(":", 1)[0],
        kills=kills,
        kills_mid_run=mid_run,
        runs=len(ids),
        succeeded=succeeded,
        lost=len(ids) - succeeded,
        steps=rows_seen,
        reexecuted_steps=reexecuted,
        duplicate_effects=len(report.duplicate_effects),
        duplicate_calls=len(report.duplicate_calls),
        interrupted_at_most_once=interrupted,
        journal_problems=problems,
        wall_s=round(wall, 2),
    )
