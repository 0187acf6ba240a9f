"""A durable Pydantic AI agent survives SIGKILLs of its worker processes at random
points (real `mainspring worker` processes, real SQLite and PostgreSQL): no run lost,
no effect twice (EffectLedger), no completed model request sent again (counted at the
FakeOpenAIServer), each sub-agent one child run. The agent: tests/apps/pydantic_ai_app.py."""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import mainspring as ms
from mainspring.testing import EffectLedger, FakeOpenAIServer, FakeReply, RecordedRequest

TESTS = Path(__file__).resolve().parent


def _prompt(body: Any) -> str:
    return next(str(m["content"]) for m in body["messages"] if m["role"] == "user")


def _turn(body: Any) -> int:
    """How many replies the request's conversation already holds."""
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def _script(refunds: int) -> Any:
    """The model, as a function of the conversation: `refunds` refunds, a question to
    billing, a ticket closed (approved by a person), an answer."""

    def reply(request: RecordedRequest) -> FakeReply:
        prompt, turn = _prompt(request.body), _turn(request.body)
        delay = random.uniform(0.0, 0.03)  # so that kills also land mid-request
        if prompt.startswith("billing:"):
            return FakeOpenAIServer.text(f"{prompt[9:]} is paid", delay_s=delay)
        n = int(prompt.split()[-1])
        if turn < refunds:
            return FakeOpenAIServer.tool_call("refund", {"order": n * 100 + turn}, delay_s=delay)
        if turn == refunds:
            question = {"question": f"billing: order {n}"}
            return FakeOpenAIServer.tool_call("ask_billing", question, delay_s=delay)
        if turn == refunds + 1:
            return FakeOpenAIServer.tool_call("close_ticket", {"ticket": n}, delay_s=delay)
        return FakeOpenAIServer.text(f"ticket {n} resolved", delay_s=delay)

    return reply


def _chaos(
    db_url: str,
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    runs: int,
    refunds: int,
    kills: int,
    seed: int,
) -> None:
    rng = random.Random(seed)
    with FakeOpenAIServer(fallback=_script(refunds)) as server:
        env = {
            **os.environ,
            "MAINSPRING_DATABASE_URL": db_url,
            "MAINSPRING_TEST_LEDGER": str(tmp / "ledger.db"),
            "MAINSPRING_TEST_OPENAI_URL": server.base_url,
            "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        }
        for name in env:
            if name.startswith("MAINSPRING_"):
                monkeypatch.setenv(name, env[name])
        import apps.pydantic_ai_app

        module = importlib.reload(apps.pydantic_ai_app)
        app: ms.App = module.app
        handles = [
            app.submit(module.support, f"ticket {n}", key=f"ticket-{n}") for n in range(runs)
        ]
        prompts: dict[str, str] = {}

        def completed_requests() -> dict[str, int]:
            """Completed model steps of every run, by the run's prompt."""
            done: dict[str, int] = {}
            for run in app.list_runs(limit=1000):
                if run.id not in prompts:
                    prompts[run.id] = json.loads(run.input or "{}")["args"][0]
                steps = app.store.load_steps(run.id)
                done[prompts[run.id]] = sum(
                    1 for s in steps if s.role == "model" and s.status == "completed"
                )
            return done

        def answer_requests() -> None:
            for request in app.requests():
                app.answer(request.run_id, request.id, decision="approve")

        def spawn(i: int) -> subprocess.Popen[bytes]:
            with open(tmp / f"worker{i}.log", "wb") as log:
                return subprocess.Popen(
                    [sys.executable, "-m", "mainspring", "worker", "apps.pydantic_ai_app:app"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )

        # (monotonic time of the kill, completed model requests of each run then)
        killed: list[tuple[float, dict[str, int]]] = []
        worker = spawn(0)

        def progress() -> int:
            return len(server.requests)

        for k in range(kills):
            # Kill at a random point of the work: after a random number of model requests
            # more, plus a random few milliseconds (mid-request, mid-tool, mid-commit).
            target = progress() + rng.randint(1, 4)
            deadline = time.monotonic() + 60
            while progress() < target and time.monotonic() < deadline:
                answer_requests()
                time.sleep(0.03)
            time.sleep(rng.uniform(0.0, 0.05))
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            killed.append((time.monotonic(), completed_requests()))
            worker = spawn(k + 1)
        deadline = time.monotonic() + 180
        try:
            while not all(app.get_run(h.run_id).finished for h in handles):
                assert time.monotonic() < deadline, [app.get_run(h.run_id) for h in handles]
                answer_requests()
                time.sleep(0.1)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)

        # 0 lost runs: every one succeeded, with one billing child each
        for n, handle in enumerate(handles):
            run = app.get_run(handle.run_id)
            assert run.status == "succeeded", (run, (tmp / "worker0.log").read_text()[-2000:])
            assert json.loads(run.output or "{}")["output"] == f"ticket {n} resolved"
        children = [r for r in app.list_runs(limit=1000) if r.workflow == "billing"]
        assert sorted(r.parent for r in children) == sorted(h.run_id for h in handles)
        assert all(r.status == "succeeded" for r in children)

        # 0 duplicate effects
        report = EffectLedger(tmp / "ledger.db").report()
        assert report.keys == runs * (refunds + 1), report
        assert report.duplicate_effects == {}, report

        # A request whose sender died while writing it never arrived whole (no body).
        requests = [r for r in server.requests if isinstance(r.body, dict)]
        # no model request whose step had completed when a worker died was sent again
        for at, done in killed:
            for request in requests:
                if request.at <= at:
                    continue
                prompt, turn = _prompt(request.body), _turn(request.body)
                assert turn >= done.get(prompt, 0), (prompt, turn, done.get(prompt))
        # the model answered each turn of each run once, but the turns in flight at a kill
        sent = Counter((_prompt(r.body), _turn(r.body)) for r in requests)
        resent = sum(c - 1 for c in sent.values())
        assert resent <= kills * (runs * 2), sent
        turns = runs * (refunds + 3) + runs  # support runs, and their billing children
        assert len(sent) == turns
        print(
            f"\n{db_url.split(':')[0]}: {runs} runs, {kills} SIGKILLs, 0 lost, "
            f"{len(report.duplicate_effects)} duplicate effects, {len(requests)} "
            f"model requests for {turns} turns ({resent} re-sent: in flight at a kill), "
            f"{sum(report.duplicate_calls.values())} re-run tool calls deduplicated by key"
        )
        app.close()


def test_a_durable_pydantic_ai_agent_survives_sigkills(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chaos(db_url, tmp_path, monkeypatch, runs=3, refunds=3, kills=2, seed=7)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_durable_pydantic_ai_agent_survives_many_sigkills(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chaos(db_url, tmp_path, monkeypatch, runs=12, refunds=8, kills=15, seed=11)
