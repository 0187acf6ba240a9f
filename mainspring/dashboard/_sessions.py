"""The dashboard's sessions: an opaque token in the cookie, the key it stands for
kept in the store.

The cookie never holds the API key itself, so a stolen cookie reveals no key and
ends with logout, after ``ttl_s``, or when its key is revoked (checked on every
request). The store keeps only a hash of each token, so reading the database gives
no working cookie. Sessions live in the database, not in the serving process: they
survive a restart of ``serve`` and work on every ``serve`` over the same database.
"""

from __future__ import annotations

from .. import App

__all__ = ["Sessions"]


class Sessions:
    """Session tokens kept in the store of ``app`` (opened on first use), at most
    ``max_per_key`` live ones per key: the oldest ends first."""

    def __init__(self, app: App, *, ttl_s: float = 7 * 86400, max_per_key: int = 100) -> None:
        self.app = app
        self.ttl_s = ttl_s
        self.max_per_key = max_per_key

    def start(self, key_id: str, now: float) -> str:
        """A new session for ``key_id``; returns its token (the cookie's value)."""
        return self.app.store.start_session(
            key_id, now, ttl_s=self.ttl_s, max_per_key=self.max_per_key
        )

    def key_id(self, token: str, now: float) -> str | None:
        """The key a live session stands for; ``None`` for an unknown or expired one."""
        return self.app.store.session_key_id(token, now)

    def end(self, token: str) -> None:
        """Log out: the token no longer authenticates anything, on any server."""
        self.app.store.end_session(token)
