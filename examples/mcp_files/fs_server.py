"""A filesystem-like MCP server over one folder, built with the ``mcp`` SDK's server
side: what the example agent uses and what mainspring's MCP tests run, over stdio
(``python fs_server.py FOLDER``) or streamable HTTP (``python fs_server.py FOLDER
--http``, which prints ``PORT <n>`` once it listens on 127.0.0.1).

Its tools say what they do through MCP annotations: ``list_files`` and ``read_file``
are read-only, ``write_file`` is idempotent (writing the same text twice is writing
it once), ``append_line`` is not, and ``delete_file`` is destructive. Every call's
idempotency key (``_meta["mainspring/idempotency_key"]``) is honoured: a repeated
key returns the first answer without doing anything again.

Three switches exist for the tests: ``FS_LEDGER`` (a path) records every call in a
:class:`mainspring.testing.EffectLedger`; ``FS_CRASH`` (``tool:marker-path``) makes
the first call of that tool do its work and then kill the server before it answers;
``FS_HIDE`` (``tool,tool``) leaves tools out, as a newer version of a server might.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
KEY = "mainspring/idempotency_key"
server = MCPServer("files")
_answers: dict[str, str] = {}  # idempotency key -> first answer (this process)


def _path(name: str) -> Path:
    found = (ROOT / name).resolve()
    if found.parent != ROOT:
        raise ValueError(f"{name!r} is not a file name in the folder")
    return found


def _once(ctx: Context, tool: str, arguments: dict[str, Any], effect: Any) -> str:
    """Do ``effect`` once per idempotency key; record the call; crash if told to."""
    key = str((ctx.request_context.meta or {}).get(KEY, ""))
    ledger_path = os.environ.get("FS_LEDGER")
    if ledger_path:  # the tests' record of calls and effects, shared by restarts
        from mainspring.testing import EffectLedger

        first = EffectLedger(ledger_path).apply(key, tool, arguments)
    else:
        first = not key or key not in _answers
    answer = effect() if first else _answers.get(key, "done before (same idempotency key)")
    if key:
        _answers[key] = answer
    crash = os.environ.get("FS_CRASH", "")
    if crash.startswith(f"{tool}:"):
        marker = Path(crash.split(":", 1)[1])
        if not marker.exists():
            marker.write_text("crashed")
            os._exit(1)  # the work is done, the answer never leaves
    return answer


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def list_files() -> list[str]:
    """The names of the files in the folder."""
    return sorted(p.name for p in ROOT.iterdir() if p.is_file())


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def read_file(path: str) -> str:
    """The text of a file."""
    return _path(path).read_text()


@server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True))
def write_file(path: str, content: str, ctx: Context) -> str:
    """Create or replace a file with the given text."""

    def write() -> str:
        _path(path).write_text(content)
        return f"wrote {len(content)} characters to {path}"

    return _once(ctx, "write_file", {"path": path, "content": content}, write)


@server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False))
def append_line(path: str, line: str, ctx: Context) -> str:
    """Add a line at the end of a file."""

    def append() -> str:
        with _path(path).open("a") as f:
            f.write(line + "\n")
        return f"appended to {path}"

    return _once(ctx, "append_line", {"path": path, "line": line}, append)


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def delete_file(path: str, ctx: Context) -> str:
    """Delete a file for good."""

    def delete() -> str:
        _path(path).unlink()
        return f"deleted {path}"

    return _once(ctx, "delete_file", {"path": path}, delete)


async def _serve_http() -> None:
    import uvicorn

    config = uvicorn.Config(
        server.streamable_http_app(), host="127.0.0.1", port=0, log_level="warning"
    )
    http = uvicorn.Server(config)
    task = asyncio.create_task(http.serve())
    while not http.started:  # noqa: ASYNC110 - uvicorn sets a flag, with no event
        await asyncio.sleep(0.01)
    port = http.servers[0].sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    await task


for _hidden in filter(None, os.environ.get("FS_HIDE", "").split(",")):
    server.remove_tool(_hidden)


if __name__ == "__main__":
    if "--http" in sys.argv:
        asyncio.run(_serve_http())
    else:
        server.run()
