"""Durable storage of runs, journals and signals, requests to humans, API keys,
webhooks and the rate limiters' state: one :class:`Store` per database."""

from __future__ import annotations

from urllib.parse import urlsplit

from .._errors import ConfigError
from ._api import SCOPES, WEBHOOK_EVENTS, ApiKey, Delivery, Scope, Webhook, WebhookEvent
from ._base import Cursor, Heartbeat, KeptRun, PruneResult, Snapshot, Store
from ._checkpoints import CheckpointRow, CheckpointWrite
from ._children import CHILD_SIGNAL_PREFIX, child_signal
from ._migrations import LATEST as SCHEMA_VERSION
from ._queues import QueueRecord, check_queue_limits
from ._rates import RateRow, RateTxn
from ._records import (
    FINISHED,
    JOURNAL_ROLES,
    WAIT_SIGNAL_SEP,
    WAKE_NOW,
    JournalRole,
    ParentClose,
    RunRecord,
    RunStatus,
    RunTransition,
    RunWrite,
    SignalRecord,
    StepKind,
    StepRecord,
    StepStatus,
    WriteResult,
    join_wait_signals,
    split_wait_signals,
)
from ._schedules import CatchUp, ScheduleRecord
from ._streams import StreamEnd, TokenChunk, TokenKind, TokenPiece, TokenStream
from ._transitions import RUN_EDGES, RunEdge, take_edge
from ._url import redact_url
from ._workers import WORKER_STATES, WorkerBeat, WorkerRecord, WorkerState
from .sqlite import DatabaseGone, SQLiteStore

__all__ = [
    "CHILD_SIGNAL_PREFIX",
    "FINISHED",
    "JOURNAL_ROLES",
    "RUN_EDGES",
    "SCHEMA_VERSION",
    "SCOPES",
    "WAIT_SIGNAL_SEP",
    "WAKE_NOW",
    "WEBHOOK_EVENTS",
    "WORKER_STATES",
    "ApiKey",
    "CatchUp",
    "CheckpointRow",
    "CheckpointWrite",
    "Cursor",
    "DatabaseGone",
    "Delivery",
    "Heartbeat",
    "JournalRole",
    "KeptRun",
    "ParentClose",
    "PruneResult",
    "QueueRecord",
    "RateRow",
    "RateTxn",
    "RunEdge",
    "RunRecord",
    "RunStatus",
    "RunTransition",
    "RunWrite",
    "SQLiteStore",
    "ScheduleRecord",
    "Scope",
    "SignalRecord",
    "Snapshot",
    "StepKind",
    "StepRecord",
    "StepStatus",
    "Store",
    "StreamEnd",
    "TokenChunk",
    "TokenKind",
    "TokenPiece",
    "TokenStream",
    "Webhook",
    "WebhookEvent",
    "WorkerBeat",
    "WorkerRecord",
    "WorkerState",
    "WriteResult",
    "check_queue_limits",
    "child_signal",
    "join_wait_signals",
    "open_store",
    "redact_url",
    "split_wait_signals",
    "take_edge",
]


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
