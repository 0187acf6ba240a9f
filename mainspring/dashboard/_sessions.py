"""The dashboard's sessions: an opaque token in the cookie, the key it stands for kept
on the server.

The cookie never holds the API key itself, so a stolen cookie reveals no key and
ends with logout, after ``ttl_s``, or when its key is revoked (checked on every
request). Sessions live in the serving process: a restart logs everyone out.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["Sessions"]

_PREFIX = "mss_"


@dataclass(frozen=True, slots=True)
class _Session:
    key_id: str
    expires_at: float


class Sessions:
    """Session tokens of one server process (thread-safe, at most ``capacity``: the
    oldest session ends first)."""

    def __init__(self, *, ttl_s: float = 7 * 86400, capacity: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._by_token: OrderedDict[str, _Session] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, key_id: str, now: float) -> str:
        """A new session for ``key_id``; returns its token (the cookie's value)."""
        token = _PREFIX + secrets.token_urlsafe(32)
        with self._lock:
            self._by_token[token] = _Session(key_id, now + self.ttl_s)
            while len(self._by_token) > self.capacity:
                self._by_token.popitem(last=False)
        return token

    def key_id(self, token: str, now: float) -> str | None:
        """The key a live session stands for; ``None`` for an unknown or expired one."""
        if not token.startswith(_PREFIX):
            return None
        with self._lock:
            session = self._by_token.get(token)
            if session is None:
                return None
            if session.expires_at <= now:
                del self._by_token[token]
                return None
            return session.key_id

    def end(self, token: str) -> None:
        """Log out: the token no longer authenticates anything."""
        with self._lock:
            self._by_token.pop(token, None)
