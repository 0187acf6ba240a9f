"""An agent whose tools come from an MCP server: ``fs_server.py``, a filesystem-like
server over one folder built with the ``mcp`` SDK (the one mainspring's MCP tests
run). The agent lists the folder, reads a note, writes a summary (an idempotent
write) and deletes the note (a destructive tool, so a person approves it first). A
scripted model plays every turn: ``python -m examples.mcp_files`` runs it with no API
key (it needs the ``mcp`` extra).
"""

from .agent import SERVER, build

__all__ = ["SERVER", "build"]
