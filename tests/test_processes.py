"""Real worker processes, killed with SIGKILL and frozen with SIGSTOP."""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mainspring.storage import SQLiteStore
from mainspring.testing import EffectLedger

ROOT = Path(__file__).resolve().parent


class Cluster:
    """Starts `mainspring worker tests.apps.chaos_app:app` processes on one database."""

    def __init__(self, tmp: Path, lease_s: float, step_s: float) -> None:
        self.db = tmp / "chaos.db"
        self.ledger_path = tmp / "ledger.db"
        self.lease_s = lease_s
        self.env = {
            **os.environ,
            "MAINSPRING_DATABASE_URL": f"sqlite:///{self.db}",
            "MAINSPRING_TEST_LEDGER": str(self.ledger_path),
            "MAINSPRING_TEST_LEASE_S": str(lease_s),
            "MAINSPRING_TEST_STEP_S": str(step_s),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = tmp

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        with open(self.logs / f"worker-{len(self.procs)}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mainspring", "worker", "apps.chaos_app:app", *extra],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.logs / f"worker-{self.procs.index(proc)}.log").read_text()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, lease_s=1.0, step_s=0.002)
    yield c
    c.stop_all()


def _submit(cluster: Cluster, workflow: str, runs: int, steps: int) -> list[str]:
    # The same module the workers load, pointed at this test's files.
    for name in ("MAINSPRING_DATABASE_URL", "MAINSPRING_TEST_LEDGER", "MAINSPRING_TEST_LEASE_S"):
        os.environ[name] = cluster.env[name]
    import apps.chaos_app

    app = importlib.reload(apps.chaos_app).app
    ids = [app.submit(workflow, steps, key=f"{workflow}-{i}").run_id for i in range(runs)]
    app.close()
    return ids


def _chaos(cluster: Cluster, runs: int, steps: int, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    ids = _submit(cluster, "effects", runs, steps)
    store = SQLiteStore(cluster.db)
    killed_mid_run = 0
    for _ in range(kills):
        proc = cluster.start("--concurrency", "16")
        # Aim at a worker that holds runs (on a loaded machine a fixed delay can miss
        # them all): wait until one is running, then kill at a random moment after.
        deadline = time.time() + 15
        while time.time() < deadline and proc.poll() is None:
            if any(r.status == "running" for r in store.list_runs(limit=runs)):
                break
            if all(r.status == "succeeded" for r in store.list_runs(limit=runs)):
                break
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.4))
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            if any(r.status == "running" for r in store.list_runs(limit=runs)):
                killed_mid_run += 1
        time.sleep(cluster.lease_s * rng.choice([0.2, 1.2]))  # sometimes before the lease ends
    time.sleep(cluster.lease_s + 0.3)  # every lease of a killed worker has expired
    final = cluster.start("--until-idle")
    assert final.wait(120) == 0, cluster.log(final)
    assert killed_mid_run > 0, "no kill landed mid-run: the test proved nothing"

    # No run lost: every one finished, and succeeded.
    records = {r.id: r for r in store.list_runs(limit=runs * 2)}
    assert sorted(records) == sorted(ids)
    assert {r.status for r in records.values()} == {"succeeded"}, [
        (r.id, r.status, r.error) for r in records.values() if r.status != "succeeded"
    ]
    ledger = EffectLedger(cluster.ledger_path)
    report = ledger.report()
    assert report.duplicate_effects == {}
    recovered_steps = 0
    for run_id in ids:
        steps_rows = store.load_steps(run_id)
        # The journal is whole: one row per position, each ended.
        assert [r.seq for r in steps_rows] == list(range(steps))
        for row in steps_rows:
            key = f"{run_id}:{row.session}:{row.seq}"
            if row.name.endswith("launch"):
                assert ledger.calls(key) <= 1  # at_most_once: never twice
                assert row.status in ("completed", "failed")
            else:
                assert row.status == "completed"
                assert ledger.applied(key) == 1  # exactly once per key
            recovered_steps += row.attempt > 1
        result = json.loads(records[run_id].output or "{}")
        paid_steps = [i for i in range(steps) if i % 10 != 9]
        assert result["paid"] == sum(paid_steps)
    assert recovered_steps > 0 or report.duplicate_calls, "no step was ever interrupted"
    store.close()


def test_sigkill_again_and_again_loses_nothing(cluster: Cluster) -> None:
    _chaos(cluster, runs=12, steps=50, kills=6, seed=7)


@pytest.mark.slow
def test_sigkill_chaos_long(cluster: Cluster) -> None:
    _chaos(cluster, runs=60, steps=50, kills=30, seed=11)


def test_stale_worker_is_fenced_off(cluster: Cluster) -> None:
    cluster.env["MAINSPRING_TEST_STEP_S"] = "0.05"
    [run_id] = _submit(cluster, "slow", runs=1, steps=60)
    store = SQLiteStore(cluster.db)

    def progress() -> int:
        return len(store.load_steps(run_id))

    stale = cluster.start()
    deadline = time.time() + 30
    while progress() < 5 and time.time() < deadline:
        time.sleep(0.02)
    stale.send_signal(signal.SIGSTOP)
    frozen_at = progress()
    time.sleep(cluster.lease_s + 0.5)  # its lease runs out while it is frozen
    fresh = cluster.start()
    deadline = time.time() + 30
    while progress() < frozen_at + 5 and time.time() < deadline:
        time.sleep(0.02)
    taken = store.get_run(run_id)
    assert taken is not None and taken.epoch == 2 and taken.status == "running"
    stale.send_signal(signal.SIGCONT)  # it wakes up believing it still owns the run
    deadline = time.time() + 60
    while store.get_run(run_id).status != "succeeded" and time.time() < deadline:  # type: ignore[union-attr]
        time.sleep(0.05)
    stale.send_signal(signal.SIGTERM)
    fresh.send_signal(signal.SIGTERM)
    assert stale.wait(20) == 0
    assert fresh.wait(20) == 0

    assert "lease" in cluster.log(stale) and "lost" in cluster.log(stale)
    rows = store.load_steps(run_id)
    assert [r.seq for r in rows] == list(range(60))
    first_fresh = min(r.seq for r in rows if r.epoch == 2)
    # Nothing the stale worker did after the takeover reached the journal.
    assert all(r.epoch == 2 for r in rows if r.seq >= first_fresh)
    assert all(r.epoch == 1 for r in rows if r.seq < first_fresh)
    ledger = EffectLedger(cluster.ledger_path)
    assert ledger.report().duplicate_effects == {}
    assert all(ledger.applied(f"{run_id}:0:{i}") == 1 for i in range(60))
    store.close()


def test_sigterm_finishes_the_step_and_gives_the_run_back(cluster: Cluster) -> None:
    cluster.env["MAINSPRING_TEST_STEP_S"] = "0.2"
    [run_id] = _submit(cluster, "slow", runs=1, steps=12)
    store = SQLiteStore(cluster.db)
    worker = cluster.start()
    deadline = time.time() + 30
    while len(store.load_steps(run_id)) < 3 and time.time() < deadline:
        time.sleep(0.02)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    run = store.get_run(run_id)
    assert run is not None
    assert (run.status, run.owner, run.recoveries) == ("queued", None, 0)
    rows = store.load_steps(run_id)
    assert all(r.status == "completed" for r in rows)  # the step in flight finished
    final = cluster.start("--until-idle")
    assert final.wait(60) == 0, cluster.log(final)
    assert store.get_run(run_id).status == "succeeded"  # type: ignore[union-attr]
    report = EffectLedger(cluster.ledger_path).report()
    assert report.calls == 12  # nothing re-ran: a graceful stop is not a crash
    assert report.duplicate_calls == {}
    store.close()
