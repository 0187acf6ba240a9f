"""``/metrics`` render time with 1,000, 10,000 and 100,000 runs in the store.

Fills a SQLite store with N runs (90 % succeeded, 4 % waiting, 3 % queued, 3 %
failed, changed one after another over the past day), each with a three-step journal
(a model call with tokens, a tool call, a plain step), written with bulk INSERTs so
that filling stays quick. Then times what a server does per scrape with one kept
collector (``app.observe.metrics().render()``): the first scrape (every journal read once) and
later scrapes (median of ``--repeat``), beside a bare ``SELECT id, workflow, status,
updated_at FROM ms_runs`` (the floor of any scrape that looks at every run, which a
kept collector no longer does), as a ratio. A report: nothing is asserted.
``python bench/metrics_scrape.py [--sizes 1000,10000,100000] [--repeat 5]``
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import mainspring as ms


def _fill(path: Path, n: int) -> ms.App:
    app = ms.App(f"sqlite:///{path}")
    app.store.count_runs()  # runs the migrations
    now = time.time()
    reply = json.dumps(
        {"text": "", "tool_calls": [], "usage": {"input_tokens": 900, "output_tokens": 40}}
    )
    runs, steps = [], []
    for i in range(n):
        run_id = f"run_{i:07d}"
        r = i % 100
        status = (
            "succeeded" if r < 90 else "waiting" if r < 94 else "queued" if r < 97 else "failed"
        )
        # Runs changed over the past day, one after another (as a fleet makes them):
        # what a scrape's look-back for late commits re-reads is the last minute's.
        changed = now - 86400 + 86400 * (i + 1) / n
        finished = changed if status in ("succeeded", "failed") else None
        reason = "signal:go" if status == "waiting" else None
        runs.append((run_id, "bench", status, "[]", changed - 30, changed, finished, reason))
        if status == "queued":
            continue
        for seq, (name, output) in enumerate(
            [("model:openai:gpt-4.1", reply), ("tool:lookup", '{"ok":true}'), ("shout", '"A"')]
        ):
            steps.append((run_id, seq, name, output, now - 50 + seq, now - 49.5 + seq))
    db = sqlite3.connect(path)
    with db:
        db.executemany(
            "INSERT INTO ms_runs (id, workflow, status, input, session, created_at, updated_at,"
            " finished_at, wait_reason, epoch) VALUES (?, ?, ?, ?, 0, ?, ?, ?, ?, 1)",
            runs,
        )
        db.executemany(
            "INSERT INTO ms_steps (run_id, session, seq, kind, name, status, attempt, epoch,"
            " output, started_at, finished_at) VALUES (?, 0, ?, 'step', ?, 'completed', 1, 1,"
            " ?, ?, ?)",
            steps,
        )
    db.close()
    return app


def _ms(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes", default="1000,10000,100000", help="runs in the store, comma-separated"
    )
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    print(
        f"{'runs':>8} {'fill s':>7} {'first ms':>9} {'scrape ms':>10} {'floor ms':>9} {'ratio':>6}"
    )
    for n in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "m.db"
            t0 = time.perf_counter()
            app = _fill(path, n)
            fill_s = time.perf_counter() - t0
            collector = app.observe.metrics()
            first = _ms(collector.render)
            scrape = statistics.median(_ms(collector.render) for _ in range(args.repeat))
            floor = statistics.median(_ms(app.store.run_stamps) for _ in range(args.repeat))
            print(
                f"{n:>8} {fill_s:>7.1f} {first:>9.1f} {scrape:>10.1f} {floor:>9.1f}"
                f" {scrape / floor:>6.1f}"
            )
            app.close()


if __name__ == "__main__":
    main()
