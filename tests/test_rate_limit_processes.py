"""Two worker processes, twenty concurrent agent runs, one enforcing fake OpenAI
server: the shared limiter keeps every request inside the limits (zero 429s), whether
the limits are declared or only announced in the server's headers (a cold start)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from mainspring.storage import SQLiteStore, open_store
from mainspring.testing import FakeOpenAIServer, FakeReply, RecordedRequest

ROOT = Path(__file__).resolve().parent
RUNS, TURNS = 20, 3
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
]


def reply(request: RecordedRequest) -> FakeReply:
    """Call note until the run has done TURNS - 1 steps, then finish; replies of
    varying length so that output reservations matter."""
    body: Any = request.body
    done = sum(1 for m in body["messages"] if m["role"] == "tool")
    seed = zlib.crc32(json.dumps(body["messages"][1]).encode()) + done
    text = " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(40 + seed % 120))
    if done < TURNS - 1:
        return FakeOpenAIServer.tool_call("note", {"n": done}, text=text)
    return FakeOpenAIServer.tool_call("finish", {"answer": f"{done} steps"}, text=text)


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mainspring", "worker", "apps.rate_app:app"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_two_workers_twenty_runs_zero_429s(tmp_path: Path) -> None:
    period, tpm = 2.0, 40_000
    with FakeOpenAIServer(fallback=reply, tpm=tpm, rpm=600, period_s=period) as server:
        env = {
            **os.environ,
            "MAINSPRING_DATABASE_URL": f"sqlite:///{tmp_path / 'rate.db'}",
            "MAINSPRING_TEST_BASE_URL": server.base_url,
            "MAINSPRING_TEST_PERIOD_S": str(period),
            "MAINSPRING_TEST_TPM": str(tpm),
            "MAINSPRING_TEST_RPM": "600",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        os.environ["MAINSPRING_DATABASE_URL"] = env["MAINSPRING_DATABASE_URL"]
        os.environ["MAINSPRING_TEST_BASE_URL"] = server.base_url
        import importlib

        import apps.rate_app

        module = importlib.reload(apps.rate_app)
        task = "Process the batch of records: " + " ".join(WORDS * 30)
        handles = [module.app.submit(module.worker_agent, f"{task} #{i}") for i in range(RUNS)]
        store = SQLiteStore(tmp_path / "rate.db")
        workers = [_worker(env, tmp_path / f"w{i}.log") for i in range(2)]
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                runs = [store.get_run(h.run_id) for h in handles]
                if all(r is not None and r.status in ("succeeded", "failed") for r in runs):
                    break
                time.sleep(0.1)
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                w.wait(30)
        runs = [store.get_run(h.run_id) for h in handles]
        failed = [(r and r.status, r.error) for r in runs if r is None or r.status != "succeeded"]
        assert not failed, [json.loads(e or "{}").get("message") for _, e in failed]
        assert len(server.served_usage) == RUNS * TURNS
        assert server.too_many_requests == 0
        # The limit was the bottleneck: some runs slept for their slot, durably.
        steps = [s for h in handles for s in store.load_steps(h.run_id)]
        sent = [s for s in steps if s.name.startswith("model:") and s.status == "completed"]
        assert len(sent) == RUNS * TURNS
        # (a request that starts late books again: a little more than one slot per call)
        assert len([s for s in steps if s.name.startswith("rate:")]) >= RUNS * TURNS
        served = sum(i + o for _, i, o in server.served_usage)
        assert served > 2 * tpm  # more than the bucket held at the start
        store.close()


def test_cold_start_with_undeclared_limits_two_workers_twenty_runs(
    db_url: str, tmp_path: Path
) -> None:
    """Nothing declared: the limits come only from the headers of the fake server's
    replies. One probe goes first, across both workers; its reply teaches the limit,
    and the rest are paced: no 429 after the first reply, and the refill is used."""
    period, tpm = 2.0, 20_000
    with FakeOpenAIServer(fallback=reply, tpm=tpm, rpm=600, period_s=period) as server:
        env = {
            **os.environ,
            "MAINSPRING_DATABASE_URL": db_url,
            "MAINSPRING_TEST_BASE_URL": server.base_url,
            "MAINSPRING_TEST_PERIOD_S": str(period),
            "MAINSPRING_TEST_TPM": str(tpm),
            "MAINSPRING_TEST_RPM": "600",
            "MAINSPRING_TEST_UNDECLARED": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        for name in ("MAINSPRING_DATABASE_URL", "MAINSPRING_TEST_BASE_URL"):
            os.environ[name] = env[name]
        os.environ["MAINSPRING_TEST_UNDECLARED"] = "1"
        import importlib

        import apps.rate_app

        try:
            module = importlib.reload(apps.rate_app)
        finally:
            del os.environ["MAINSPRING_TEST_UNDECLARED"]
        assert module.app.rate_limits is module.LEARNED  # nothing declared
        task = "Process the batch of records: " + " ".join(WORDS * 30)
        handles = [module.app.submit(module.worker_agent, f"{task} #{i}") for i in range(RUNS)]
        store = open_store(db_url)
        workers = [_worker(env, tmp_path / f"w{i}.log") for i in range(2)]
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                runs = [store.get_run(h.run_id) for h in handles]
                if all(r is not None and r.status in ("succeeded", "failed") for r in runs):
                    break
                time.sleep(0.1)
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                w.wait(30)
            module.app.close()
        runs = [store.get_run(h.run_id) for h in handles]
        failed = [(r and r.status, r.error) for r in runs if r is None or r.status != "succeeded"]
        assert not failed, [json.loads(e or "{}").get("message") for _, e in failed]
        served = list(server.served_usage)
        assert len(served) == RUNS * TURNS
        first_reply = served[0][0]
        # The share of the refill used over the busy window (first to last reply; the
        # bucket starts full). Measured 88-93 % on SQLite and PostgreSQL; asserted
        # loosely, as a loaded machine stretches the window.
        tokens = sum(i + o for _, i, o in served)
        periods = (max(t for t, _, _ in served) - first_reply) / period
        used = (tokens - tpm) / (tpm * periods)
        figures = f"{server.too_many_requests} 429s, {used:.1%} of the refill"
        late = [t for t, _, _ in server.refusals if t > first_reply]
        assert late == [], figures  # no 429 after the first reply
        assert server.too_many_requests == 0, figures  # (nor before: the probe went alone)
        assert used >= 0.7, figures
        store.close()
