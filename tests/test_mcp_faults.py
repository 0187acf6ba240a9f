"""MCP servers that fail: a stdio server that dies mid-call is restarted, an
idempotent write is sent again with its key and takes effect once, a non-idempotent
one is an unknown outcome never sent again; and a streamable HTTP server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _mcp import ROOT, SERVER, app, folder, ledger_path, stdio

import mainspring as ms
from mainspring.testing import EffectLedger, ScriptedModel

__all__ = ["app", "folder", "ledger_path"]  # fixtures
call = ScriptedModel.call


@pytest.fixture
def http_url(folder: Path, ledger_path: Path) -> Iterator[str]:
    """The example server over ``folder`` on streamable HTTP (a port of its own)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FS_LEDGER": str(ledger_path)}
    server = subprocess.Popen(
        [sys.executable, str(SERVER), str(folder), "--http"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert server.stdout is not None
    try:
        line = server.stdout.readline()
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}/mcp"
    finally:
        server.terminate()
        server.wait(timeout=30)
        server.stdout.close()


async def test_streamable_http_server(app: ms.App, http_url: str, ledger_path: Path) -> None:
    web = app.mcp.add("web", url=http_url, headers={"X-Team": "ops"}, trust_annotations=True)
    model = ScriptedModel(
        [
            call("write_file", {"path": "a.txt", "content": "alpha"}),
            call("read_file", {"path": "a.txt"}),
            call("finish", {"answer": "ok"}),
        ]
    )
    agent = app.agent("web_clerk", model=model, instructions="Files.", tools=[web])
    result = await app.run(agent, "Write then read")
    assert result.status == "done"
    assert any("alpha" in getattr(m, "content", "") for m in model.requests[2].messages)
    run_id = app.list_runs()[0].id
    write = next(s for s in app.observe.steps(run_id) if s.name == "tool:write_file")
    assert write.role == "tool"
    ledger = EffectLedger(ledger_path)
    assert ledger.applied(f"{run_id}:{write.session}:{write.seq}") == 1
    ledger.close()


async def test_idempotent_write_survives_a_server_crash_mid_call(
    app: ms.App, folder: Path, ledger_path: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "crashed"
    fs = stdio(app, folder, ledger_path, env={"FS_CRASH": f"write_file:{marker}"})
    model = ScriptedModel(
        [
            call("fs_write_file", {"path": "out.txt", "content": "once"}),
            call("finish", {"answer": "written"}),
        ]
    )
    agent = app.agent("writer", model=model, instructions="Write.", tools=[fs])
    result = await app.run(agent, "Write out.txt")
    assert marker.exists()  # the first server died during the call
    assert (result.status, result.answer) == ("done", "written")
    run_id = app.list_runs()[0].id
    (write,) = [s for s in app.observe.steps(run_id) if s.name == "tool:fs_write_file"]
    assert (write.status, write.attempt) == ("completed", 2)
    key = f"{run_id}:{write.session}:{write.seq}"
    ledger = EffectLedger(ledger_path)
    # Sent twice with one key (the restarted server recognised it): one effect.
    assert (ledger.calls(key), ledger.applied(key)) == (2, 1)
    assert ledger.report().duplicate_effects == {}
    ledger.close()
    assert (folder / "out.txt").read_text() == "once"


async def test_non_idempotent_write_is_not_sent_again_after_a_crash(
    app: ms.App, folder: Path, ledger_path: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "crashed"
    fs = stdio(app, folder, ledger_path, env={"FS_CRASH": f"append_line:{marker}"})
    model = ScriptedModel(
        [
            call("fs_append_line", {"path": "notes.txt", "line": "call Ana"}),
            call("fs_read_file", {"path": "notes.txt"}),  # the server was restarted
            call("finish", {"answer": "checked"}),
        ]
    )
    agent = app.agent("appender", model=model, instructions="Append.", tools=[fs])
    result = await app.run(agent, "Append a line")
    assert result.status == "done"
    run_id = app.list_runs()[0].id
    (append,) = [s for s in app.observe.steps(run_id) if s.name == "tool:fs_append_line"]
    assert (append.status, append.attempt) == ("failed", 1)
    told = model.requests[1].messages[-1].content
    assert "may or may not have taken effect" in told and "append_line" in told
    ledger = EffectLedger(ledger_path)
    assert ledger.calls(f"{run_id}:{append.session}:{append.seq}") == 1
    ledger.close()
    assert (folder / "notes.txt").read_text() == "buy milk\ncall Ana\n"


def _server_pids() -> list[int]:
    """The example servers this test process started (its children)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"fs_server.py" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the server's process in /proc")
async def test_a_server_that_died_between_calls_is_restarted_before_a_write(
    app: ms.App, folder: Path, ledger_path: Path
) -> None:
    fs = stdio(app, folder, ledger_path)
    model = ScriptedModel(
        [
            call("fs_read_file", {"path": "notes.txt"}),
            call("fs_delete_file", {"path": "notes.txt"}),  # irreversible: approval first
            call("finish", {"answer": "deleted"}),
        ]
    )
    agent = app.agent("cleaner", model=model, instructions="Clean.", tools=[fs])
    run = app.submit(agent, "Delete the notes")
    await app.worker().run(until_idle=True)
    (request,) = app.requests()
    (pid,) = _server_pids()
    os.kill(pid, signal.SIGKILL)  # the server dies while the run waits
    app.answer(run.run_id, request.id, decision="approve", by="reviewer")
    await app.worker().run(until_idle=True)
    result = await run.result()
    assert result.answer == "deleted"
    assert not (folder / "notes.txt").exists()
    (delete,) = [s for s in app.observe.steps(run.run_id) if s.name == "tool:fs_delete_file"]
    assert (delete.status, delete.attempt) == ("completed", 1)  # found dead before sending
    ledger = EffectLedger(ledger_path)
    assert ledger.calls(f"{run.run_id}:{delete.session}:{delete.seq}") == 1
    ledger.close()
