"""Child runs under real worker processes killed with SIGKILL while parents and
children interleave: no child started twice, no result lost, every effect once."""

from __future__ import annotations

import importlib
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mainspring.storage import open_store
from mainspring.testing import EffectLedger, assert_invariants

ROOT = Path(__file__).resolve().parent
# What one family's result is: its own steps, then its four children's.
KID = [sum(i * 10 + j for j in range(4)) for i in range(4)]


def _expected(steps: int) -> int:
    return 1000 + sum(2000 + j for j in range(steps)) + sum(KID)


def _chaos(tmp: Path, db_url: str, families: int, steps: int, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    env = {
        **os.environ,
        "MAINSPRING_DATABASE_URL": db_url,
        "MAINSPRING_TEST_LEDGER": str(tmp / "ledger.db"),
        "MAINSPRING_TEST_LEASE_S": "1.0",
        "MAINSPRING_TEST_STEP_S": "0.01",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    for name in ("MAINSPRING_DATABASE_URL", "MAINSPRING_TEST_LEDGER"):
        os.environ[name] = env[name]
    import apps.children_app

    app = importlib.reload(apps.children_app).app
    ids = [app.submit("family", steps, key=f"family-{i}").run_id for i in range(families)]
    app.close()
    store = open_store(db_url)
    procs: list[subprocess.Popen[bytes]] = []

    def start(*extra: str) -> subprocess.Popen[bytes]:
        with open(tmp / f"worker-{len(procs)}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mainspring", "worker", "apps.children_app:app", *extra],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        procs.append(proc)
        return proc

    try:
        killed_mid_run = 0
        for _ in range(kills):
            proc = start("--concurrency", "8")
            deadline = time.time() + 20
            while time.time() < deadline and proc.poll() is None:
                if any(r.status == "running" for r in store.list_runs(limit=1000)):
                    break
                time.sleep(0.01)
            time.sleep(rng.uniform(0.05, 0.5))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                killed_mid_run += any(r.status == "running" for r in store.list_runs(limit=1000))
            time.sleep(rng.choice([0.2, 1.2]))  # sometimes before the leases end
        time.sleep(1.3)  # every lease of a killed worker has expired
        final = start("--until-idle", "--concurrency", "8")
        assert final.wait(180) == 0, (tmp / f"worker-{len(procs) - 1}.log").read_text()
        assert killed_mid_run > 0, "no kill landed mid-run: the test proved nothing"

        runs = store.list_runs(limit=1000)
        kids = [r for r in runs if r.workflow == "kid"]
        # No child started twice: four per family, each key once.
        assert len(kids) == 4 * families
        assert len({r.key for r in kids}) == len(kids)
        assert {r.parent for r in kids} == set(ids)
        assert all(r.parent_kind == "child" for r in kids)
        # No run lost, no result lost.
        assert {r.status for r in runs} == {"succeeded"}, [
            (r.id, r.workflow, r.status, r.error) for r in runs if r.status != "succeeded"
        ]
        for run_id in ids:
            record = store.get_run(run_id)
            assert record is not None and record.output == str(_expected(steps))
        assert_invariants(store, settled=True)
        # Every effect once.
        ledger = EffectLedger(tmp / "ledger.db")
        assert ledger.report().duplicate_effects == {}
        assert len(ledger.keys()) == families * (1 + steps) + 16 * families
        ledger.close()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        store.close()


def test_sigkill_while_parents_and_children_interleave(tmp_path: Path, db_url: str) -> None:
    _chaos(tmp_path, db_url, families=4, steps=6, kills=4, seed=3)


@pytest.mark.slow
def test_sigkill_children_chaos_long(tmp_path: Path, db_url: str) -> None:
    _chaos(tmp_path, db_url, families=16, steps=20, kills=20, seed=5)
