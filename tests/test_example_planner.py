"""examples/planner: a planner agent delegating to two specialist agents (as tools,
each a child run), one of which asks a person to approve its irreversible tool."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mainspring as ms
from examples.planner import build

ROOT = Path(__file__).resolve().parent.parent


async def test_the_planner_waits_for_its_specialists_approval(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'planner.db'}", poll_interval_s=0.01)
    team = build(app)
    try:
        run = app.submit(team.planner, "Write and publish a post")
        await app.worker().run(until_idle=True)
        (request,) = app.requests()
        researcher, publisher = app.children(run.run_id)
        assert (researcher.workflow, researcher.status) == ("researcher", "succeeded")
        assert (publisher.workflow, publisher.status) == ("publisher", "waiting")
        assert request.run_id == publisher.id and request.id.startswith("approval:")
        assert app.get_run(run.run_id).wait_reason == f"child:{publisher.id}"
        assert team.published == []  # nothing published before the approval
        app.answer(publisher.id, request.id, decision="approve", by="reviewer")
        await app.worker().run(until_idle=True)
        result = await run.result()
        assert (result.status, result.answer) == ("done", "Researched, written and published.")
        assert [p["title"] for p in team.published] == ["Why durable runs"]
        assert team.published[0]["key"].startswith(f"{publisher.id}:")
        assert {c.parent for c in app.children(run.run_id)} == {run.run_id}
    finally:
        app.close()


def test_the_planner_example_runs_from_the_shell() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.planner"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "child publisher: succeeded" in done.stdout
    assert "published: ['Why durable runs']" in done.stdout
