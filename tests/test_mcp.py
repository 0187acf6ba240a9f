"""MCP tool servers (``app.mcp``) against a real server built with the SDK's server
side (examples/mcp_files/fs_server.py), over stdio and streamable HTTP: schemas reach
the model, calls are journaled tool steps carrying the idempotency key, annotations
decide effects (approval for destructive tools), allowlists hold, and a server that
dies mid-call is restarted with each write taking effect once."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import mainspring as ms
from mainspring.testing import EffectLedger, ScriptedModel
from mainspring.tools import MCPTool, MCPToolset

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "examples" / "mcp_files" / "fs_server.py"
call = ScriptedModel.call


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    made = tmp_path / "files"
    made.mkdir()
    (made / "notes.txt").write_text("buy milk\n")
    return made


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[ms.App]:
    made = ms.App(f"sqlite:///{tmp_path / 'ms.db'}", poll_interval_s=0.01, inline_wait_s=5.0)
    try:
        yield made
    finally:
        await made.close_mcp()
        made.close()


def stdio(app: ms.App, folder: Path, ledger: Path, **options: Any) -> MCPToolset:
    env = {"PYTHONPATH": str(ROOT), "FS_LEDGER": str(ledger), **options.pop("env", {})}
    return app.mcp(
        "fs", command=[sys.executable, str(SERVER), str(folder)], env=env, prefix="fs_", **options
    )


def tool_steps(app: ms.App, run_id: str) -> list[tuple[str, str, str]]:
    return [(s.name, s.status, s.role) for s in app.steps(run_id) if s.role != "model"]


async def test_stdio_tools_reach_the_model_and_run_as_tool_steps(
    app: ms.App, folder: Path, ledger_path: Path
) -> None:
    fs = stdio(app, folder, ledger_path)
    model = ScriptedModel(
        [
            call("fs_list_files", {}),
            call("fs_read_file", {"path": "notes.txt"}),
            call("fs_write_file", {"path": "todo.txt", "content": "call Ana"}),
            call("finish", {"answer": "done"}),
        ]
    )
    agent = app.agent("clerk", model=model, instructions="Keep files.", tools=[fs])
    result = await app.run(agent, "Tidy up")
    assert (result.status, result.answer, result.tool_calls) == ("done", "done", 3)
    assert (folder / "todo.txt").read_text() == "call Ana"
    # The server's schemas and descriptions are what the model was told.
    specs = {t.name: t for t in model.requests[0].tools}
    assert {"fs_list_files", "fs_read_file", "fs_write_file", "fs_delete_file"} <= set(specs)
    assert specs["fs_read_file"].description == "The text of a file."
    assert specs["fs_read_file"].parameters["properties"] == {"path": {"type": "string"}}
    assert specs["fs_read_file"].parameters["required"] == ["path"]
    # The model saw what the server read.
    assert any("buy milk" in getattr(m, "content", "") for m in model.requests[2].messages)
    run_id = app.list_runs()[0].id
    assert tool_steps(app, run_id) == [
        ("mcp:fs:tools", "completed", "step"),
        ("tool:fs_list_files", "completed", "tool"),
        ("tool:fs_read_file", "completed", "tool"),
        ("tool:fs_write_file", "completed", "tool"),
    ]
    # The write carried the step's idempotency key to the server.
    write = next(s for s in app.steps(run_id) if s.name == "tool:fs_write_file")
    ledger = EffectLedger(ledger_path)
    key = f"{run_id}:{write.session}:{write.seq}"
    assert (ledger.calls(key), ledger.applied(key)) == (1, 1)
    ledger.close()


async def test_streamable_http_server(app: ms.App, folder: Path, ledger_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FS_LEDGER": str(ledger_path)}
    server = subprocess.Popen(
        [sys.executable, str(SERVER), str(folder), "--http"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("PORT "), line
        url = f"http://127.0.0.1:{int(line.split()[1])}/mcp"
        web = app.mcp("web", url=url, headers={"X-Team": "ops"})
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
        write = next(s for s in app.steps(run_id) if s.name == "tool:write_file")
        ledger = EffectLedger(ledger_path)
        assert ledger.applied(f"{run_id}:{write.session}:{write.seq}") == 1
        ledger.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        if server.stdout is not None:
            server.stdout.close()


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
    (write,) = [s for s in app.steps(run_id) if s.name == "tool:fs_write_file"]
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
    (append,) = [s for s in app.steps(run_id) if s.name == "tool:fs_append_line"]
    assert (append.status, append.attempt) == ("failed", 1)
    told = model.requests[1].messages[-1].content
    assert "may or may not have taken effect" in told and "append_line" in told
    ledger = EffectLedger(ledger_path)
    assert ledger.calls(f"{run_id}:{append.session}:{append.seq}") == 1
    ledger.close()
    assert (folder / "notes.txt").read_text() == "buy milk\ncall Ana\n"


async def test_destructive_tool_waits_for_approval(
    app: ms.App, folder: Path, ledger_path: Path
) -> None:
    fs = stdio(app, folder, ledger_path)
    model = ScriptedModel(
        [call("fs_delete_file", {"path": "notes.txt"}), call("finish", {"answer": "deleted"})]
    )
    agent = app.agent("cleaner", model=model, instructions="Clean.", tools=[fs])
    run = app.submit(agent, "Delete the notes")
    await app.worker().run(until_idle=True)
    (request,) = app.requests()
    assert request.id.startswith("approval:")
    assert app.get_run(run.run_id).status == "waiting"
    assert (folder / "notes.txt").exists()  # nothing deleted before the approval
    app.answer(run.run_id, request.id, decision="approve", by="reviewer")
    await app.worker().run(until_idle=True)
    result = await run.result()
    assert result.answer == "deleted"
    assert not (folder / "notes.txt").exists()


async def test_allowlist_and_effect_overrides(
    app: ms.App, folder: Path, ledger_path: Path
) -> None:
    fs = stdio(
        app,
        folder,
        ledger_path,
        allow=["read_file", "write_file"],
        effects={"write_file": "irreversible"},
    )
    model = ScriptedModel([call("fs_delete_file", {"path": "notes.txt"})])
    agent = app.agent("reader", model=model, instructions="Read.", tools=[fs])
    with pytest.raises(ms.RunFailed) as failed:
        await app.run(agent, "Delete the notes")
    assert "ToolNotAllowed" in str(failed.value) and "fs_delete_file" in str(failed.value)
    assert sorted(t.name for t in model.requests[0].tools if t.name.startswith("fs_")) == [
        "fs_read_file",
        "fs_write_file",
    ]
    assert (folder / "notes.txt").exists()
    # write_file is irreversible here: it needs an approval.
    model2 = ScriptedModel([call("fs_write_file", {"path": "x.txt", "content": "x"})])
    writer = app.agent("writer2", model=model2, instructions="Write.", tools=[fs])
    run = app.submit(writer, "Write x")
    await app.worker().run(until_idle=True)
    assert app.get_run(run.run_id).status == "waiting"
    assert not (folder / "x.txt").exists()


async def test_a_tool_that_changed_on_the_server_is_a_clear_error(
    app: ms.App, folder: Path, ledger_path: Path
) -> None:
    fs = stdio(app, folder, ledger_path)
    connection = await fs.connect()
    listing = fs.tools_from(connection.tools)
    read = next(t for t in listing.tools if t.name == "fs_read_file")
    assert isinstance(read, MCPTool)
    changed = MCPTool.from_listing(
        fs,
        {"name": "read_file", "inputSchema": {"type": "object", "properties": {}}},
        "fs_read_file",
    )
    gone = MCPTool.from_listing(fs, {"name": "shred_file", "inputSchema": {}}, "fs_shred")

    @app.workflow
    async def use(ctx: ms.RunContext, which: str) -> Any:
        tool = changed if which == "changed" else gone
        return await tool.run(ctx, {"path": "notes.txt"})

    for which, words in (("changed", "changed the input schema"), ("gone", "no longer has")):
        with pytest.raises(ms.RunFailed) as failed:
            await app.run(use, which)
        message = str(failed.value)
        assert words in message and "'fs'" in message, message
        assert ("'read_file'" if which == "changed" else "'shred_file'") in message
