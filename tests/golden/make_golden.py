"""Write tests/golden/journal_v<N>.db: runs left mid-flight by this version.

Run it once per journal format (python tests/golden/make_golden.py); commit the
file; never regenerate an old one.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import mainspring as ms  # noqa: E402
from golden import golden_app  # noqa: E402
from mainspring.storage import SCHEMA_VERSION  # noqa: E402

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


async def make(path: Path) -> dict[str, str]:
    clock = ms.FakeClock(T0)
    app = ms.App(f"sqlite:///{path}", clock=clock, rng=random.Random(7), poll_interval_s=0.01)
    golden_app.build(app)
    ids = {
        "sleeper": app.submit("sleeper", 4, key="sleeper").run_id,
        "waiter": app.submit("waiter", "hello", key="waiter").run_id,
        "crasher": app.submit("crasher", 3, key="crasher").run_id,
        "sessions": app.submit("sessions", 3, 7, key="sessions").run_id,
    }
    golden_app.CRASH_AT.update({"charge:500", "charge:700"})
    worker = app.worker()
    await worker.run(until_idle=True)  # crasher dies in charge:500
    clock.advance(app.lease_s + 1)
    await worker.run(until_idle=True)  # ...re-runs charge:500, dies in charge:700
    app.close()
    return ids


def main() -> None:
    path = HERE / f"journal_v{SCHEMA_VERSION}.db"
    if path.exists():
        sys.exit(f"{path} exists: golden files are never regenerated")
    ids = asyncio.run(make(path))
    (HERE / f"journal_v{SCHEMA_VERSION}.json").write_text(
        json.dumps({"run_ids": ids, "calls": golden_app.CALLS}, indent=2) + "\n"
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
