"""Journals written by earlier versions still replay: the format never breaks silently.

Each tests/golden/journal_v<N>.db holds runs left mid-flight (sleeping, waiting,
crashed inside a step, between sessions) by the version that wrote it. This
version must open it, migrate it, and finish every run exactly as that version
would have, without re-running a single completed step.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from _helpers import drain
from golden import golden_app

import mainspring as ms

GOLDEN = Path(__file__).parent / "golden"
T0 = 1_767_225_600.0


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("journal_v*.db")), ids=lambda p: p.stem)
async def test_golden_journal_replays(path: Path, tmp_path: Path) -> None:
    meta = json.loads(path.with_suffix(".json").read_text())
    ids = meta["run_ids"]
    db = tmp_path / path.name
    shutil.copy(path, db)  # never touch the committed file
    clock = ms.FakeClock(T0 + 7200)  # the sleep is over, the crashed worker's lease too
    app = ms.App(f"sqlite:///{db}", clock=clock, rng=random.Random(99), poll_interval_s=0.01)
    golden_app.build(app)
    golden_app.CALLS.clear()
    golden_app.CRASH_AT.clear()

    app.signal(ids["waiter"], "approve", {"by": "golden"})
    app.signal(ids["sessions"], "finish", 1)
    await drain(app)

    results = {name: await app.result(run_id) for name, run_id in ids.items()}
    assert results["sleeper"] == [0, 2, 4, 6, 200]
    crasher = ids["crasher"]
    assert results["crasher"] == [
        0,
        2,
        4,
        {"charged": 500, "key": f"{crasher}:0:3"},
        "interrupted",  # the at_most_once charge died mid-call: never re-run
    ]
    assert results["sessions"] == {"done": 7, "session": 1, "signal": 1}
    waiter = results["waiter"]
    journal = {r.kind: r for r in app.observe.steps(ids["waiter"])}
    assert waiter["loud"] == "HELLO"
    assert waiter["when"] == "2026-01-01T00:00:00+00:00"  # journaled, not the new clock
    assert waiter["uuid"] == json.loads(journal["uuid"].output or "null")
    assert waiter["roll"] == json.loads(journal["random"].output or "null")
    assert waiter["approval"] == {"by": "golden"}
    assert waiter["retried"] == 7
    assert waiter["refused"] == "builtins.ValueError"
    # Only the steps that had not completed ran: nothing journaled ran again.
    assert sorted(golden_app.CALLS) == sorted(["double:100", "flaky:7", "flaky:7", "refuse:1"])
    app.close()
