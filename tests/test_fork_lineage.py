"""A fork records where it came from (its parent run and step): in the store, in
``mainspring show`` (text and JSON), in the HTTP API and on the dashboard's run page."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fastapi.testclient import TestClient
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.server import create_app


def test_a_fork_names_its_parent_run_and_step(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'fork.db'}"
    app = ms.App(db)

    @app.workflow
    async def two(ctx: ms.RunContext) -> int:
        a = await ctx.step(lambda: 1, name="a")
        return a + await ctx.step(lambda: 2, name="b")

    try:
        source = app.submit(two).run_id
        asyncio.run(app.worker().run(until_idle=True))
        fork = app.fork(source, from_step=0).run_id
        record = app.get_run(fork)
        assert (record.parent, record.parent_step) == (source, "0:0")
        assert app.get_run(source).parent is None  # a run that is no fork
        _, admin = app.store.create_api_key("ops", ["admin"], app.clock.now())
        with TestClient(create_app(app, webhooks=False)) as client:
            body = client.get(f"/runs/{fork}", headers={"Authorization": f"Bearer {admin}"})
            assert (body.json()["parent"], body.json()["parent_step"]) == (source, "0:0")
            r = client.post(
                "/ui/login",
                content=f"key={admin}",
                headers={
                    "Origin": "http://testserver",
                    "Content-Type": "application/x-www-form-urlencoded",
                },
                follow_redirects=False,
            )
            assert r.status_code in (302, 303), r.text
            page = client.get(f"/ui/runs/{fork}").text
            assert f'href="/ui/runs/{source}" id="run-parent"' in page
    finally:
        app.close()
    shown = CliRunner().invoke(cli, ["show", fork, "--db", db])
    assert f"forked from  run {source}, step 0:0" in shown.output
    data = json.loads(CliRunner().invoke(cli, ["show", fork, "--db", db, "--json"]).stdout)
    assert data["run"]["parent"] == {
        "run": source,
        "step": "0:0",
        "kind": "fork",
        "close": None,
    }
