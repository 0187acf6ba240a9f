"""Webhook delivery from the store's durable outbox, signed with HMAC-SHA256.

Each POST carries the Standard Webhooks headers (https://www.standardwebhooks.com), so
receivers can verify with its libraries::

    webhook-id: evt_…                 (the same on every retry: dedupe on it)
    webhook-timestamp: 1764567890     (Unix seconds)
    webhook-signature: v1,<base64 HMAC-SHA256(key, f"{id}.{timestamp}.{body}")>

where ``key`` is the base64-decoded part of a ``whsec_…`` secret (the secrets mainspring
generates), or the secret's UTF-8 bytes for one chosen by hand. The older headers stay
for existing receivers: ``Mainspring-Event-Id``, ``Mainspring-Event``,
``Mainspring-Timestamp`` and ``Mainspring-Signature: v1=<hex HMAC-SHA256(secret,
f"{timestamp}.{body}")>``.

A 2xx answer delivers the event; anything else (or no answer) retries with
exponential back-off (jittered between half and all of the delay) until ``max_attempts``.
Only the status line of a refusal is kept, never the receiver's body. Targets outside
the :class:`~mainspring.server._targets.TargetPolicy` (loopback, private ranges unless
allowed) are given up at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import random
import time
from collections.abc import Sequence
from typing import Any

import httpx

from .. import Clock, ConfigError, SystemClock
from ..storage import Delivery, Store
from ._targets import Address, TargetPolicy, safe_url

__all__ = [
    "WebhookDispatcher",
    "sign_standard_webhook",
    "sign_webhook",
    "verify_standard_webhook",
    "verify_webhook",
]

log = logging.getLogger("mainspring.webhooks")


def sign_webhook(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Mainspring-Signature`` header value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"v1={mac.hexdigest()}"


def _standard_key(secret: str) -> bytes:
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except ValueError:
            pass
    return secret.encode()


def sign_standard_webhook(secret: str, event_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks ``webhook-signature`` header value."""
    signed = f"{event_id}.{timestamp}.".encode() + body
    mac = hmac.new(_standard_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify_standard_webhook(
    secret: str,
    *,
    event_id: str,
    timestamp: str,
    signature: str,
    body: bytes,
    tolerance_s: float = 300.0,
    now: float | None = None,
) -> bool:
    """Check a delivery's Standard Webhooks signature (``webhook-signature`` may list
    several, space-separated). Rejects a timestamp more than ``tolerance_s`` off."""
    sent = _fresh(timestamp, tolerance_s, now)
    if sent is None:
        return False
    expected = sign_standard_webhook(secret, event_id, sent, body)
    return any(hmac.compare_digest(expected, given) for given in signature.split())


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
    sent = _fresh(timestamp, tolerance_s, now)
    if sent is None:
        return False
    return hmac.compare_digest(sign_webhook(secret, sent, body), signature)


def _fresh(timestamp: str, tolerance_s: float, now: float | None) -> int | None:
    """A delivery's timestamp, if it is a number within ``tolerance_s`` of ``now``."""
    try:
        sent = int(timestamp)
    except ValueError:
        return None
    if abs((time.time() if now is None else now) - sent) > tolerance_s:
        return None
    return sent


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
        allow_networks: networks beside globally routable addresses that deliveries
            may reach
            (``"10.0.0.0/8"``), or ``"*"`` for any (see ``TargetPolicy``).
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
        allow_networks: Sequence[str] = (),
    ) -> None:
        self.store = store
        self.clock = clock or SystemClock()
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.poll_interval_s = poll_interval_s
        self._rng = rng or random.Random()
        self.targets = TargetPolicy(allow_networks)
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
            "webhook-id": d.event_id,
            "webhook-timestamp": str(stamp),
            "webhook-signature": sign_standard_webhook(d.secret, d.event_id, stamp, body),
            "Mainspring-Event-Id": d.event_id,
            "Mainspring-Event": d.event,
            "Mainspring-Timestamp": str(stamp),
            "Mainspring-Signature": sign_webhook(d.secret, stamp, body),
        }
        error: str | None = None
        give_up = False
        addresses: list[Address | None] = [None]  # any target allowed: connect by name
        if not self.targets.any:
            try:
                addresses = list(await self.targets.resolve(d.url))
            except ConfigError as exc:
                addresses, error, give_up = [], f"target refused: {exc.message}", True
            except OSError as exc:  # DNS is down, or the name is gone: try again later
                addresses, error = [], f"cannot resolve {safe_url(d.url)!r}: {exc}"
        for address in addresses:
            url, extra, extensions = _pinned(d.url, address)
            try:
                # No redirects: a receiver cannot bounce the POST to an internal address.
                response = await client.post(
                    url,
                    content=body,
                    headers={**headers, **extra},
                    extensions=extensions,
                    follow_redirects=False,
                )
            except httpx.ConnectError:
                error = "ConnectError"  # the next address the name has, if any
                continue
            except httpx.HTTPError as exc:
                # The exception's text can quote the URL (and its credentials): not kept.
                error = type(exc).__name__
                break
            error = None
            if not 200 <= response.status_code < 300:
                # The status line only: a receiver's body is not ours to keep.
                error = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
            break
        now = self.clock.now()
        retry_at = None
        if error is not None:
            attempt = d.attempts + 1
            if attempt < self.max_attempts and not give_up:
                cap = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                retry_at = now + self._rng.uniform(cap / 2, cap)
            log.warning(
                "webhook %s to %s failed (attempt %d): %s",
                d.event_id,
                safe_url(d.url),
                attempt,
                error,
            )
        await asyncio.to_thread(
            self.store.finish_delivery, d.id, now, ok=error is None, retry_at=retry_at, error=error
        )


def _pinned(url: str, address: Address | None) -> tuple[httpx.URL, dict[str, str], dict[str, Any]]:
    """``url`` sent to ``address`` (one the policy checked), so that the connection
    cannot go where a second DNS answer points: the address in the URL, the name in
    ``Host`` and, over TLS, in SNI and the certificate check."""
    parsed = httpx.URL(url)
    if address is None or parsed.host == str(address):
        return parsed, {}, {}
    extensions: dict[str, Any] = {}
    if parsed.scheme == "https":
        extensions["sni_hostname"] = parsed.host
    return (
        parsed.copy_with(host=str(address)),
        {"Host": parsed.netloc.decode("ascii")},
        extensions,
    )
