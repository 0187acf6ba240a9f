"""``EffectLedger``: a record of side effects in a real SQLite file, shared by processes.

It plays the outside world in tests: a step calls :meth:`apply` with its
idempotency key, as it would call a payment or mail API that deduplicates by key,
and the ledger counts every call. Afterwards a test checks that each effect took
place exactly once per key however often workers crashed and steps re-ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["EffectLedger", "LedgerReport"]


@dataclass(frozen=True, slots=True)
class LedgerReport:
    """What the ledger saw.

    Attributes:
        keys: distinct idempotency keys applied.
        calls: every call, duplicates included.
        duplicate_calls: keys called more than once (re-executions; fine when deduped).
        duplicate_effects: keys whose effect happened more than once (always a bug).
    """

    keys: int
    calls: int
    duplicate_calls: dict[str, int]
    duplicate_effects: dict[str, int]


class EffectLedger:
    """A file of effects keyed by idempotency key.

    Args:
        path: the SQLite file; every process that opens the same path shares it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._local = threading.local()
        with self._conn() as conn:
            conn.executescript(
                """
                CREATE TABLE IF NOT EXISTS calls (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    key TEXT NOT NULL, effect TEXT NOT NULL, payload TEXT,
                    pid INTEGER NOT NULL, at REAL NOT NULL);
                CREATE INDEX IF NOT EXISTS calls_key ON calls (key);
                CREATE TABLE IF NOT EXISTS effects (
                    key TEXT NOT NULL, effect TEXT NOT NULL, payload TEXT,
                    applied INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (key));
                """
            )

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            self._local.conn = conn
        return conn

    def apply(
        self,
        key: str,
        effect: str = "effect",
        payload: Any = None,
        *,
        on_apply: Callable[[sqlite3.Connection], object] | None = None,
    ) -> bool:
        """Perform an effect the way an idempotent API does: once per key.

        Every call is counted. Returns True when this call took effect, False when
        the key had been applied before (the caller is told, as Stripe does).

        Args:
            on_apply: called with the ledger's connection inside the transaction that
                records a first application, so a fake system can keep its own rows
                in the ledger's file and change them atomically with the effect.
        """
        text = json.dumps(payload)
        with self._call(key, effect, text) as conn:
            cur = conn.execute(
                "INSERT INTO effects (key, effect, payload) VALUES (?, ?, ?)"
                " ON CONFLICT (key) DO NOTHING",
                (key, effect, text),
            )
            applied = cur.rowcount == 1
            if applied and on_apply is not None:
                on_apply(conn)
        return applied

    def apply_unsafe(self, key: str, effect: str = "effect", payload: Any = None) -> None:
        """Perform an effect with no deduplication (a system without idempotency):
        a repeated call is a duplicate effect."""
        text = json.dumps(payload)
        with self._call(key, effect, text) as conn:
            conn.execute(
                "INSERT INTO effects (key, effect, payload) VALUES (?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET applied = applied + 1",
                (key, effect, text),
            )

    @contextlib.contextmanager
    def _call(self, key: str, effect: str, text: str) -> Iterator[sqlite3.Connection]:
        """One call of an effect: recorded in a write transaction that the effect's own
        rows join, committed with them or rolled back with them."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "INSERT INTO calls (key, effect, payload, pid, at) VALUES (?, ?, ?, ?, ?)",
                (key, effect, text, os.getpid(), time.time()),
            )
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def calls(self, key: str) -> int:
        """How many times ``key`` was called."""
        row = self._conn().execute("SELECT COUNT(*) FROM calls WHERE key = ?", (key,)).fetchone()
        return int(row[0])

    def applied(self, key: str) -> int:
        """How many times the effect of ``key`` took place (0 or 1 unless duplicated)."""
        row = self._conn().execute("SELECT applied FROM effects WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else 0

    def calls_by_key(self, effect: str | None = None) -> dict[str, int]:
        """How many times each key was called (only calls of ``effect`` when given)."""
        sql = "SELECT key, COUNT(*) FROM calls"
        params: tuple[str, ...] = ()
        if effect is not None:
            sql, params = sql + " WHERE effect = ?", (effect,)
        return {k: int(n) for k, n in self._conn().execute(sql + " GROUP BY key", params)}

    def payloads(self, effect: str) -> dict[str, Any]:
        """The payload of each key whose ``effect`` took place (decoded JSON)."""
        rows = self._conn().execute("SELECT key, payload FROM effects WHERE effect = ?", (effect,))
        return {k: json.loads(p) if p is not None else None for k, p in rows}

    def keys(self) -> set[str]:
        return {r[0] for r in self._conn().execute("SELECT key FROM effects")}

    def report(self) -> LedgerReport:
        conn = self._conn()
        calls = conn.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
        keys = conn.execute("SELECT COUNT(*) FROM effects").fetchone()[0]
        dup_calls = dict(
            conn.execute("SELECT key, COUNT(*) FROM calls GROUP BY key HAVING COUNT(*) > 1")
        )
        dup_effects = dict(conn.execute("SELECT key, applied FROM effects WHERE applied > 1"))
        return LedgerReport(
            keys=int(keys),
            calls=int(calls),
            duplicate_calls=dup_calls,
            duplicate_effects=dup_effects,
        )

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
