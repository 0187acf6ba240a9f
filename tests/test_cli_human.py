"""`mainspring pending / approve / answer / keys / webhooks` on a real SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _helpers import drain
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'hitl.db'}"


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


async def test_pending_approve_and_answer(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Who decides is the local user (getpass reads LOGNAME first), never a flag.
    monkeypatch.setenv("LOGNAME", "ana")
    app = ms.App(db, poll_interval_s=0.01, inline_wait_s=0.0)

    @app.workflow
    async def release(ctx: ms.RunContext, version: str) -> str:
        decision = await ctx.approval("publish", preview={"version": version})
        if not decision.approved:
            return f"held: {decision.reason}"
        channel = await ctx.ask("Which channel?", choices=["beta", "stable"])
        tag = (decision.arguments or {}).get("tag", version)
        return f"{tag} on {channel} by {decision.by}"

    one = app.submit(release, "1.0")
    two = app.submit(release, "2.0")
    await drain(app)

    code, out, _ = _invoke("pending", "--db", db, "--json")
    assert code == 0
    listed = json.loads(out)
    assert {(r["run_id"], r["id"]) for r in listed} == {
        (one.run_id, "approval:publish"),
        (two.run_id, "approval:publish"),
    }
    code, out, _ = _invoke("pending", "--db", db)
    assert code == 0 and "approval:publish" in out and '"version": "1.0"' in out

    code, out, _ = _invoke(
        "approve",
        one.run_id,
        "approval:publish",
        "--edit",
        '{"tag": "v1"}',
        "--db",
        db,
    )
    assert code == 0 and "edit: request 'approval:publish'" in out
    code, _, err = _invoke("approve", one.run_id, "approval:publish", "--db", db)
    assert code == 2 and "already answered" in err
    code, _, err = _invoke("approve", two.run_id, "approval:publish", "--edit", "[1]", "--db", db)
    assert code == 2 and "--edit '[1]' must be a JSON object" in err
    code, _, err = _invoke("approve", two.run_id, "approval:publish", "--edit", "{", "--db", db)
    assert code == 2 and "is not valid JSON" in err
    code, _, _ = _invoke(
        "approve", two.run_id, "approval:publish", "--reject", "not yet", "--db", db
    )
    assert code == 0
    await drain(app)

    code, out, _ = _invoke("pending", one.run_id, "--db", db, "--json")
    [question] = json.loads(out)
    assert question["kind"] == "question" and question["choices"] == ["beta", "stable"]
    code, _, err = _invoke("answer", one.run_id, question["id"], "alpha", "--db", db)
    assert code == 2 and "'alpha' is not one of the choices" in err
    code, _, _ = _invoke("answer", one.run_id, question["id"], "beta", "--db", db)
    assert code == 0
    await drain(app)
    assert await app.result(one.run_id) == "v1 on beta by ana"
    assert await app.result(two.run_id) == "held: not yet"
    code, out, _ = _invoke("pending", "--db", db)
    assert code == 0 and "no pending requests" in out
    code, _, err = _invoke("pending", "nope", "--db", db)
    assert code == 2 and "no run 'nope'" in err
    app.close()


def test_keys_and_webhooks(db: str) -> None:
    admin = ms.App(db)
    admin.store.migrate()
    code, out, _ = _invoke("keys", "create", "ana", "--scope", "read,approve", "--db", db, "--json")
    assert code == 0
    created = json.loads(out)
    assert created["scopes"] == ["read", "approve"] and created["key"].startswith("msk_")
    code, _, err = _invoke("keys", "create", "bad", "--scope", "root", "--db", db)
    assert code == 2 and "scopes must be some of" in err
    code, out, _ = _invoke("keys", "list", "--db", db, "--json")
    [listed] = json.loads(out)
    assert listed["id"] == created["id"] and "key" not in listed and listed["revoked_at"] is None
    assert created["key"] not in (
        Path(db.removeprefix("sqlite:///")).read_bytes().decode("latin-1")
    )
    assert _invoke("keys", "revoke", created["id"], "--db", db)[0] == 0
    code, _, err = _invoke("keys", "revoke", created["id"], "--db", db)
    assert code == 2 and "no active key" in err
    key = admin.store.verify_api_key(created["key"], 0)
    assert key is not None and not key.allows("read")  # revoked: allows nothing

    code, out, _ = _invoke(
        "webhooks", "add", "https://example.com/hook", "--event", "run.failed", "--db", db, "--json"
    )
    assert code == 0
    hook = json.loads(out)
    assert hook["events"] == ["run.failed"] and len(hook["secret"]) >= 32
    code, out, _ = _invoke("webhooks", "list", "--db", db, "--json")
    assert [h["id"] for h in json.loads(out)] == [hook["id"]]
    code, _, err = _invoke("webhooks", "add", "example.com", "--db", db)
    assert code == 2 and "must start with http" in err
    assert _invoke("webhooks", "remove", hook["id"], "--db", db)[0] == 0
    assert json.loads(_invoke("webhooks", "list", "--db", db, "--json")[1]) == []
    admin.close()
