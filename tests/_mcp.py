"""Shared pieces of the MCP tests: the example's real MCP server, started per test."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import mainspring as ms
from mainspring.tools import MCPToolset

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "examples" / "mcp_files" / "fs_server.py"


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
        await made.mcp.close()
        made.close()


def stdio(app: ms.App, folder: Path, ledger: Path, **options: Any) -> MCPToolset:
    """The example server over ``folder`` as the App's MCP server ``fs`` (prefix
    ``fs_``), recording every call in the ledger at ``ledger``. Its annotations are
    trusted (it is our own server) unless ``trust_annotations=False`` is given."""
    env = {"PYTHONPATH": str(ROOT), "FS_LEDGER": str(ledger), **options.pop("env", {})}
    options.setdefault("trust_annotations", True)
    return app.mcp.add(
        "fs", command=[sys.executable, str(SERVER), str(folder)], env=env, prefix="fs_", **options
    )


def tool_steps(app: ms.App, run_id: str) -> list[tuple[str, str, str]]:
    return [(s.name, s.status, s.role) for s in app.observe.steps(run_id) if s.role != "model"]
