"""An OpenAI Agents SDK agent (a handoff, an agent as tool, an effectful tool) on
real `mainspring worker` processes, SIGKILLed at random points, on SQLite and
PostgreSQL: no run lost, no effect twice, and no model call that completed is
ever sent again (the fake server counts every request)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from mainspring.storage import open_store
from mainspring.testing import EffectLedger, FakeOpenAIServer, FakeReply, RecordedRequest

ROOT = Path(__file__).resolve().parent
_ORDERS = re.compile(r"(desk \d+): charge (\d+) orders")


def reply(request: RecordedRequest) -> FakeReply:
    """The model, as a function of the conversation: triage hands off; billing
    audits every third order (through the auditor agent) and charges each one; the
    auditor looks the order up, then answers."""
    body: dict[str, Any] = request.body
    items = body["input"] if isinstance(body["input"], list) else []
    calls = [i.get("name") for i in items if i.get("type") == "function_call"]
    who = body.get("instructions")
    if who == "triage":
        return FakeOpenAIServer.tool_call("transfer_to_billing", {})
    if who == "auditor":
        if "lookup" in calls:
            return FakeOpenAIServer.text("the order is fine")
        return FakeOpenAIServer.tool_call("lookup", {"order": 1})
    first = items[0] if items else {"content": body["input"]}
    asked = _ORDERS.search(json.dumps(first))
    assert asked is not None, first
    desk, wanted = asked.group(1), int(asked.group(2))
    charged, audited = calls.count("charge"), calls.count("audit")
    if charged == wanted:
        return FakeOpenAIServer.text(f"charged {wanted} orders")
    if charged % 3 == 0 and audited == charged // 3:
        # The desk in the auditor's input too: no two runs send one body.
        return FakeOpenAIServer.tool_call("audit", {"input": f"{desk}, order {charged}"})
    return FakeOpenAIServer.tool_call("charge", {"order": charged})


def _shapes(requests: list[RecordedRequest]) -> list[str]:
    """Each request as (desk, agent, items in its input), to read a failure."""
    out = []
    for r in requests:
        text = json.dumps(r.body)
        desk = re.search(r"desk \d+", text)
        items = r.body["input"] if isinstance(r.body["input"], list) else [r.body["input"]]
        out.append(f"{desk.group(0) if desk else '?'}/{r.body.get('instructions')}/{len(items)}")
    return out


def _resent_only_in_flight(
    sent: list[RecordedRequest], kills: list[float], stalled: Collection[str] = ()
) -> None:
    """A body sent twice was the last request of its run before a kill: its reply
    never reached the journal. (A completed call sent again on replay would have had
    later requests of its run before the kill.) ``stalled``: desks whose worker stalled
    past its lease (a loaded machine), which is a crash to the run: it was taken over
    and its call in flight sent again."""

    def desk_of(r: RecordedRequest) -> str:
        desk = re.search(r"desk \d+", json.dumps(r.body))
        return desk.group(0) if desk else "?"

    by_desk: dict[str, list[RecordedRequest]] = {}
    for r in sent:
        by_desk.setdefault(desk_of(r), []).append(r)
    for requests in by_desk.values():
        seen: dict[str, float] = {}
        for r in requests:
            body = json.dumps(r.body, sort_keys=True)
            first = seen.get(body)
            if first is not None and desk_of(r) not in stalled:
                kill = next((k for k in kills if first < k < r.at), None)
                assert kill is not None, f"sent again without a crash: {body[:200]}"
                between = [q for q in requests if first < q.at < kill]
                assert between == [], f"a completed call was sent again: {body[:200]}"
            seen[body] = r.at


def _worker(env: dict[str, str], log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mainspring", "worker", "apps.openai_agents_app:app", *extra],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def chaos(
    db_url: str, tmp: Path, monkeypatch: pytest.MonkeyPatch, *, runs: int, orders: int, kills: int
) -> dict[str, Any]:
    rng = random.Random(int(os.environ.get("MAINSPRING_TEST_SEED", "7")))

    def slow_reply(request: RecordedRequest) -> FakeReply:
        return dataclasses.replace(reply(request), delay_s=rng.uniform(0.0, 0.03))

    with FakeOpenAIServer(fallback=slow_reply) as server:
        env = {
            **os.environ,
            "MAINSPRING_DATABASE_URL": db_url,
            "MAINSPRING_TEST_LEDGER": str(tmp / "ledger.db"),
            "MAINSPRING_TEST_OPENAI_URL": server.base_url,
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        for name in ("MAINSPRING_DATABASE_URL", "MAINSPRING_TEST_LEDGER"):
            monkeypatch.setenv(name, env[name])
        import apps.openai_agents_app

        module = importlib.reload(apps.openai_agents_app)
        handles = [
            module.app.submit(module.support, f"desk {i}: charge {orders} orders", key=f"desk-{i}")
            for i in range(runs)
        ]
        store = open_store(db_url)
        log = tmp / "workers.log"
        audits = -(-orders // 3)
        total = runs * (2 + orders + 3 * audits)  # model calls of all the runs

        def progress() -> int:
            return sum(1 for h in handles for s in store.load_steps(h.run_id) if s.role == "model")

        killed_at: list[int] = []
        kill_times: list[float] = []
        for k in range(kills):
            worker = _worker(env, log)
            # Kill once the journal has moved past a random point of this stretch,
            # mid-step (the model answers after a few ms, tools at once).
            lo = progress()
            target = lo + rng.randint(1, max(1, (total - lo) // (kills - k + 1)))
            deadline = time.monotonic() + 180  # a loaded machine imports the SDK slowly
            while progress() < target and time.monotonic() < deadline:
                time.sleep(rng.uniform(0.0, 0.02))
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            kill_times.append(time.monotonic())
            killed_at.append(progress())
            time.sleep(rng.uniform(0.0, 1.2))  # sometimes within the dead lease
        # `--until-idle` leaves a run whose dead holder's lease (1 s) has not run out:
        # wait it out, and start another worker should a lease still hold one back.
        for _ in range(5):
            time.sleep(1.5)
            last = _worker(env, log, "--until-idle")
            # What is left of every run, at a few seconds an order on a loaded machine.
            assert last.wait(120 + 3 * runs * orders) == 0, log.read_text()[-3000:]
            runs_now = [store.get_run(h.run_id) for h in handles]
            if all(r is not None and r.status in ("succeeded", "failed") for r in runs_now):
                break

        finished = [store.get_run(h.run_id) for h in handles]
        assert [r.status for r in finished if r is not None] == ["succeeded"] * runs, [
            (r.status, r.error) for r in finished if r is not None
        ]
        assert all(
            json.loads(r.output or "null") == f"charged {orders} orders" for r in finished if r
        )
        model_steps = 0
        for h in handles:
            steps = store.load_steps(h.run_id)
            assert all(s.status == "completed" for s in steps)
            model_steps += sum(1 for s in steps if s.role == "model")
        # A kill in the middle of sending leaves the server a body it cannot read.
        sent = [r for r in server.requests if r.body is not None]
        cut = len(server.requests) - len(sent)
        bodies = Counter(json.dumps(r.body, sort_keys=True) for r in sent)
        resent = sum(n - 1 for n in bodies.values())
        store.close()

    report = EffectLedger(tmp / "ledger.db").report()
    assert report.duplicate_effects == {}
    # Each order of each run was charged under exactly one idempotency key.
    with sqlite3.connect(tmp / "ledger.db") as db:
        rows = db.execute("SELECT key, payload FROM effects WHERE effect = 'charge'").fetchall()
    per_order = Counter((key.split(":", 1)[0], payload) for key, payload in rows)
    assert len(per_order) == runs * orders and set(per_order.values()) == {1}, per_order
    # Every journaled model call is a distinct request; a request was sent again only
    # when a kill caught it in flight (at most one per run and kill), never after
    # its reply was journaled.
    assert len(bodies) == model_steps, _shapes(sent)
    # A worker that stalled past its 1 s lease (a loaded machine) lost its runs as a
    # killed one would: a takeover sends their calls in flight again.
    lost = set(re.findall(r"event=lost worker=\S+ run=(\w+)", log.read_text()))
    stalled = {f"desk {i}" for i, h in enumerate(handles) if h.run_id in lost}
    _resent_only_in_flight(sent, kill_times, stalled)
    assert resent + cut <= (kills + len(lost)) * runs
    assert sum(1 for n in killed_at if 0 < n < total) == kills, (killed_at, total)
    stats = {
        "runs": runs,
        "kills": len(killed_at),
        "lost": runs - sum(1 for r in finished if r and r.status == "succeeded"),
        "duplicate_effects": len(report.duplicate_effects),
        "model_steps": model_steps,
        "killed_at": killed_at,
        "requests": len(server.requests),
        "resent_in_flight": resent,
        "cut_mid_request": cut,
        "charges": len(rows),
    }
    print("openai-agents chaos:", stats)
    return stats


def test_sdk_agent_survives_sigkills(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chaos(db_url, tmp_path, monkeypatch, runs=3, orders=6, kills=2)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sdk_agent_survives_many_sigkills(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chaos(db_url, tmp_path, monkeypatch, runs=6, orders=60, kills=25)
