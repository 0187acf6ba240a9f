"""The two outside systems of the migration: the legacy export and the new target.

The target plays a CRM API that takes an idempotency key: it applies each key's write
once and counts every call. It keeps its rows in the file of an
:class:`~mainspring.testing.EffectLedger` and changes them in the same transaction that
records the effect, so the ledger and the rows never disagree, whichever process dies.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Collection
from typing import Any

from mainspring.testing import EffectLedger

from .schemas import TargetCustomer

__all__ = ["TargetStore", "legacy_rows"]

_FIRST = ("Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Radia")
_LAST = ("Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson")
_COUNTRIES = ("DE", "FR", "GB", "US", "BR", "JP", "IN", "NL", "CA")
_PLANS = ("free", "pro", "team", "enterprise")


def legacy_rows(count: int) -> list[dict[str, Any]]:
    """The old system's rows, as its export gives them: no schema, some of them broken.

    Every 11th row has a malformed email, every 17th a phone number too short, and
    every 23rd an unknown plan; the validate stage must refuse those.
    """
    if not 1 <= count <= 9999:
        raise ValueError(f"count must be between 1 and 9999, got {count!r}")
    rows = []
    for i in range(1, count + 1):
        first, last = _FIRST[i % len(_FIRST)], _LAST[i % len(_LAST)]
        rows.append(
            {
                "id": f"cus_{i:04d}",
                "full_name": f"{first} {last}",
                "email": f"{first}.{last}{i}@example.com".lower()
                if i % 11
                else f"{first.lower()}-at-example.com",
                "phone": f"+49 (30) {1000000 + i * 7919 % 9000000}" if i % 17 else "12-34",
                "country": _COUNTRIES[i % len(_COUNTRIES)],
                "plan": _PLANS[(i * 7) % len(_PLANS)] if i % 23 else "platinum",
                "seats": 1 + (i * 37) % 300,
            }
        )
    return rows


class TargetStore:
    """The new CRM: idempotent writes by key, rows you can read back, and a ledger.

    Args:
        path: the SQLite file; every process that opens it shares the target.
        drops: customer ids whose writes the target acknowledges but loses (a faulty
            target, for showing reconciliation and compensation).
    """

    def __init__(self, path: str | os.PathLike[str], *, drops: Collection[str] = ()) -> None:
        self.path = os.fspath(path)
        self.ledger = EffectLedger(self.path)
        self.drops = frozenset(drops)
        conn = self._read()
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS customers ("
                " customer_id TEXT PRIMARY KEY, record TEXT NOT NULL, import_key TEXT NOT NULL)"
            )
        finally:
            conn.close()

    def _read(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def upsert(self, key: str, customer: TargetCustomer) -> bool:
        """Write one customer under ``key``; False when the key was applied before."""
        record = customer.model_dump()

        def write(conn: sqlite3.Connection) -> None:
            if customer.customer_id in self.drops:
                return  # acknowledged, never stored
            conn.execute(
                "INSERT INTO customers (customer_id, record, import_key) VALUES (?, ?, ?)"
                " ON CONFLICT (customer_id) DO UPDATE SET record = excluded.record,"
                " import_key = excluded.import_key",
                (customer.customer_id, json.dumps(record, sort_keys=True), key),
            )

        return self.ledger.apply(key, "import", record, on_apply=write)

    def delete(self, key: str, customer_id: str) -> bool:
        """Remove one customer (compensation); False when the key was applied before."""

        def remove(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM customers WHERE customer_id = ?", (customer_id,))

        return self.ledger.apply(key, "undo_import", {"customer_id": customer_id}, on_apply=remove)

    def rows(self) -> dict[str, dict[str, Any]]:
        """Every stored customer by id."""
        conn = self._read()
        try:
            found = conn.execute("SELECT customer_id, record FROM customers").fetchall()
        finally:
            conn.close()
        return {cid: json.loads(text) for cid, text in found}

    def close(self) -> None:
        self.ledger.close()
