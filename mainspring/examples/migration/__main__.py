"""``python -m mainspring.examples.migration [--count N] [--reject] [--drop ID ...]``"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter

from .local import run_local


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mainspring.examples.migration", description=__doc__
    )
    parser.add_argument("--count", type=int, default=60, help="legacy rows to export")
    parser.add_argument("--reject", action="store_true", help="reject the stage gate")
    parser.add_argument(
        "--drop",
        action="append",
        default=[],
        metavar="ID",
        help="a customer the target loses (reconciliation fails; the import is undone)",
    )
    parser.add_argument("--dir", help="where the databases go (default: a new temp dir)")
    args = parser.parse_args(argv)
    if not 1 <= args.count <= 9999:
        parser.error(f"--count must be between 1 and 9999, got {args.count}")
    folder = args.dir or tempfile.mkdtemp(prefix="mainspring-migration-")
    out = run_local(folder, args.count, approve=not args.reject, drops=tuple(args.drop))
    by_name = Counter(s.name for s in out.steps)
    retried = [s for s in out.steps if s.attempt > 1]
    print(f"run {out.run_id}: {out.status}  (databases in {folder})")
    print(f"stage gate 'import' previewed: {json.dumps(out.gate_preview)[:300]}...")
    print("journal: " + ", ".join(f"{n} ×{c}" for n, c in by_name.items()))
    print(f"retried steps: {len(retried)} ({', '.join(f'{s.seq}:{s.name}' for s in retried)})")
    print(f"model faults injected: {out.model_faults}")
    print(
        f"target: {len(out.target_rows)} customers; ledger {out.ledger.calls} calls, "
        f"{out.ledger.keys} keys, {len(out.ledger.duplicate_effects)} duplicate effects"
    )
    if out.status == "succeeded":
        print("result:", json.dumps(out.result))
    else:
        print("error:", out.error["message"] if isinstance(out.error, dict) else out.error)
    return 0 if out.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
