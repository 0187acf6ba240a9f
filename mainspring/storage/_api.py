"""API keys, dashboard sessions, webhooks and their durable outbox: the store's
tables for the outside world. A run's final transition queues its webhook events in its own
transaction (:func:`queue_event`), so an event exists if and only if the transition
committed."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from .._errors import ConfigError
from .._public import public_error
from ._connection import Connection, Cursor

__all__ = [
    "SCOPES",
    "WEBHOOK_EVENTS",
    "ApiKey",
    "ApiTables",
    "Delivery",
    "Scope",
    "Webhook",
    "WebhookEvent",
    "queue_event",
]

# "metrics" reads /metrics and nothing else (a Prometheus scrape key); appended last so
# the stored order of existing keys' scopes does not change.
Scope = Literal["read", "submit", "approve", "admin", "metrics"]
SCOPES: tuple[Scope, ...] = ("read", "submit", "approve", "admin", "metrics")
WebhookEvent = Literal["run.waiting", "run.succeeded", "run.failed", "run.cancelled"]
WEBHOOK_EVENTS: tuple[WebhookEvent, ...] = (
    "run.waiting",
    "run.succeeded",
    "run.failed",
    "run.cancelled",
)
_KEY_PREFIX = "msk"
_SESSION_PREFIX = "mss_"
# A key's last use is written at most this often: reads must not each cost a write.
_LAST_USED_EVERY_S = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiKey:
    """An API key's record (never the key itself, which is stored hashed)."""

    id: str
    name: str
    scopes: tuple[Scope, ...]
    created_at: float
    last_used_at: float | None
    revoked_at: float | None

    def allows(self, scope: Scope) -> bool:
        """Does this key grant ``scope`` (``admin`` grants every scope; a revoked key none)?"""
        return self.revoked_at is None and ("admin" in self.scopes or scope in self.scopes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Webhook:
    """A registered endpoint (never its signing secret).

    Attributes:
        events: the events it receives (``("*",)``: all of :data:`WEBHOOK_EVENTS`).
    """

    id: str
    url: str
    events: tuple[str, ...]
    created_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """One event to deliver to one webhook endpoint (an outbox row)."""

    id: int
    event_id: str
    event: str
    run_id: str
    workflow: str
    payload: str
    created_at: float
    attempts: int
    url: str
    secret: str

    def body(self) -> bytes:
        run = json.loads(self.payload)
        run = {"id": self.run_id, "workflow": self.workflow, **run}
        if "error" in run:  # a receiver gets the one-line error, never a traceback
            run["error"] = public_error(run["error"])
        doc = {"id": self.event_id, "type": self.event, "created_at": self.created_at, "run": run}
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def hash_key(token: str) -> str:
    """What is stored of a key's token: its SHA-256, in hex."""
    return hashlib.sha256(token.encode()).hexdigest()


class ApiTables(Connection):
    """API keys, webhooks and their outbox: methods of every
    :class:`~mainspring.storage.Store`."""

    # -- API keys ---------------------------------------------------------------------

    def create_api_key(self, name: str, scopes: Sequence[str], now: float) -> tuple[ApiKey, str]:
        """A new key: its record and the secret token, shown this once (only a hash
        of it is stored).

        Raises:
            ConfigError: an unknown scope, or an empty name.
        """
        bad = [s for s in scopes if s not in SCOPES]
        if bad or not scopes:
            raise ConfigError(
                f"API key scopes must be some of {list(SCOPES)!r}; got {list(scopes)!r}"
            )
        if not name.strip():
            raise ConfigError("an API key needs a name (who or what uses it)")
        key_id = secrets.token_hex(6)
        token = f"{_KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
        ordered = tuple(s for s in SCOPES if s in scopes)
        with self._write() as cur:
            cur.execute(
                "INSERT INTO ms_api_keys (id, name, hash, scopes, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (key_id, name, hash_key(token), ",".join(ordered), now),
            )
        record = ApiKey(
            id=key_id,
            name=name,
            scopes=ordered,
            created_at=now,
            last_used_at=None,
            revoked_at=None,
        )
        return record, token

    def verify_api_key(self, token: str, now: float) -> ApiKey | None:
        """The key a token belongs to, if it is genuine (revoked keys too: the caller
        checks scopes with :meth:`ApiKey.allows`)."""
        parts = token.split("_", 2)
        if len(parts) != 3 or parts[0] != _KEY_PREFIX:
            return None
        # Hashed and compared whether the id exists or not: the time taken does not
        # tell a caller which key ids there are.
        digest = hash_key(token)
        with self._read() as cur:
            cur.execute(
                "SELECT id, name, hash, scopes, created_at, last_used_at, revoked_at"
                " FROM ms_api_keys WHERE id = ?",
                (parts[1],),
            )
            row = cur.fetchone()
        genuine = hmac.compare_digest(row[2] if row is not None else "0" * len(digest), digest)
        if row is None or not genuine:
            return None
        key = _api_key(row)
        if key.revoked_at is None and (key.last_used_at or 0) < now - _LAST_USED_EVERY_S:
            with self._write() as cur:
                cur.execute("UPDATE ms_api_keys SET last_used_at = ? WHERE id = ?", (now, key.id))
        return key

    def get_api_key(self, key_id: str) -> ApiKey | None:
        """A key's record by its id (revoked keys too)."""
        with self._read() as cur:
            cur.execute(
                "SELECT id, name, hash, scopes, created_at, last_used_at, revoked_at"
                " FROM ms_api_keys WHERE id = ?",
                (key_id,),
            )
            row = cur.fetchone()
        return _api_key(row) if row is not None else None

    def api_key_active(self, key_id: str) -> bool:
        """Does the key exist, unrevoked (for long requests to re-check theirs)?"""
        with self._read() as cur:
            cur.execute("SELECT 1 FROM ms_api_keys WHERE id = ? AND revoked_at IS NULL", (key_id,))
            return cur.fetchone() is not None

    def list_api_keys(self) -> list[ApiKey]:
        with self._read() as cur:
            cur.execute(
                "SELECT id, name, hash, scopes, created_at, last_used_at, revoked_at"
                " FROM ms_api_keys ORDER BY created_at"
            )
            return [_api_key(r) for r in cur.fetchall()]

    def revoke_api_key(self, key_id: str, now: float) -> bool:
        """Revoke a key; ``False`` when there is no such key (or it was revoked)."""
        with self._write() as cur:
            cur.execute(
                "UPDATE ms_api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                (now, key_id),
            )
            revoked = bool(cur.rowcount)
            cur.execute("DELETE FROM ms_sessions WHERE key_id = ?", (key_id,))
            return revoked

    # -- dashboard sessions ----------------------------------------------------------------

    def start_session(
        self, key_id: str, now: float, *, ttl_s: float, max_per_key: int = 100
    ) -> str:
        """A new session for ``key_id`` ending after ``ttl_s``; returns its token
        (``mss_…``), which is stored as a hash only. Ended sessions are removed, and
        the key's oldest beyond ``max_per_key``."""
        token = _SESSION_PREFIX + secrets.token_urlsafe(32)
        with self._write() as cur:
            cur.execute("DELETE FROM ms_sessions WHERE expires_at <= ?", (now,))
            cur.execute(
                "INSERT INTO ms_sessions (hash, key_id, created_at, expires_at)"
                " VALUES (?, ?, ?, ?)",
                (hash_key(token), key_id, now, now + ttl_s),
            )
            cur.execute(
                "DELETE FROM ms_sessions WHERE key_id = ? AND hash NOT IN (SELECT hash FROM"
                " ms_sessions WHERE key_id = ? ORDER BY created_at DESC, hash LIMIT ?)",
                (key_id, key_id, max_per_key),
            )
        return token

    def session_key_id(self, token: str, now: float) -> str | None:
        """The key a live session stands for; ``None`` for an unknown, ended or
        expired one."""
        if not token.startswith(_SESSION_PREFIX):
            return None
        with self._read() as cur:
            cur.execute(
                "SELECT key_id FROM ms_sessions WHERE hash = ? AND expires_at > ?",
                (hash_key(token), now),
            )
            row = cur.fetchone()
        return str(row[0]) if row is not None else None

    def end_session(self, token: str) -> bool:
        """Log out: the token no longer authenticates anything. ``False`` when it
        was not a live session."""
        with self._write() as cur:
            cur.execute("DELETE FROM ms_sessions WHERE hash = ?", (hash_key(token),))
            return bool(cur.rowcount)

    # -- webhooks and their outbox -------------------------------------------------------

    def add_webhook(
        self, url: str, now: float, *, secret: str | None = None, events: Sequence[str] = ()
    ) -> tuple[Webhook, str]:
        """Register an endpoint; returns it and its signing secret.

        Raises:
            ConfigError: the URL is not http(s) or an event is unknown.
        """
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"a webhook URL must start with http:// or https://, not {url!r}")
        try:
            parts = urlsplit(url)
            host, _ = parts.hostname, parts.port  # each parse raises on a malformed URL
        except ValueError as exc:
            raise ConfigError(f"a webhook URL that cannot be read: {url!r} ({exc})") from None
        if not host:
            raise ConfigError(f"a webhook URL needs a host: {url!r}")
        bad = [e for e in events if e not in WEBHOOK_EVENTS]
        if bad:
            raise ConfigError(f"unknown webhook events {bad!r}; known: {list(WEBHOOK_EVENTS)!r}")
        # Standard Webhooks' form: whsec_ + base64 of 32 random bytes (its libraries
        # verify with it as is).
        secret = secret or "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        hook = Webhook(
            id=secrets.token_hex(6), url=url, events=tuple(events) or ("*",), created_at=now
        )
        with self._write() as cur:
            cur.execute(
                "INSERT INTO ms_webhooks (id, url, secret, events, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (hook.id, url, secret, ",".join(hook.events), now),
            )
        return hook, secret

    def list_webhooks(self) -> list[Webhook]:
        with self._read() as cur:
            cur.execute(
                "SELECT id, url, events, created_at FROM ms_webhooks WHERE removed_at IS NULL"
                " ORDER BY created_at"
            )
            return [
                Webhook(id=r[0], url=r[1], events=tuple(r[2].split(",")), created_at=r[3])
                for r in cur.fetchall()
            ]

    def remove_webhook(self, webhook_id: str, now: float) -> bool:
        """Stop delivering to an endpoint (events already queued for it are dropped)."""
        with self._write() as cur:
            cur.execute(
                "UPDATE ms_webhooks SET removed_at = ? WHERE id = ? AND removed_at IS NULL",
                (now, webhook_id),
            )
            removed = bool(cur.rowcount)
            cur.execute(
                "UPDATE ms_outbox SET next_at = NULL, last_error = 'webhook removed'"
                " WHERE webhook_id = ? AND delivered_at IS NULL",
                (webhook_id,),
            )
            return removed

    def claim_deliveries(
        self, now: float, *, limit: int = 50, hold_s: float = 30.0
    ) -> list[Delivery]:
        """Due outbox rows, hidden from other dispatchers for ``hold_s`` seconds while
        this one delivers them (a dispatcher that dies leaves them due again)."""
        with self._write() as cur:
            cur.execute(
                "SELECT o.id, o.event_id, o.event, o.run_id, o.workflow, o.payload,"
                " o.created_at, o.attempts, w.url, w.secret FROM ms_outbox o"
                " JOIN ms_webhooks w ON w.id = o.webhook_id"
                " WHERE o.delivered_at IS NULL AND o.next_at <= ?"
                " ORDER BY o.next_at, o.id LIMIT ?"
                + self._lock_clause.replace(" UPDATE", " UPDATE OF o"),
                (now, limit),
            )
            rows = cur.fetchall()
            if rows:
                ids = [r[0] for r in rows]
                cur.execute(
                    f"UPDATE ms_outbox SET next_at = ? WHERE id IN ({', '.join('?' * len(ids))})",
                    [now + hold_s, *ids],
                )
        return [
            Delivery(
                id=r[0],
                event_id=r[1],
                event=r[2],
                run_id=r[3],
                workflow=r[4],
                payload=r[5],
                created_at=r[6],
                attempts=r[7],
                url=r[8],
                secret=r[9],
            )
            for r in rows
        ]

    def finish_delivery(
        self, delivery_id: int, now: float, *, ok: bool, retry_at: float | None, error: str | None
    ) -> None:
        """Record one attempt: delivered, or due again at ``retry_at`` (``None``: give up)."""
        with self._write() as cur:
            if ok:
                cur.execute(
                    "UPDATE ms_outbox SET delivered_at = ?, attempts = attempts + 1,"
                    " last_error = NULL WHERE id = ?",
                    (now, delivery_id),
                )
            else:
                cur.execute(
                    "UPDATE ms_outbox SET next_at = ?, attempts = attempts + 1, last_error = ?"
                    " WHERE id = ?",
                    (retry_at, error, delivery_id),
                )

    def outbox_backlog(self) -> tuple[int, float | None, int]:
        """``(pending, created_at of the oldest pending, given up)`` webhook deliveries:
        what ``/metrics`` reports (pending: not delivered and due again; given up:
        attempts exhausted or the webhook removed)."""
        with self._read() as cur:
            cur.execute(
                "SELECT COUNT(*), MIN(created_at) FROM ms_outbox"
                " WHERE delivered_at IS NULL AND next_at IS NOT NULL"
            )
            pending, oldest = cur.fetchone()
            cur.execute(
                "SELECT COUNT(*) FROM ms_outbox WHERE delivered_at IS NULL AND next_at IS NULL"
            )
            (given_up,) = cur.fetchone()
        return int(pending), oldest, int(given_up)

    def outbox(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Outbox rows (for operators and tests): event, endpoint, attempts, state."""
        where = " WHERE run_id = ?" if run_id is not None else ""
        with self._read() as cur:
            cur.execute(
                "SELECT id, event_id, webhook_id, run_id, event, attempts, next_at, delivered_at,"
                " last_error FROM ms_outbox" + where + " ORDER BY id",
                (run_id,) if run_id is not None else (),
            )
            cols = (
                "id",
                "event_id",
                "webhook_id",
                "run_id",
                "event",
                "attempts",
                "next_at",
                "delivered_at",
                "last_error",
            )
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def _api_key(row: Sequence[Any]) -> ApiKey:
    scopes = tuple(s for s in str(row[3]).split(",") if s in SCOPES)
    return ApiKey(
        id=row[0],
        name=row[1],
        scopes=scopes,
        created_at=row[4],
        last_used_at=row[5],
        revoked_at=row[6],
    )


def queue_event(
    cur: Cursor, run_id: str, event: WebhookEvent, run: dict[str, Any], now: float
) -> None:
    """Queue ``event`` for every endpoint that wants it, in the caller's transaction:
    the outbox row exists if and only if the transition committed."""
    cur.execute(
        "INSERT INTO ms_outbox (event_id, webhook_id, run_id, workflow, event, payload,"
        " created_at, next_at) SELECT ?, w.id, r.id, r.workflow, ?, ?, ?, ?"
        " FROM ms_webhooks w, ms_runs r WHERE r.id = ? AND w.removed_at IS NULL"
        " AND (w.events = '*' OR (',' || w.events || ',') LIKE ?)",
        (
            f"evt_{uuid.uuid4().hex}",
            event,
            json.dumps(run, separators=(",", ":"), ensure_ascii=False),
            now,
            now,
            run_id,
            f"%,{event},%",
        ),
    )
