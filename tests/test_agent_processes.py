"""An agent with 5 tools, a faulty model (10 % transient errors, 5 % malformed
outputs) and a 100-call task survives a SIGKILL of its worker mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mainspring.storage import SQLiteStore
from mainspring.testing import EffectLedger

ROOT = Path(__file__).resolve().parent


def _worker(env: dict[str, str], log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mainspring", "worker", "apps.agent_app:app", *extra],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_faulty_agent_survives_sigkill(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "MAINSPRING_DATABASE_URL": f"sqlite:///{tmp_path / 'agent.db'}",
        "MAINSPRING_TEST_LEDGER": str(tmp_path / "ledger.db"),
        "MAINSPRING_TEST_CALLS": "100",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    os.environ.update({k: env[k] for k in ("MAINSPRING_DATABASE_URL", "MAINSPRING_TEST_LEDGER")})
    import importlib

    import apps.agent_app

    module = importlib.reload(apps.agent_app)
    handle = module.app.submit(module.worker_agent, "process 100 items", key="pipeline-1")
    store = SQLiteStore(tmp_path / "agent.db")

    first = _worker(env, tmp_path / "w1.log")
    deadline = time.time() + 60
    while time.time() < deadline:
        tools = [s for s in store.load_steps(handle.run_id) if s.name.startswith("tool:")]
        if len(tools) >= 40:
            break
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = len([s for s in store.load_steps(handle.run_id) if s.name.startswith("tool:")])
    assert 0 < killed_at < 100, killed_at
    time.sleep(1.3)  # the dead worker's lease (1 s) runs out
    second = _worker(env, tmp_path / "w2.log", "--until-idle")
    assert second.wait(120) == 0, (tmp_path / "w2.log").read_text()

    run = store.get_run(handle.run_id)
    assert run is not None and run.status == "succeeded", run
    result = json.loads(run.output or "{}")
    assert (result["status"], result["tool_calls"]) == ("done", 100)
    assert result["state"]["repairs"] > 0  # malformed outputs were repaired
    steps = store.load_steps(handle.run_id)
    model_steps = [s for s in steps if s.name.startswith("model:")]
    assert any(s.attempt > 1 for s in model_steps)  # transient errors were retried
    assert all(s.status == "completed" for s in steps)
    ledger = EffectLedger(tmp_path / "ledger.db")
    report = ledger.report()
    assert report.keys == 100
    assert report.duplicate_effects == {}
    store.close()
