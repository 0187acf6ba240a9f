"""What every router of the HTTP API shares, handed to its endpoints by FastAPI's
dependencies.

``create_app`` builds one :class:`ApiContext` and keeps it on ``api.state``; an
endpoint asks for it with a ``ctx: Ctx`` parameter and for its caller's key with
``_key: Read`` (or ``Submit``, ``Approve``, ``Admin``, ``Scrape``). The routers are
plain module-level ``APIRouter`` values: nothing is captured in a closure, so one
endpoint can be read, and called, on its own.
"""

# No ``from __future__ import annotations``: FastAPI reads the dependencies'
# annotations at runtime.
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import APIKeyCookie, APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from .. import App
from ..dashboard import Sessions
from ..storage import ApiKey, Scope
from ._schemas import ErrorOut
from ._targets import TargetPolicy

__all__ = [
    "COOKIE",
    "Admin",
    "ApiContext",
    "Approve",
    "AuthError",
    "Ctx",
    "Read",
    "Scrape",
    "StreamCap",
    "Submit",
    "responses",
]

audit = logging.getLogger("mainspring.auth")

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in (
        (401, "No key, or a wrong or revoked one."),
        (403, "The key lacks the scope this endpoint needs."),
        (404, "No such run or request."),
        (409, "The run's state does not allow it (finished, already answered)."),
        (413, "The body is larger than the server accepts."),
        (415, "The body is not application/json."),
        (422, "The body or a parameter is malformed; the message names it."),
        (429, "The key already holds its limit of open event streams."),
        (503, "The database is unavailable; retry after the Retry-After seconds."),
    )
}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error responses an endpoint documents (auth and store errors always; a
    body that is not JSON wherever a body is taken)."""
    body = {415} if 413 in codes else set()
    return {c: ERRORS[c] for c in sorted({401, 403, 503, *codes, *body})}


class AuthError(Exception):
    """A refusal before the endpoint runs: 401, 403, or 429 for too many streams."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message


class StreamCap:
    """Open event streams per key, at most ``limit``: a key cannot hold the server's
    connections (or database polls) without bound."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def hold(self, key: ApiKey, stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        with self._lock:
            if self._open.get(key.id, 0) >= self.limit:
                raise AuthError(
                    429, f"the API key {key.name!r} already has {self.limit} open event streams"
                )
            self._open[key.id] = self._open.get(key.id, 0) + 1
        return self._counted(key.id, stream)

    async def _counted(self, key_id: str, stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        try:
            async for chunk in stream:
                yield chunk
        finally:
            with self._lock:
                left = self._open.get(key_id, 1) - 1
                if left:
                    self._open[key_id] = left
                else:
                    self._open.pop(key_id, None)


@dataclass(frozen=True, kw_only=True)
class ApiContext:
    """One server's state: the app, the dashboard's sessions, and the settings and
    per-process counters of ``create_app``."""

    app: App
    sessions: Sessions
    targets: TargetPolicy
    streams: StreamCap
    events_poll_s: float
    max_stream_s: float | None
    # The metrics collector caches finished runs: one scrape at a time.
    metrics_lock: threading.Lock = field(default_factory=threading.Lock)

    def active(self, key_id: str) -> bool:
        """Whether the key still exists unrevoked (an open stream re-checks its own)."""
        key = self.app.admin.get_key(key_id)
        return key is not None and key.revoked_at is None


def context(request: Request) -> ApiContext:
    """The dependency that hands an endpoint its server's :class:`ApiContext`."""
    ctx: ApiContext = request.app.state.mainspring
    return ctx


Ctx = Annotated[ApiContext, Depends(context)]

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer msk_…`")
_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="An API key.")
# The dashboard's session: the same key, in an HttpOnly, SameSite=Strict cookie.
COOKIE = "mainspring_key"
_cookie = APIKeyCookie(name=COOKIE, auto_error=False, description="The dashboard's key.")


def _presented(
    ctx: ApiContext, bearer: HTTPAuthorizationCredentials | None, header: str | None, cookie: str
) -> ApiKey:
    """The valid, unrevoked key a request presents (a token, or a dashboard session)."""
    if bearer is not None and header and bearer.credentials != header:
        # Two different keys: refuse rather than guess which one was meant.
        raise AuthError(401, "two different API keys (Authorization and X-API-Key)")
    token = bearer.credentials if bearer is not None else header
    if not token and not cookie:
        raise AuthError(401, "an API key is required: 'Authorization: Bearer msk_…'")
    if token:
        key = ctx.app.admin.verify_key(token)
    else:  # the dashboard's session: the cookie stands for a key, never holds one
        key_id = ctx.sessions.key_id(cookie, ctx.app.clock.now())
        key = ctx.app.admin.get_key(key_id) if key_id is not None else None
    if key is None:
        audit.warning("API request with an invalid key or session refused")
        raise AuthError(401, "the API key is not valid")
    if key.revoked_at is not None:
        audit.warning("API request with the revoked key %r refused", key.id)
        raise AuthError(401, f"the API key {key.id!r} was revoked")
    return key


def refuse(key: ApiKey, needs: str) -> AuthError:
    """The 403 for ``key``, which lacks what ``needs`` names."""
    return AuthError(403, f"the API key {key.name!r} has scopes {list(key.scopes)!r}; {needs}")


def key_with(scope: Scope, *also: Scope) -> Callable[..., ApiKey]:
    """A dependency admitting a key with ``scope`` (or any of ``also``)."""

    def check(
        bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        header: Annotated[str | None, Depends(_header)],
        cookie: Annotated[str | None, Depends(_cookie)],
        ctx: Ctx,
    ) -> ApiKey:
        key = _presented(ctx, bearer, header, cookie or "")
        if not any(key.allows(s) for s in (scope, *also)):
            raise refuse(key, "this needs " + " or ".join(repr(s) for s in (scope, *also)))
        return key

    return check


Read = Annotated[ApiKey, Depends(key_with("read"))]
Submit = Annotated[ApiKey, Depends(key_with("submit"))]
Approve = Annotated[ApiKey, Depends(key_with("approve"))]
Admin = Annotated[ApiKey, Depends(key_with("admin"))]
# A scrape key needs only "metrics"; read keys kept scraping before that scope existed.
Scrape = Annotated[ApiKey, Depends(key_with("metrics", "read"))]
