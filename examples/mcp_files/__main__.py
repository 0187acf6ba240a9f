"""``python -m examples.mcp_files``: the files agent, in-process; the deletion is
approved by this script, as a reviewer would from the dashboard."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import mainspring as ms

from .agent import build


async def run(folder: Path) -> int:
    files = folder / "files"
    files.mkdir(exist_ok=True)
    (files / "inbox.txt").write_text("buy milk\ncall Ana\n")
    app = ms.App(f"sqlite:///{folder / 'files.db'}")
    agent = build(app, files)
    try:
        run = app.submit(agent, "Tidy the folder")
        await app.worker().run(until_idle=True)
        (request,) = app.requests()  # fs_delete_file is destructive: approval first
        print(f"waiting for {request.id!r}: {request.title}")
        app.answer(request.run_id, request.id, decision="approve", by="reviewer")
        await app.worker().run(until_idle=True)
        result = await run.result()
        for step in app.observe.steps(run.run_id):
            if step.role != "model":
                print(f"step {step.name}: {step.status}")
        print(f"files: {sorted(p.name for p in files.iterdir())}")
        print(f"answer: {result.answer}")
        return 0 if result.status == "done" and not (files / "inbox.txt").exists() else 1
    finally:
        await app.mcp.close()
        app.close()


def main() -> int:
    return asyncio.run(run(Path(tempfile.mkdtemp(prefix="mainspring-mcp-"))))


if __name__ == "__main__":
    sys.exit(main())
