"""Logging in to the dashboard and out again: a valid key with the read scope buys a
session cookie (HttpOnly, SameSite=Strict) that stands for the key and never holds
it; failed attempts are throttled per address and per presented key id."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from .. import App
from ..storage import ApiKey
from ._render import page
from ._sessions import Sessions

__all__ = ["COOKIE", "Login"]

audit = logging.getLogger("mainspring.auth")

COOKIE = "mainspring_key"


class _Failures:
    """Failed logins in a sliding window, counted per client address and per
    presented key id (so one address, or one key id from many addresses, is
    throttled). Only failures count: a valid key is never looked up here."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self._seen: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, who: str, now: float) -> list[float]:
        kept = [t for t in self._seen.get(who, []) if t > now - self.window_s]
        if kept:
            self._seen[who] = kept
        else:
            self._seen.pop(who, None)
        return kept

    def blocked(self, who: Sequence[str], now: float) -> bool:
        with self._lock:
            return any(len(self._recent(w, now)) >= self.limit for w in who)

    def add(self, who: Sequence[str], now: float) -> None:
        with self._lock:
            for w in who:
                self._seen[w] = [*self._recent(w, now), now]
            while len(self._seen) > 100_000:  # a flood of addresses: forget the oldest
                self._seen.pop(next(iter(self._seen)))


def _key_id(token: str) -> str | None:
    """The public id part of a presented key (never its secret), for the audit log."""
    parts = token.split("_", 2)
    return parts[1][:12] if len(parts) == 3 and parts[0] == "msk" else None


class Login:
    """The login form, the login itself and the logout; its methods are the routes."""

    def __init__(
        self,
        app: App,
        sessions: Sessions,
        *,
        secure_cookies: bool | None,
        attempts: int,
        window_s: float,
    ) -> None:
        self.app = app
        self.sessions = sessions
        self.secure_cookies = secure_cookies
        self.failures = _Failures(attempts, window_s)

    def login_form(self, error: str | None = None) -> HTMLResponse:
        return page("login.html", error=error)

    async def login(self, request: Request) -> Response:
        client = request.client.host if request.client else "?"
        form = parse_qs((await request.body()).decode(errors="replace"))
        token = (form.get("key") or [""])[0].strip()
        # The key is checked before any throttling, on every attempt: a valid key logs
        # in whatever others failed from its address (everyone behind one NAT), and a
        # throttled attempt takes the same path as any other (no timing tells them
        # apart). Keys carry 256 random bits: the throttle bounds noise and load.
        key = self.app.admin.verify_key(token) if token else None
        if key is not None and key.allows("read"):
            audit.info("dashboard login of key %r (%s) from %s", key.id, key.name, client)
            return self._session(request, key)
        return self._failed(client, _key_id(token))

    def _session(self, request: Request, key: ApiKey) -> Response:
        response = RedirectResponse("/ui/", status_code=303)
        secure = self.secure_cookies
        response.set_cookie(
            COOKIE,
            self.sessions.start(key.id, self.app.clock.now()),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https" if secure is None else secure,
            max_age=int(self.sessions.ttl_s),
            path="/",
        )
        return response

    def _failed(self, client: str, key_id: str | None) -> Response:
        who = [f"address {client}", *([f"key {key_id}"] if key_id else [])]
        now = time.monotonic()
        throttled = self.failures.blocked(who, now)
        self.failures.add(who, now)
        if throttled:
            audit.warning(
                "dashboard login refused: too many failures from %s or for key id %r",
                client,
                key_id,
            )
            return page(
                "login.html",
                status_code=429,
                error="Too many failed logins from this address or with this key; wait a "
                "minute (a valid key still logs in).",
            )
        audit.warning("dashboard login failed from %s (key id %r)", client, key_id)
        return page("login.html", error="That key is not valid (or lacks the read scope).")

    def logout(self, request: Request) -> Response:
        token = request.cookies.get(COOKIE)
        if token:
            self.sessions.end(token)
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response
