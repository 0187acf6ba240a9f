"""Webhook delivery from the store's durable outbox, signed with HMAC-SHA256.

Each POST carries::

    Mainspring-Event-Id: evt_…        (the same on every retry: dedupe on it)
    Mainspring-Event: run.succeeded
    Mainspring-Timestamp: 1764567890  (Unix seconds)
    Mainspring-Signature: v1=<hex HMAC-SHA256(secret, f"{timestamp}.{body}")>

A 2xx answer delivers the event; anything else (or no answer) retries with
exponential back-off (jittered between half and all of the delay) until ``max_attempts``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import random
import time

import httpx

from .._clock import Clock, SystemClock
from ..storage import Store
from ..storage._api import Delivery

__all__ = ["WebhookDispatcher", "sign_webhook", "verify_webhook"]

log = logging.getLogger("mainspring.webhooks")


def sign_webhook(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Mainspring-Signature`` header value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"v1={mac.hexdigest()}"


def verify_webhook(
    secret: str,
    *,
    timestamp: str,
    signature: str,
    body: bytes,
    tolerance_s: float = 300.0,
    now: float | None = None,
) -> bool:
    """Check a delivery's signature (for receivers). Rejects a timestamp more than
    ``tolerance_s`` from ``now``, so a captured delivery cannot be replayed later."""
    try:
        sent = int(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - sent) > tolerance_s:
        return False
    return hmac.compare_digest(sign_webhook(secret, sent, body), signature)


class WebhookDispatcher:
    """Delivers due outbox rows; many dispatchers (in several processes) may run
    over one store: each claims rows for ``hold_s`` before posting them.

    Args:
        store: the store whose outbox to deliver.
        timeout_s: per POST.
        max_attempts: after this many failed attempts an event is given up (it stays
            in the outbox with its last error).
        backoff_s / max_backoff_s: the first retry delay and the cap; doubled each
            attempt, with full jitter.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        timeout_s: float = 10.0,
        max_attempts: int = 12,
        backoff_s: float = 1.0,
        max_backoff_s: float = 3600.0,
        poll_interval_s: float = 0.5,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.clock = clock or SystemClock()
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.poll_interval_s = poll_interval_s
        self._rng = rng or random.Random()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Deliver until :meth:`stop`."""
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            while not self._stop.is_set():
                try:
                    sent = await self.deliver_once(client)
                except Exception:  # the store is down: try again at the next tick
                    log.exception("webhook delivery round failed")
                    sent = 0
                if sent == 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), self.poll_interval_s)

    async def deliver_once(self, client: httpx.AsyncClient | None = None) -> int:
        """One round: claim what is due and post it; returns how many were attempted."""
        claimed = await asyncio.to_thread(self.store.claim_deliveries, self.clock.now())
        if not claimed:
            return 0
        if client is None:
            async with httpx.AsyncClient(timeout=self.timeout_s) as own:
                await asyncio.gather(*(self._deliver(own, d) for d in claimed))
        else:
            await asyncio.gather(*(self._deliver(client, d) for d in claimed))
        return len(claimed)

    async def _deliver(self, client: httpx.AsyncClient, d: Delivery) -> None:
        body = d.body()
        stamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "mainspring-webhooks",
            "Mainspring-Event-Id": d.event_id,
            "Mainspring-Event": d.event,
            "Mainspring-Timestamp": str(stamp),
            "Mainspring-Signature": sign_webhook(d.secret, stamp, body),
        }
        error: str | None = None
        try:
            response = await client.post(d.url, content=body, headers=headers)
            if not 200 <= response.status_code < 300:
                error = f"HTTP {response.status_code}: {response.text[:200]}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        now = self.clock.now()
        retry_at = None
        if error is not None:
            attempt = d.attempts + 1
            if attempt < self.max_attempts:
                cap = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                retry_at = now + self._rng.uniform(cap / 2, cap)
            log.warning(
                "webhook %s to %s failed (attempt %d): %s", d.event_id, d.url, attempt, error
            )
        await asyncio.to_thread(
            self.store.finish_delivery, d.id, now, ok=error is None, retry_at=retry_at, error=error
        )
