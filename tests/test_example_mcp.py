"""examples/mcp_files: an agent whose tools come from the filesystem-like MCP server
the tests use, with its destructive tool approved by a person."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mainspring as ms
from examples.mcp_files import build

ROOT = Path(__file__).resolve().parent.parent


async def test_the_files_agent_waits_for_approval_before_deleting(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "inbox.txt").write_text("buy milk\ncall Ana\n")
    app = ms.App(f"sqlite:///{tmp_path / 'files.db'}", poll_interval_s=0.01)
    agent = build(app, files)
    try:
        run = app.submit(agent, "Tidy the folder")
        await app.worker().run(until_idle=True)
        (request,) = app.requests()
        assert request.preview["tool"] == "fs_delete_file"
        assert (files / "summary.txt").read_text() == "2 errands: milk, Ana"
        assert (files / "inbox.txt").exists()  # nothing deleted before the approval
        app.answer(run.run_id, request.id, decision="approve", by="reviewer")
        await app.worker().run(until_idle=True)
        result = await run.result()
        assert result.answer == "Summarised the inbox and deleted it."
        assert sorted(p.name for p in files.iterdir()) == ["summary.txt"]
    finally:
        await app.mcp.close()
        app.close()


def test_the_files_example_runs_from_the_shell() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.mcp_files"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "step tool:fs_delete_file: completed" in done.stdout
    assert "files: ['summary.txt']" in done.stdout
