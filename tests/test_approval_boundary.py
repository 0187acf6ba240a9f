"""The approval boundary, attacked end to end with a ``submit``-only key.

Only the answer path with the ``approve`` scope (``App.answer``, ``mainspring
approve``) decides a request to a human. A submit key tries every other door:
raw signals to the request's name (before and after the request exists, with a
forged ``by`` and with edited arguments for an irreversible payment), forks that
edit or carry a decision, retries of a rejected run. Each is refused, and the
ledger shows the irreversible effects never happened; then a reviewer approves and
they happen once, so the ledger is not blind.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.server import create_app
from mainspring.testing import ScriptedModel

call = ScriptedModel.call
ATTACK = {"account": "ATTACKER-IBAN", "cents": 999999}


@dataclass
class World:
    app: ms.App
    db: str
    client: TestClient
    submit: dict[str, str]  # headers of a read+submit key ("mallory")
    reviewer: dict[str, str]  # read+submit+approve ("ana")
    shipped: list[str] = field(default_factory=list)  # the workflow's irreversible step
    paid: list[tuple[str, int]] = field(default_factory=list)  # the agent's pay tool

    def drain(self) -> None:
        asyncio.run(asyncio.wait_for(self.app.worker().run(until_idle=True), 30))

    def submit_run(self, workflow: str, *args: Any) -> str:
        r = self.client.post(
            "/runs", json={"workflow": workflow, "args": list(args)}, headers=self.submit
        )
        assert r.status_code == 202, r.text
        run_id: str = r.json()["id"]
        return run_id


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    db = f"sqlite:///{tmp_path / 'boundary.db'}"
    app = ms.App(db, poll_interval_s=0.01, inline_wait_s=0.0)
    shipped: list[str] = []
    paid: list[tuple[str, int]] = []

    @app.workflow
    async def deploy(ctx: ms.RunContext, env: str) -> str:
        await ctx.step(lambda: f"built {env}", name="build")
        decision = await ctx.approval("deploy", preview={"env": env})
        if not decision.approved:
            return f"held: {decision.reason}"
        await ctx.step(lambda: shipped.append(env), name="ship")
        return f"shipped by {decision.by}"

    @app.workflow
    async def release(ctx: ms.RunContext, env: str) -> str:
        await ctx.gate("release", preview={"env": env})  # a rejection fails the run
        await ctx.step(lambda: shipped.append(f"release {env}"), name="ship")
        return "released"

    @app.tool(effect="irreversible")
    def pay(account: str, cents: int) -> str:
        """Move money (cannot be undone)."""
        paid.append((account, cents))
        return "paid"

    app.agent(
        "payer",
        model=ScriptedModel(
            [
                call("pay", {"account": "ACME", "cents": 100}, id="c1"),
                # One turn each for the run and its fork after their decisions.
                call("finish", {"answer": "done"}),
                call("finish", {"answer": "done"}),
            ]
        ),
        instructions="Pay the invoice.",
        tools=[pay],
    )
    now = app.clock.now()
    _, mallory = app.store.create_api_key("mallory", ["read", "submit"], now)
    _, ana = app.store.create_api_key("ana", ["read", "submit", "approve"], now)
    with TestClient(create_app(app, webhooks=False)) as client:
        yield World(
            app=app,
            db=db,
            client=client,
            submit={"Authorization": f"Bearer {mallory}"},
            reviewer={"Authorization": f"Bearer {ana}"},
            shipped=shipped,
            paid=paid,
        )
    app.close()


def _refused(response: Any, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"], response.text


def _pending(world: World, run_id: str) -> list[str]:
    return [r.id for r in world.app.requests(run_id)]


def test_a_submit_key_cannot_decide_a_workflow_approval(world: World) -> None:
    c, mallory, ana = world.client, world.submit, world.reviewer
    run_id = world.submit_run("deploy", "prod")
    # Pre-sent before the run even reached its wait: refused, and so never consumed.
    for name, payload in [
        ("approval:deploy", {"decision": "approve", "by": "ana"}),
        ("approval:deploy", True),
        ("resume", {"action": "continue"}),
        ("budget:max_steps", {"limit": 10**6}),
        ("checkpoint:usd:1", "continue"),
        ("question:colour", {"answer": "red"}),
    ]:
        r = c.post(
            f"/runs/{run_id}/signals", json={"name": name, "payload": payload}, headers=mallory
        )
        _refused(r, 403, "reserved for the answer to a request")
        assert r.json()["error"]["type"] == "forbidden"
    # A reviewer cannot answer before the request exists either.
    early = c.post(
        f"/runs/{run_id}/requests/approval:deploy", json={"decision": "approve"}, headers=ana
    )
    _refused(early, 404, "has no request 'approval:deploy'")
    world.drain()
    assert _pending(world, run_id) == ["approval:deploy"]  # listed: nothing answered it

    # Once waiting: the raw signal, the answer endpoint and a forged `by`, all refused.
    r = c.post(
        f"/runs/{run_id}/signals",
        json={"name": "approval:deploy", "payload": {"decision": "approve"}},
        headers=mallory,
    )
    _refused(r, 403, "reserved")
    r = c.post(
        f"/runs/{run_id}/requests/approval:deploy", json={"decision": "approve"}, headers=mallory
    )
    _refused(r, 403, "this needs 'approve'")
    forged = c.post(
        f"/runs/{run_id}/requests/approval:deploy",
        json={"decision": "approve", "by": "the-cto"},
        headers=ana,
    )
    assert forged.status_code == 422, forged.text  # `by` is not the caller's to say
    with pytest.raises(ms.ReservedSignal, match="reserved for the answer to a request"):
        world.app.signal(run_id, "approval:deploy", {"decision": "approve"})
    cli_run = CliRunner().invoke(
        cli, ["signal", run_id, "approval:deploy", '{"decision": "approve"}', "--db", world.db]
    )
    assert cli_run.exit_code == 2 and "reserved" in cli_run.stderr
    # Retry is for failed runs only; a waiting run is a 409.
    _refused(c.post(f"/runs/{run_id}/retry", headers=mallory), 409, "only a failed run")
    world.drain()
    assert world.app.get_run(run_id).status == "waiting" and world.shipped == []

    # The reviewer decides; `by` is the key's name, whatever anyone sent before.
    ok = c.post(
        f"/runs/{run_id}/requests/approval:deploy", json={"decision": "approve"}, headers=ana
    )
    assert ok.status_code == 200, ok.text
    world.drain()
    assert asyncio.run(world.app.result(run_id)) == "shipped by ana"
    assert world.shipped == ["prod"]


def test_a_submit_key_cannot_fork_or_retry_past_a_rejection(world: World) -> None:
    c, mallory, ana = world.client, world.submit, world.reviewer
    run_id = world.submit_run("deploy", "prod")
    world.drain()
    c.post(
        f"/runs/{run_id}/requests/approval:deploy",
        json={"decision": "reject", "reason": "freeze"},
        headers=ana,
    )
    world.drain()
    assert asyncio.run(world.app.result(run_id)) == "held: freeze"
    steps = world.app.observe.steps(run_id)
    wait = next(s for s in steps if s.name == "approval:deploy")

    # Patch the rejection into an approval: refused for every key.
    for headers in (mallory, ana):
        r = c.post(
            f"/runs/{run_id}/fork",
            json={"from_step": wait.seq, "edit": {"signal": {"decision": "approve"}}},
            headers=headers,
        )
        _refused(r, 422, "never edits a human's decision")
    # Keep the decisions: needs `approve`.
    r = c.post(
        f"/runs/{run_id}/fork", json={"from_step": wait.seq, "decisions": "keep"}, headers=mallory
    )
    _refused(r, 403, "needs 'approve'")
    # Edit a later step while asking again: the edit would be dropped, so refused.
    last = steps[-1].seq
    r = c.post(f"/runs/{run_id}/fork", json={"from_step": last, "edit": 1}, headers=mallory)
    if last != wait.seq:
        _refused(r, 422, "asks the request 'approval:deploy'")
    # A plain fork past the request asks again: it waits, nothing ships.
    r = c.post(f"/runs/{run_id}/fork", json={"from_step": wait.seq}, headers=mallory)
    assert r.status_code == 202, r.text
    fork_id = r.json()["id"]
    world.drain()
    assert world.app.get_run(fork_id).status == "waiting"
    assert _pending(world, fork_id) == ["approval:deploy"]
    assert world.shipped == []

    # A reviewer keeping the decisions owns them: recorded as ana's, the original kept beside.
    r = c.post(
        f"/runs/{run_id}/fork", json={"from_step": wait.seq, "decisions": "keep"}, headers=ana
    )
    assert r.status_code == 202, r.text
    kept = r.json()["id"]
    world.drain()
    assert asyncio.run(world.app.result(kept)) == "held: freeze"
    row = next(s for s in world.app.observe.steps(kept) if s.name == "approval:deploy")
    answer = json.loads(row.output or "{}")["signal"]
    assert answer["by"] == "ana" and answer["kept_from"] == {"run_id": run_id, "by": "ana"}
    assert world.shipped == []

    # A failed stage gate: a retry replays the reviewer's rejection, it never skips it.
    gated = world.submit_run("release", "prod")
    world.drain()
    c.post(
        f"/runs/{gated}/requests/approval:release",
        json={"decision": "reject", "reason": "no"},
        headers=ana,
    )
    world.drain()
    assert world.app.get_run(gated).status == "failed"
    r = c.post(f"/runs/{gated}/retry", headers=mallory)
    assert r.status_code == 202, r.text
    world.drain()
    assert world.app.get_run(gated).status == "failed"
    assert world.shipped == []


def test_a_submit_key_cannot_pay_the_attacker_through_an_agent(world: World) -> None:
    c, mallory, ana = world.client, world.submit, world.reviewer
    run_id = world.submit_run("payer", "pay invoice 7")
    edited = {"decision": "edit", "arguments": ATTACK}
    r = c.post(
        f"/runs/{run_id}/signals", json={"name": "approval:c1", "payload": edited}, headers=mallory
    )
    _refused(r, 403, "reserved")  # pre-approval before the request exists
    world.drain()
    assert _pending(world, run_id) == ["approval:c1"]
    r = c.post(
        f"/runs/{run_id}/signals", json={"name": "approval:c1", "payload": edited}, headers=mallory
    )
    _refused(r, 403, "reserved")
    r = c.post(f"/runs/{run_id}/requests/approval:c1", json=edited, headers=mallory)
    _refused(r, 403, "this needs 'approve'")
    with pytest.raises(ms.ReservedSignal):
        world.app.signal(run_id, "approval:c1", edited)

    # Fork from the model's turn with the tool call rewritten to pay the attacker: the
    # fork asks a reviewer again, showing the attacker's arguments; nothing is paid.
    steps = world.app.observe.steps(run_id)
    model_turn = next(s for s in steps if s.kind == "step" and s.name.startswith("model:"))
    hijack = {
        "tool_calls": [{"id": "c1", "name": "pay", "arguments": json.dumps(ATTACK)}],
    }
    r = c.post(
        f"/runs/{run_id}/fork",
        json={"from_step": model_turn.seq, "edit": hijack},
        headers=mallory,
    )
    assert r.status_code == 202, r.text
    fork_id = r.json()["id"]
    world.drain()
    [asked] = world.app.requests(fork_id)
    assert asked.id == "approval:c1" and asked.preview["arguments"] == ATTACK
    # Forking the pending approval with an edit (a forged preview or answer): refused.
    wait = next(s for s in steps if s.name == "approval:c1")
    r = c.post(
        f"/runs/{run_id}/fork",
        json={"from_step": wait.seq, "edit": {"signal": edited}},
        headers=mallory,
    )
    _refused(r, 422, "never edits a human's decision")
    world.drain()
    assert world.paid == []

    # The reviewer rejects the hijacked fork and approves the real run: paid once, to ACME.
    rejected = c.post(
        f"/runs/{fork_id}/requests/approval:c1", json={"decision": "reject"}, headers=ana
    )
    assert rejected.status_code == 200, rejected.text
    ok = c.post(f"/runs/{run_id}/requests/approval:c1", json={"decision": "approve"}, headers=ana)
    assert ok.status_code == 200, ok.text
    world.drain()
    assert world.app.get_run(run_id).status == "succeeded"
    assert world.paid == [("ACME", 100)]


async def test_wait_for_a_request_name_is_a_config_error(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'w.db'}", poll_interval_s=0.01, inline_wait_s=0.0)

    @app.workflow
    async def raw(ctx: ms.RunContext) -> Any:
        return await ctx.wait_for("approval:deploy")  # no raw signal could ever answer it

    with pytest.raises(ms.RunFailed, match="reserved for requests to humans"):
        await app.run(raw)
    app.close()


def test_cli_fork_asks_again_unless_the_operator_keeps_the_decisions(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOGNAME", "operator-olga")
    run_id = world.submit_run("deploy", "prod")
    world.drain()
    world.app.answer(run_id, "approval:deploy", decision="reject", reason="freeze")
    world.drain()
    wait = next(s for s in world.app.observe.steps(run_id) if s.name == "approval:deploy")
    forks = {}
    for flags in ([], ["--keep-decisions"]):
        out = CliRunner().invoke(
            cli,
            ["fork", run_id, "--from-step", str(wait.seq), *flags, "--json", "--db", world.db],
        )
        assert out.exit_code == 0, out.output
        forks[bool(flags)] = json.loads(out.stdout)["run_id"]
    world.drain()
    assert _pending(world, forks[False]) == ["approval:deploy"]  # asked again
    assert asyncio.run(world.app.result(forks[True])) == "held: freeze"
    row = next(s for s in world.app.observe.steps(forks[True]) if s.name == "approval:deploy")
    assert json.loads(row.output or "{}")["signal"]["by"] == "operator-olga"
    assert world.shipped == []
