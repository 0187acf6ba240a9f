"""The App's admin operations: API keys and webhook endpoints of its store.

What ``mainspring keys …`` / ``mainspring webhooks …``, the HTTP API's ``/webhooks``
and the dashboard's sign-in call. ``app.admin``, a part of :class:`~mainspring.App`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..storage import ApiKey, Webhook
from ._runtime import Part

__all__ = ["Admin"]


class Admin(Part):
    """``app.admin``: API keys (hashed in the store, each token shown once) and webhook
    endpoints."""

    # -- API keys --------------------------------------------------------------------

    def create_key(self, name: str, scopes: Sequence[str]) -> tuple[ApiKey, str]:
        """A new API key: its record and its secret token, returned this once (the
        store keeps only a SHA-256 of it).

        Args:
            name: who or what uses it (answers it gives are recorded as ``by`` this name).
            scopes: some of :data:`~mainspring.storage.SCOPES`: ``read``, ``submit``,
                ``approve``, ``admin`` (implies all), ``metrics``.

        Raises:
            ConfigError: an unknown scope, no scope, or an empty name.
        """
        return self._store.create_api_key(name, scopes, self._clock.now())

    def list_keys(self) -> list[ApiKey]:
        """Every API key's record (revoked ones too), oldest first; never the tokens."""
        return self._store.list_api_keys()

    def get_key(self, key_id: str) -> ApiKey | None:
        """A key's record by its id (revoked keys too); ``None`` if there is none."""
        return self._store.get_api_key(key_id)

    def verify_key(self, token: str) -> ApiKey | None:
        """The key a token belongs to, if the token is genuine (a revoked key too:
        check :meth:`ApiKey.allows <mainspring.storage.ApiKey.allows>` for a scope)."""
        return self._store.verify_api_key(token, self._clock.now())

    def revoke_key(self, key_id: str) -> bool:
        """Revoke a key: its next request gets ``401``. ``False`` when there is no
        such key or it was already revoked."""
        return self._store.revoke_api_key(key_id, self._clock.now())

    # -- webhooks --------------------------------------------------------------------

    def add_webhook(
        self, url: str, *, events: Sequence[str] = (), secret: str | None = None
    ) -> tuple[Webhook, str]:
        """Register an endpoint for run events; returns it and its signing secret
        (``whsec_…``, generated unless given).

        Args:
            url: ``http://`` or ``https://``. Deliveries go to globally routable addresses only
                unless the dispatcher allows a network (see ``docs/http-api.md``).
            events: some of :data:`~mainspring.storage.WEBHOOK_EVENTS`; none: all.

        Raises:
            ConfigError: the URL is not http(s) or an event is unknown.
        """
        return self._store.add_webhook(url, self._clock.now(), secret=secret, events=events)

    def list_webhooks(self) -> list[Webhook]:
        """The registered endpoints (not removed), oldest first."""
        return self._store.list_webhooks()

    def remove_webhook(self, webhook_id: str) -> bool:
        """Stop delivering to an endpoint (its queued deliveries are dropped).
        ``False`` when there is no such endpoint."""
        return self._store.remove_webhook(webhook_id, self._clock.now())
