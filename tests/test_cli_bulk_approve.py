"""``mainspring approve --all-pending [--workflow W]``: every pending approval decided at
once, as the local user, and nothing else (questions, other workflows) touched."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

import mainspring as ms
from mainspring._app import local_user
from mainspring.cli import cli


def _json(*args: str) -> object:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_all_pending_approvals_of_a_workflow_are_decided_at_once(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'bulk.db'}"
    app = ms.App(db)

    @app.workflow
    async def deploy(ctx: ms.RunContext, env: str) -> bool:
        return (await ctx.approval("ship", preview={"env": env})).approved

    @app.workflow
    async def refund(ctx: ms.RunContext) -> bool:
        return (await ctx.approval("pay")).approved

    @app.workflow
    async def asks(ctx: ms.RunContext) -> str:
        return await ctx.ask("colour?")

    deploys = [app.submit(deploy, env).run_id for env in ("a", "b", "c")]
    other = app.submit(refund).run_id
    question = app.submit(asks).run_id
    drain = lambda: asyncio.run(app.worker().run(until_idle=True))  # noqa: E731
    try:
        drain()
        assert len(app.requests()) == 5
        out = _json(
            "approve", "--all-pending", "--workflow", "deploy", "--yes", "--db", db, "--json"
        )
        assert isinstance(out, dict) and (out["decision"], out["failed"]) == ("approve", [])
        assert sorted((d["run_id"], d["request"]) for d in out["decided"]) == sorted(
            (r, "approval:ship") for r in deploys
        )
        drain()
        for run_id in deploys:
            assert app.get_run(run_id).output == "true"
        step = next(s for s in app.observe.steps(deploys[0]) if s.name == "approval:ship")
        assert local_user() in (step.output or "")
        # The other workflow's approval and the question are still waiting.
        assert sorted(r.run_id for r in app.requests()) == sorted([other, question])
        # Without --workflow: the remaining approval, still not the question.
        rejected = _json("approve", "--all-pending", "--reject", "no", "-y", "--db", db, "--json")
        assert rejected == {
            "decision": "reject",
            "decided": [{"run_id": other, "request": "approval:pay"}],
            "failed": [],
        }
        assert [r.run_id for r in app.requests()] == [question]
    finally:
        app.close()
    bad = CliRunner().invoke(cli, ["approve", "--all-pending", deploys[0], "--db", db])
    assert bad.exit_code == 2 and "give no RUN" in bad.output
