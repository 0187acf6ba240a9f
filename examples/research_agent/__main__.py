"""``python -m examples.research_agent``: a three-session research run, in-process."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import mainspring as ms
from mainspring.models import ScriptedModel

from .agent import build, script


def main() -> int:
    folder = Path(tempfile.mkdtemp(prefix="mainspring-research-"))
    app = ms.App(f"sqlite:///{folder / 'research.db'}")
    model = ScriptedModel(script(), model_id="researcher")
    researcher = build(app, model)
    try:
        result = asyncio.run(app.run(researcher, "How does a durable runtime avoid repeats?"))
    finally:
        app.close()
    print(f"status {result.status} after {result.turns} turns in {result.sessions} sessions")
    print(f"hand-off state: facts {result.state['facts']}, notes {result.state['notes']}")
    print(f"model requests: {[len(r.messages) for r in model.requests]} messages each")
    print(f"answer (written from the last hand-off): {result.answer}")
    return 0 if result.status == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
