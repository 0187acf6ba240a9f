"""``python -m examples.planner``: the planner and its specialists, in-process; the
publisher's approval is given by this script, as a reviewer would from the dashboard."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import mainspring as ms

from .agent import build


async def run(folder: Path) -> int:
    app = ms.App(f"sqlite:///{folder / 'planner.db'}")
    team = build(app)
    try:
        run = app.submit(team.planner, "Write and publish a post on durable runs")
        await app.worker().run(until_idle=True)
        (request,) = app.requests()  # the publisher's approval; the planner waits on it
        waiting = app.get_run(run.run_id)
        print(f"planner {waiting.status} ({waiting.wait_reason})")
        print(f"request {request.id!r} of run {request.run_id} ({request.workflow})")
        app.answer(request.run_id, request.id, decision="approve", by="reviewer")
        await app.worker().run(until_idle=True)
        result = await run.result()
        for child in app.children(run.run_id):
            print(f"child {child.workflow}: {child.status}")
        print(f"published: {[p['title'] for p in team.published]}")
        print(f"answer: {result.answer}")
        return 0 if result.status == "done" and len(team.published) == 1 else 1
    finally:
        app.close()


def main() -> int:
    return asyncio.run(run(Path(tempfile.mkdtemp(prefix="mainspring-planner-"))))


if __name__ == "__main__":
    sys.exit(main())
