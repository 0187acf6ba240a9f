"""MCP tool servers (``app.mcp``) against a real server built with the SDK's server
side (examples/mcp_files/fs_server.py) over stdio: schemas reach the model, calls are
journaled tool steps carrying the idempotency key, annotations decide effects
(approval for destructive tools), allowlists and overrides hold, and a server that
changed under a run is a clear error. Crashes and HTTP: tests/test_mcp_faults.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from _mcp import app, folder, ledger_path, stdio, tool_steps

import mainspring as ms
from mainspring.testing import EffectLedger, ScriptedModel
from mainspring.tools import MCPTool

__all__ = ["app", "folder", "ledger_path"]  # fixtures
call = ScriptedModel.call


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
    write = next(s for s in app.observe.steps(run_id) if s.name == "tool:fs_write_file")
    ledger = EffectLedger(ledger_path)
    key = f"{run_id}:{write.session}:{write.seq}"
    assert (ledger.calls(key), ledger.applied(key)) == (1, 1)
    ledger.close()


async def test_destructive_tool_waits_for_approval(
    db_url: str, folder: Path, ledger_path: Path
) -> None:
    app = ms.App(db_url, poll_interval_s=0.01, inline_wait_s=5.0)  # both stores
    try:
        fs = stdio(app, folder, ledger_path)
        model = ScriptedModel(
            [call("fs_delete_file", {"path": "notes.txt"}), call("finish", {"answer": "deleted"})]
        )
        agent = app.agent("cleaner", model=model, instructions="Clean.", tools=[fs])
        run = app.submit(agent, "Delete the notes")
        await app.worker().run(until_idle=True)
        (request,) = app.requests()
        assert request.id.startswith("approval:")
        assert request.preview["effect"] == "irreversible"
        assert app.get_run(run.run_id).status == "waiting"
        assert (folder / "notes.txt").exists()  # nothing deleted before the approval
        app.answer(run.run_id, request.id, decision="approve", by="reviewer")
        await app.worker().run(until_idle=True)
        result = await run.result()
        assert result.answer == "deleted"
        assert not (folder / "notes.txt").exists()
        (delete,) = [s for s in app.observe.steps(run.run_id) if s.name == "tool:fs_delete_file"]
        ledger = EffectLedger(ledger_path)
        assert ledger.calls(f"{run.run_id}:{delete.session}:{delete.seq}") == 1
        ledger.close()
    finally:
        await app.mcp.close()
        app.close()


async def test_allowlist_and_effect_overrides(app: ms.App, folder: Path, ledger_path: Path) -> None:
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


LISTING = [
    {"name": "look", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
    {
        "name": "put",
        "inputSchema": {"type": "object"},
        "annotations": {"idempotentHint": True, "destructiveHint": False},
    },
    {"name": "add", "inputSchema": {"type": "object"}},
    {
        "name": "drop",
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string", "title": "Path"}},
            "required": ["path"],
        },
        "annotations": {"destructiveHint": True},
    },
]


def test_effects_and_modes_come_from_the_annotations(app: ms.App) -> None:
    fs = app.mcp.add(
        "unit", command=["true"], prefix="u_", effects={"add": "read"}, trust_annotations=True
    )
    listed = fs.tools_from(LISTING)
    by_name = {t.name: t for t in listed.tools}
    assert listed.allowed == ("u_look", "u_put", "u_add", "u_drop")
    summary = {n: (t.effect, t.mode, t.requires_approval) for n, t in by_name.items()}
    assert summary == {
        "u_look": ("read", "at_least_once", False),
        "u_put": ("write", "at_least_once", False),  # idempotentHint: may be sent again
        "u_add": ("read", "at_least_once", False),  # overridden by effects=
        "u_drop": ("irreversible", "at_most_once", True),
    }
    trusted = app.mcp.add("plain", command=["true"], trust_annotations=True).tools_from(LISTING)
    add = next(t for t in trusted.tools if t.name == "add")
    # No hint, from a trusted server: MCP's default (destructive) holds, so approval.
    assert (add.effect, add.mode, add.requires_approval) == ("irreversible", "at_most_once", True)
    untrusted = app.mcp.add("stranger", command=["true"], idempotent=["put"]).tools_from(LISTING)
    assert {t.name: (t.effect, t.mode) for t in untrusted.tools} == {
        "look": ("irreversible", "at_most_once"),  # its readOnlyHint is not believed
        "put": ("irreversible", "at_most_once"),  # nor its idempotentHint
        "add": ("irreversible", "at_most_once"),
        "drop": ("irreversible", "at_most_once"),
    }
    drop = by_name["u_drop"]
    assert drop.spec().parameters == {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    }
    with pytest.raises(ms.ToolInputError, match=r"u_drop: .*'path' is a required property"):
        drop.prepare("{}")
    with pytest.raises(ms.ToolInputError, match=r"argument 'path': 3 is not of type 'string'"):
        drop.prepare('{"path": 3}')
    assert drop.prepare('{"path": "a"}') == {"path": "a"}


def test_toolset_configuration_errors(app: ms.App) -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({}, "give command"),
        ({"command": ["x"], "url": "http://h/mcp"}, "not both"),
        ({"command": "python server.py"}, "non-empty list of strings"),
        ({"url": "ftp://h"}, "http:// or https://"),
        ({"url": "http://h/mcp", "env": {"A": "1"}}, "env= and cwd= are for a stdio"),
        ({"command": ["x"], "headers": {"A": "1"}}, "headers= is for url="),
        ({"command": ["x"], "effects": {"a": "dangerous"}}, "effects\\['a'\\] must be one of"),
        ({"command": ["x"], "prefix": "no spaces"}, "prefix 'no spaces'"),
        ({"command": ["x"], "timeout_s": 0}, "timeout_s must be"),
    ]
    for options, message in bad:
        with pytest.raises(ms.ConfigError, match=message):
            app.mcp.add("bad", **options)
    app.mcp.add("twice", command=["x"])
    with pytest.raises(ms.ConfigError, match="already declared"):
        app.mcp.add("twice", command=["x"])
    fs = app.mcp.add("strict", command=["x"], allow=["look", "gone"])
    with pytest.raises(ms.ConfigError, match=r"allow= names tools it does not have: \['gone'\]"):
        fs.tools_from(LISTING)
    odd = [{"name": "has.dot", "inputSchema": {"type": "object"}}]
    with pytest.raises(ms.ConfigError, match=r"'has\.dot'.*not a valid tool name"):
        app.mcp.add("odd", command=["x"]).tools_from(odd)
    assert app.mcp.add("odd2", command=["x"], allow=[]).tools_from(odd).tools == ()
    with pytest.raises(ms.ConfigError, match="tools= takes tools"):
        app.agent("a", model=ScriptedModel([]), instructions="x", tools=["read_file"])  # type: ignore[list-item]


async def test_a_tool_name_clash_is_a_configuration_error(
    app: ms.App, folder: Path, ledger_path: Path
) -> None:
    @app.tool
    def fs_read_file(path: str) -> str:
        """A local tool with the name the server's tool gets."""
        return path

    fs = stdio(app, folder, ledger_path)
    agent = app.agent("clash", model=ScriptedModel([]), instructions="x", tools=[fs_read_file, fs])
    with pytest.raises(ms.RunFailed, match=r"'fs_read_file' of MCPToolset\('fs'.*prefix="):
        await app.run(agent, "go")


async def test_a_run_keeps_its_listing_when_the_server_changes_under_it(
    app: ms.App, folder: Path, ledger_path: Path
) -> None:
    fs = stdio(app, folder, ledger_path)
    model = ScriptedModel(
        [
            call("fs_delete_file", {"path": "notes.txt"}),
            call("finish", {"answer": "tried"}),
        ]
    )
    agent = app.agent("cleaner", model=model, instructions="Clean.", tools=[fs])
    run = app.submit(agent, "Delete the notes")
    await app.worker().run(until_idle=True)
    (request,) = app.requests()  # listed with delete_file; waiting for approval
    # A new deployment of the server no longer has delete_file.
    await app.mcp.close()
    assert fs.env is not None
    fs.env["FS_HIDE"] = "delete_file"
    app.answer(run.run_id, request.id, decision="approve", by="reviewer")
    await app.worker().run(until_idle=True)
    result = await run.result()
    assert result.answer == "tried"
    told = model.requests[1].messages[-1].content
    assert "MCP server 'fs' no longer has the tool 'delete_file'" in told, told
    assert (folder / "notes.txt").exists()
    # The replay after the wait used the journaled listing: one listing step.
    names = [s.name for s in app.observe.steps(run.run_id)]
    assert names.count("mcp:fs:tools") == 1


async def test_a_server_that_cannot_start_fails_the_listing_clearly(app: ms.App) -> None:
    broken = app.mcp.add("broken", command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    agent = app.agent("lost", model=ScriptedModel([]), instructions="x", tools=[broken])
    with pytest.raises(ms.RunFailed) as failed:
        await app.run(agent, "go")
    message = str(failed.value)
    assert "MCP server 'broken' (stdio) could not be reached" in message, message
    (listing,) = app.observe.steps(app.list_runs()[0].id)
    assert (listing.name, listing.status, listing.attempt) == ("mcp:broken:tools", "failed", 3)
