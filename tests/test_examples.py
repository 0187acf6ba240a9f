"""Each example in examples/ runs to completion, and what it claims is checked."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import mainspring as ms
from examples import mailer, research_agent
from examples.mailer import customers, tier_of
from mainspring.examples.migration import TargetStore, legacy_rows
from mainspring.examples.migration.local import run_local
from mainspring.testing import EffectLedger, ScriptedModel

ROOT = Path(__file__).resolve().parent.parent


def test_migration_runs_every_stage_and_writes_each_customer_once(tmp_path: Path) -> None:
    out = run_local(tmp_path, 60, flaky_every=7)
    assert out.status == "succeeded", out.error
    rows = legacy_rows(60)
    rejected = {r["id"] for r in rows if "@" not in r["email"] or r["phone"] == "12-34"}
    rejected |= {r["id"] for r in rows if r["plan"] == "platinum"}
    assert {r["id"] for r in out.result["rejected"]} == rejected
    imported = {r["id"] for r in rows} - rejected
    assert out.result["imported"] == len(imported) == len(out.target_rows)
    assert set(out.target_rows) == imported
    # The gate showed the reviewer the counts before anything was written.
    assert out.gate_preview["import"] == len(imported)
    assert out.gate_preview["rejected"] == len(rejected)
    names = [s.name for s in out.steps]
    assert names.index("approval:import") < names.index("import_customer")
    assert Counter(names)["import_customer"] == len(imported)
    # Faults were met and survived: retried steps, and writes whose reply was lost
    # recognised by their idempotency key instead of applied twice.
    assert any(s.attempt > 1 for s in out.steps if s.name == "import_customer")
    assert out.result["repeats_recognised"] > 0
    assert out.ledger.calls > out.ledger.keys == len(imported)
    assert out.ledger.duplicate_effects == {}
    # Every stored row has the target schema.
    assert all(r["phone"].startswith("+") and r["segment"] for r in out.target_rows.values())


def test_migration_undoes_the_import_when_reconciliation_fails(tmp_path: Path) -> None:
    out = run_local(tmp_path, 30, drops=("cus_0007",))
    assert out.status == "failed"
    assert "reconciliation failed: 1 missing (cus_0007)" in out.error["message"]
    assert "the import was undone" in out.error["message"]
    assert out.target_rows == {}  # compensation removed every imported customer
    assert [s.name for s in out.steps][-2:] == ["reconcile", "undo_import"]
    assert out.ledger.duplicate_effects == {}


def test_migration_rejected_at_the_gate_writes_nothing(tmp_path: Path) -> None:
    out = run_local(tmp_path, 20, approve=False)
    assert out.status == "failed"
    assert "stage gate 'import' rejected by example: not today" in out.error["message"]
    assert out.target_rows == {} and out.ledger.calls == 0


def test_migration_refuses_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="count must be between 1 and 9999"):
        legacy_rows(0)
    TargetStore(tmp_path / "target.db").close()
    with pytest.raises(Exception, match="already holds a migration"):
        run_local(tmp_path, 5)


def test_migration_module_runs_from_the_shell(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mainspring.examples.migration",
            "--count",
            "15",
            "--dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert ": succeeded" in done.stdout and "0 duplicate effects" in done.stdout


# -- the customer mailer ------------------------------------------------------------


def test_mailer_runs_in_process() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.mailer", "--count", "40"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "succeeded" in done.stdout
    assert "40 calls, 40 emails, 0 duplicates" in done.stdout
    assert '"bounced":1,"delivered":39' in done.stdout


def test_mailer_tiers_by_rule() -> None:
    people = customers(200)
    tiers = Counter(tier_of(c) for c in people)
    assert sum(tiers.values()) == 200 and set(tiers) == {"vip", "active", "lapsed"}
    assert all(tier_of(c) == "vip" for c in people if c.lifetime_value >= 8000)
    with pytest.raises(ValueError, match="count must be between"):
        customers(0)


async def test_mailer_rejected_sends_nothing(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'm.db'}", clock=ms.FakeClock())
    ledger = EffectLedger(tmp_path / "mail.db")
    flow = mailer.build(app, ledger, ScriptedModel(mailer.pipeline.writer_turn))
    run = app.submit(flow, 30)
    worker = app.worker()
    await worker.run(until_idle=True)
    [request] = app.requests(run.run_id)
    assert request.preview["emails"] == 30 and request.preview["sample"]["to"] == "c1@example.com"
    app.answer(run.run_id, request.id, decision="reject", reason="wrong tone", by="qa")
    await worker.run(until_idle=True)
    result = await run.result()
    assert result.approved is False and result.reason == "wrong tone"
    assert ledger.report().calls == 0
    app.close()
    ledger.close()


MAILER_SPEC = "examples.mailer.worker_app:app"


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mainspring", "worker", MAILER_SPEC, "--lease-s", "2"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def test_mailer_sends_each_email_once_across_a_sigkill(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'mailer.db'}"
    ledger_path = tmp_path / "mail-api.db"
    app = ms.App(url)
    ledger = EffectLedger(ledger_path)
    flow = mailer.build(app, ledger, ScriptedModel(mailer.pipeline.writer_turn))
    run = app.submit(flow, 200)
    await app.worker().run(until_idle=True)  # segment and write here; then it waits
    [request] = app.requests(run.run_id)
    app.answer(run.run_id, request.id, decision="approve", by="test")

    env = {
        **os.environ,
        "MAINSPRING_DATABASE_URL": url,
        "MAILER_LEDGER": str(ledger_path),
        "MAILER_SEND_S": "0.01",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    procs = [_worker(env, tmp_path / "worker-1.log")]
    try:
        deadline = time.monotonic() + 60
        while ledger.report().calls < 60:  # kill it a good way into the sends
            assert procs[0].poll() is None, (tmp_path / "worker-1.log").read_text()
            assert time.monotonic() < deadline, "the worker sent too little"
            await asyncio.sleep(0.01)
        procs[0].kill()  # SIGKILL, mid-send
        procs[0].wait()
        sent_at_kill = ledger.report().keys
        assert 60 <= sent_at_kill < 200
        procs.append(_worker(env, tmp_path / "worker-2.log"))
        while not app.get_run(run.run_id).finished:
            assert procs[1].poll() is None, (tmp_path / "worker-2.log").read_text()
            assert time.monotonic() < deadline + 60, "the run did not finish"
            await asyncio.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(30)
    result = await run.result()
    assert result.approved and sum(result.statuses.values()) == 200
    assert result.statuses == {"bounced": 5, "delivered": 195}
    report = ledger.report()
    assert report.keys == 200 and report.duplicate_effects == {}
    # Every customer mailed exactly once: the recipients of the applied effects.
    conn = sqlite3.connect(ledger_path)
    recipients = Counter(
        json.loads(p)["to"]
        for (p,) in conn.execute("SELECT payload FROM effects WHERE effect = 'send_email'")
    )
    conn.close()
    assert recipients == Counter(c.email for c in customers(200))
    assert set(recipients.values()) == {1}
    # The second worker took over (a new epoch) and replayed the sends it found done.
    record = app.get_run(run.run_id)
    assert record.epoch >= 2
    app.close()
    ledger.close()


# -- the research agent -------------------------------------------------------------


async def test_research_agent_carries_its_hand_off_across_sessions(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'r.db'}")
    model = ScriptedModel(research_agent.script())
    result = await app.run(research_agent.build(app, model), "How do runtimes avoid repeats?")
    app.close()
    assert result.status == "done" and result.sessions == 3
    # The answer was written in session 3 from the facts of sessions 1 and 2, which
    # reached it through the hand-off: session 3's first request carries no earlier
    # turn verbatim, only the state block and a one-line-per-turn summary.
    assert result.answer == (
        "finding: sources are doc-1 and doc-2; "
        "finding: crashes replay the journal; keys stop repeated effects"
    )
    last = "\n".join(getattr(m, "content", None) or "" for m in model.requests[-1].messages)
    assert "session 1: searched" in last  # the progress note of session 1
    assert "turn 1: read(" in last  # session 2's turns, summarised
    assert len(model.requests[-1].messages) == len(model.requests[0].messages)
    assert len(model.requests[-1].messages) < len(model.requests[-2].messages)


def test_research_agent_runs_from_the_shell() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.research_agent"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "in 3 sessions" in done.stdout
