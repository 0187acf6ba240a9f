"""The store: one class made of cohesive parts that share one connection.

Each part holds its own SQL, shared by every dialect:

* runs (``_runs.py``) and their retention (``_retention.py``), claims and leases
  (``_leases.py``) and the journal (``_journal.py``);
* signals and requests to humans (``_signals.py``);
* API keys, webhooks and their outbox (``_api.py``);
* the rate limiters' tables (``_rates.py``);
* schedules (``_schedules.py``);
* integrations' checkpoints (``_checkpoints.py``);
* the worker registry (``_workers.py``).

They all sit on :class:`~mainspring.storage._connection.Connection`: the dialect's
transactions and hooks, and the schema. A dialect (``sqlite.py``, ``postgres.py``)
overrides only connection set-up, transactions, placeholders and row locking.
Methods are synchronous: the engine calls them inline for a single run and from one
committer thread when many runs step at once.
"""

from __future__ import annotations

from abc import ABC

from ._api import ApiTables
from ._checkpoints import CheckpointTables
from ._connection import Cursor
from ._journal import JournalTables, Snapshot
from ._leases import Heartbeat, LeaseTables
from ._rates import RateTables
from ._records import WAKE_NOW
from ._retention import KeptRun, PruneResult, RetentionTables
from ._runs import RunTables
from ._schedules import ScheduleTables
from ._signals import SignalTables
from ._streams import StreamTables
from ._workers import WorkerTables

__all__ = ["WAKE_NOW", "Cursor", "Heartbeat", "KeptRun", "PruneResult", "Snapshot", "Store"]


class Store(
    RunTables,
    RetentionTables,
    LeaseTables,
    JournalTables,
    SignalTables,
    ApiTables,
    RateTables,
    ScheduleTables,
    StreamTables,
    CheckpointTables,
    WorkerTables,
    ABC,
):
    """Durable home of runs, their journals and signals, requests to humans, API
    keys, webhooks and the rate limiters' state.

    Subclasses implement :meth:`_write` (a write transaction that serialises with
    every other writer on the run rows it touches), :meth:`_read`, :meth:`close` and,
    where the database needs it, the SQL hooks of
    :class:`~mainspring.storage._connection.Connection`.
    """

    def wal_size(self) -> tuple[int, int] | None:
        """``(bytes, limit)`` of the database's write-ahead log file, where the store
        keeps one next to the database (SQLite); ``None`` elsewhere."""
        return None

    def checkpoint(self, *, wait: bool = False) -> tuple[int, int] | None:
        """Fold the write-ahead log into the database and truncate it, where the
        store keeps one (SQLite; ``wait``: for readers to let go); :meth:`wal_size`
        afterwards, ``None`` elsewhere."""
        return None
