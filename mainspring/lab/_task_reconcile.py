"""The ``reconcile`` task: two ledgers of N entries with seeded differences; compare
them range by range and post an adjusting entry to B for each difference.

Ledger A is the truth, B is the one to fix. About one entry in four differs: missing
from B, present in B only, or with another amount (amounts are integer cents). An
entry agrees when both sides net to the same amount (a side that lacks the entry
counts as 0, so a B-only entry is fixed by a reversing post). Posting is not
idempotent but by idempotency key: a second post with a new key adjusts twice, and
the audit counts it as a duplicate effect.
"""

from __future__ import annotations

import json
import random
from typing import Any

from ._task_spec import PROGRESS, TaskSpec, TaskWorld, ToolDef, int_args

__all__ = ["BLOCK", "RECONCILE", "ReconcileWorld", "entry_amounts"]

#: Entries a ``compare`` covers on the clean path (the tool takes up to ``_SPAN``).
BLOCK = 10
_SPAN = 50

RECONCILE = TaskSpec(
    "reconcile",
    "Reconcile ledger B with ledger A, entry by entry: compare a range of entries, "
    "then post an adjusting entry to B for each difference (amount = A - B, in cents; "
    "each post adds to B). Call finish when the ledgers agree.",
    (
        PROGRESS,
        ToolDef(
            "compare",
            f"Compare entries first..last (inclusive, at most {_SPAN}) of ledgers A and B.",
            int_args("first", "last"),
        ),
        ToolDef(
            "post",
            "Post an adjusting entry of amount cents to entry of ledger B.",
            int_args("entry", "amount"),
            keyed=True,
        ),
    ),
    # A compare per BLOCK entries and a post per difference (one entry in four).
    calls_per_item=1 / BLOCK + 0.25,
)


def entry_amounts(idx: int) -> tuple[int | None, int | None]:
    """Entry ``idx``'s amounts in ledgers A and B (None: the ledger lacks it); the
    same for every run, so every contender meets the same differences."""
    rng = random.Random(f"reconcile:{idx}")
    amount, draw = rng.randrange(100, 100_000), rng.random()
    if draw < 0.10:
        return amount, None  # missing from B
    if draw < 0.17:
        return None, amount  # in B only
    if draw < 0.25:
        return amount, amount + rng.choice([-1, 1]) * rng.randrange(1, 5_000)
    return amount, amount


_DIFFERS = "COALESCE(a, 0) != COALESCE(b, 0)"


class ReconcileWorld(TaskWorld):
    spec = RECONCILE
    tables = """
        CREATE TABLE IF NOT EXISTS reconcile_entries (
            label TEXT NOT NULL, idx INTEGER NOT NULL, a INTEGER, b INTEGER,
            compared INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (label, idx));
    """

    def create(self, label: str, items: int) -> None:
        self.conn().executemany(
            "INSERT INTO reconcile_entries (label, idx, a, b) VALUES (?, ?, ?, ?)",
            [(label, i, *entry_amounts(i)) for i in range(items)],
        )

    def _first(self, label: str, where: str) -> int | None:
        row = self.conn().execute(
            f"SELECT MIN(idx) FROM reconcile_entries WHERE label = ? AND {where}", (label,)
        )
        found = row.fetchone()[0]
        return None if found is None else int(found)

    def _entry(self, label: str, idx: int) -> tuple[int | None, int | None] | None:
        row = self.conn().execute(
            "SELECT a, b FROM reconcile_entries WHERE label = ? AND idx = ?", (label, idx)
        )
        found = row.fetchone()
        return None if found is None else (found[0], found[1])

    def next(self, label: str) -> dict[str, Any]:
        fresh = self._first(label, "compared = 0")
        wrong = self._first(label, f"compared = 1 AND {_DIFFERS}")
        if wrong is not None and (fresh is None or wrong < fresh):
            a, b = self._entry(label, wrong) or (0, 0)
            return {"action": "post", "entry": wrong, "amount": (a or 0) - (b or 0)}
        if fresh is not None:
            (n,) = (
                self.conn()
                .execute("SELECT COUNT(*) FROM reconcile_entries WHERE label = ?", (label,))
                .fetchone()
            )
            return {"action": "compare", "first": fresh, "last": min(fresh + BLOCK, n) - 1}
        return {"action": "finish"}

    def apply(self, label: str, tool: str, args: dict[str, Any], key: str) -> dict[str, Any]:
        if tool == "progress":
            return {"ok": True}
        if tool == "compare":
            first, last = int(args["first"]), int(args["last"])
            if not 0 <= first <= last or last - first >= _SPAN or self._entry(label, last) is None:
                return {
                    "ok": False,
                    "error": f"compare {first}..{last}: not a range of at most {_SPAN} entries",
                }
            conn = self.conn()
            conn.execute(
                "UPDATE reconcile_entries SET compared = 1 WHERE label = ? AND idx BETWEEN ? AND ?",
                (label, first, last),
            )
            differences = [
                {"entry": i, "a": a, "b": b}
                for i, a, b in conn.execute(
                    "SELECT idx, a, b FROM reconcile_entries WHERE label = ?"
                    f" AND idx BETWEEN ? AND ? AND {_DIFFERS} ORDER BY idx",
                    (label, first, last),
                )
            ]
            return {"ok": True, "compared": [first, last], "differences": differences}
        entry, amount = int(args["entry"]), int(args["amount"])
        if self._entry(label, entry) is None:
            return {"ok": False, "error": f"no entry {entry}"}
        if amount == 0:
            return {"ok": False, "error": f"post {entry}: an adjustment of 0 changes nothing"}
        # A posting API that deduplicates by idempotency key only.
        applied = self.ledger.apply(
            key,
            "post",
            {"label": label, "item": entry, "amount": amount},
            on_apply=lambda c: c.execute(
                "UPDATE reconcile_entries SET b = COALESCE(b, 0) + ? WHERE label = ? AND idx = ?",
                (amount, label, entry),
            ),
        )
        _, b = self._entry(label, entry) or (0, 0)
        return {"ok": True, "posted": entry, "amount": amount, "b": b, "replayed": not applied}

    def _posts(self, label: str) -> dict[tuple[int, int], int]:
        """How many times each (entry, amount) adjustment was posted, any key."""
        counts: dict[tuple[int, int], int] = {}
        for payload, applied in self.conn().execute(
            "SELECT payload, applied FROM effects WHERE effect = 'post'"
        ):
            post = json.loads(payload)
            if post["label"] == label:
                one = (int(post["item"]), int(post["amount"]))
                counts[one] = counts.get(one, 0) + int(applied)
        return counts

    def duplicates(self, label: str) -> int:
        return sum(c - 1 for c in self._posts(label).values() if c > 1)

    def check(self, label: str, items: int) -> list[str]:
        left = [
            int(i)
            for (i,) in self.conn().execute(
                f"SELECT idx FROM reconcile_entries WHERE label = ? AND {_DIFFERS} ORDER BY idx",
                (label,),
            )
        ]
        problems = []
        if left:
            problems.append(f"{label}: {len(left)} difference(s) left, entries {left[:10]}")
        for (entry, amount), count in sorted(self._posts(label).items()):
            if count > 1:
                problems.append(
                    f"{label}: entry {entry} adjusted by {amount} {count} times "
                    f"({count - 1} duplicate post(s))"
                )
        return problems
