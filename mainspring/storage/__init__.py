"""Durable storage of runs, journals and signals, requests to humans, API keys,
webhooks and the rate limiters' state: one :class:`Store` per database."""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from .._errors import ConfigError
from ._api import SCOPES, WEBHOOK_EVENTS, ApiKey, Delivery, Scope, Webhook, WebhookEvent
from ._base import Cursor as Cursor
from ._base import Heartbeat as Heartbeat
from ._base import KeptRun, PruneResult, Snapshot, Store
from ._checkpoints import CheckpointRow, CheckpointWrite
from ._children import CHILD_SIGNAL_PREFIX as CHILD_SIGNAL_PREFIX
from ._children import child_signal as child_signal
from ._migrations import LATEST as SCHEMA_VERSION
from ._queues import QueueRecord as QueueRecord
from ._queues import check_queue_limits as check_queue_limits
from ._rates import RateRow as RateRow
from ._rates import RateTxn as RateTxn
from ._records import (
    FINISHED,
    WAKE_NOW,
    JournalRole,
    RunRecord,
    RunStatus,
    SignalRecord,
    StepRecord,
)
from ._records import JOURNAL_ROLES as JOURNAL_ROLES
from ._records import WAIT_SIGNAL_SEP as WAIT_SIGNAL_SEP
from ._records import ParentClose as ParentClose
from ._records import RunTransition as RunTransition
from ._records import RunWrite as RunWrite
from ._records import StepKind as StepKind
from ._records import StepStatus as StepStatus
from ._records import WriteResult as WriteResult
from ._records import join_wait_signals as join_wait_signals
from ._records import split_wait_signals as split_wait_signals
from ._schedules import CatchUp as CatchUp
from ._schedules import ScheduleRecord
from ._streams import StreamEnd as StreamEnd
from ._streams import TokenChunk as TokenChunk
from ._streams import TokenKind as TokenKind
from ._streams import TokenPiece as TokenPiece
from ._streams import TokenStream
from ._transitions import RUN_EDGES as RUN_EDGES
from ._transitions import RunEdge as RunEdge
from ._transitions import take_edge as take_edge
from ._url import redact_url
from ._workers import WORKER_STATES, WorkerBeat, WorkerRecord, WorkerState
from .sqlite import DatabaseGone as DatabaseGone
from .sqlite import SQLiteStore

__all__ = [
    "FINISHED",
    "SCHEMA_VERSION",
    "SCOPES",
    "WAKE_NOW",
    "WEBHOOK_EVENTS",
    "WORKER_STATES",
    "ApiKey",
    "CheckpointRow",
    "CheckpointWrite",
    "Delivery",
    "JournalRole",
    "KeptRun",
    "PruneResult",
    "RunRecord",
    "RunStatus",
    "SQLiteStore",
    "ScheduleRecord",
    "Scope",
    "SignalRecord",
    "Snapshot",
    "StepRecord",
    "Store",
    "TokenStream",
    "Webhook",
    "WebhookEvent",
    "WorkerBeat",
    "WorkerRecord",
    "WorkerState",
    "open_read_only",
    "open_store",
    "redact_url",
]

# For the floors above (see docs/architecture.md, "Layers"), never for users:
__internal__ = (
    "CHILD_SIGNAL_PREFIX",
    "CatchUp",
    "Cursor",
    "DatabaseGone",
    "Heartbeat",
    "JOURNAL_ROLES",
    "ParentClose",
    "QueueRecord",
    "RUN_EDGES",
    "RateRow",
    "RateTxn",
    "RunEdge",
    "RunTransition",
    "RunWrite",
    "StepKind",
    "StepStatus",
    "StreamEnd",
    "TokenChunk",
    "TokenKind",
    "TokenPiece",
    "WAIT_SIGNAL_SEP",
    "WriteResult",
    "check_queue_limits",
    "child_signal",
    "join_wait_signals",
    "split_wait_signals",
    "take_edge",
)


def open_read_only(url: str) -> Store:
    """Open the store a URL names to read it and nothing else: without migrating it,
    and on PostgreSQL with every transaction of the session read-only, so that the
    server itself refuses a write (``mainspring replay-check`` against production's
    database)."""
    parts = urlsplit(url)
    if parts.scheme in ("postgresql", "postgres"):
        from .postgres import PostgresStore  # needs the [postgres] extra

        query = dict(parse_qsl(parts.query))
        options = f"{query.get('options', '')} -c default_transaction_read_only=on".strip()
        query["options"] = options
        read_only = urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))
        return PostgresStore(read_only, migrate=False)
    if parts.scheme == "sqlite":
        return SQLiteStore.from_url(url, migrate=False)
    return open_store(url)  # the unknown scheme's clear error


def open_store(url: str) -> Store:
    """Open the store a URL names: ``sqlite:///path.db`` or ``postgresql://...``."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        return SQLiteStore.from_url(url)
    if scheme in ("postgresql", "postgres"):
        from .postgres import PostgresStore  # needs the [postgres] extra

        return PostgresStore(url)
    raise ConfigError(
        f"database URL {redact_url(url)!r}: unknown scheme {scheme!r}; expected sqlite:///path.db "
        "or postgresql://user@host/dbname"
    )
