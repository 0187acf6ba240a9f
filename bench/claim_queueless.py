"""Claim cost of runs in no queue (what queues must not slow): N runs submitted, then
claimed one at a time, then N claims that find nothing (an idle poll).

Run it with PYTHONPATH pointing at two checkouts to compare them, alternating a few
times on a busy machine and comparing the best of each::

    PYTHONPATH=/path/to/checkout python bench/claim_queueless.py sqlite|postgres [N]

postgres: ``MAINSPRING_BENCH_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/``);
the script makes a database of its own and drops it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid

from mainspring.storage import open_store


def bench(url: str, n: int) -> tuple[float, float]:
    """Microseconds per claim that takes one run, and per claim that finds none."""
    s = open_store(url)
    for i in range(n):
        s.create_run(run_id=f"r{i:06d}", workflow="w", input="[]", key=None, now=1000.0 + i)
    claim = {"worker": "a", "now": 5000.0, "lease_s": 1e6, "workflows": ["w"], "max_recoveries": 5}
    t = time.perf_counter()
    for _ in range(n):
        assert len(s.claim(limit=1, **claim)) == 1  # type: ignore[arg-type]
    taking = (time.perf_counter() - t) / n * 1e6
    t = time.perf_counter()
    for _ in range(n):
        s.claim(limit=8, **claim)  # type: ignore[arg-type]
    idle = (time.perf_counter() - t) / n * 1e6
    s.close()
    return taking, idle


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "sqlite"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    if kind == "sqlite":
        url = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
        taking, idle = bench(url, n)
        print(f"sqlite: claim {taking:.0f} us, empty claim {idle:.0f} us")
        return
    import psycopg

    base = os.environ.get("MAINSPRING_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/")
    name = "claim_bench_" + uuid.uuid4().hex[:8]
    with psycopg.connect(base + "postgres", autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    try:
        taking, idle = bench(base + name, n)
        print(f"postgres: claim {taking:.0f} us, empty claim {idle:.0f} us")
    finally:
        with psycopg.connect(base + "postgres", autocommit=True) as c:
            c.execute(f"DROP DATABASE {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
