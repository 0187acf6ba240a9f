"""The files agent: its tools are the MCP server's, prefixed ``fs_``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import mainspring as ms
from mainspring.testing import ScriptedModel

SERVER = Path(__file__).resolve().parent / "fs_server.py"
call = ScriptedModel.call


def build(app: ms.App, folder: Path) -> ms.AgentWorkflow[Any]:
    """The agent, on an MCP server started (per worker process) over ``folder``."""
    fs = app.mcp.add(
        "files",
        command=[sys.executable, str(SERVER), str(folder)],
        # The server imports nothing of mainspring unless FS_LEDGER is set; the path
        # lets it find the repository's copy when it does.
        env={"PYTHONPATH": str(SERVER.parents[2])},
        prefix="fs_",
        # Our own server: its annotations (read-only, idempotent, destructive) are
        # believed. An untrusted server's every call would wait for a person.
        trust_annotations=True,
    )
    model = ScriptedModel(
        [
            call("fs_list_files", {}),
            call("fs_read_file", {"path": "inbox.txt"}),
            call("fs_write_file", {"path": "summary.txt", "content": "2 errands: milk, Ana"}),
            call("fs_delete_file", {"path": "inbox.txt"}),
            call("finish", {"answer": "Summarised the inbox and deleted it."}),
        ]
    )
    return app.agent(
        "files",
        model=model,
        instructions="Keep the folder tidy: summarise notes, then delete them.",
        tools=[fs],
    )
