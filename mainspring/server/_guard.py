"""Browser-facing defences around every request: CSRF and content-type checks on the
way in, security headers on the way out.

The dashboard authenticates with a cookie, which a browser attaches to requests that
other sites make too. So an unsafe request (POST, PUT, PATCH, DELETE) that carries
the cookie, and every unsafe request to the dashboard (login and logout included),
must come from this origin: ``Sec-Fetch-Site: same-origin``, or an ``Origin`` equal
to the server's own. No other header turns that check off: a browser adds some on
its own (a proxy's ``Authorization: Basic``, cached for the host), and which
credential the API then uses is not the guard's to guess. And the API's bodies must
be ``application/json``, which no plain HTML form can send.
"""

from __future__ import annotations

import json

from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._asgi import HttpMiddleware

__all__ = ["SECURITY_HEADERS", "BrowserGuard", "send_json_error"]

_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# On every response: never framed, never sniffed, no referrer leaves, nothing cached
# (API answers carry runs' data: a shared cache must not keep them).
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
# Swagger UI and ReDoc (``--docs``) load their own scripts: no API policy on them.
_DOC_PAGES = frozenset({"/docs", "/redoc", "/docs/oauth2-redirect"})
# JSON answers need no scripts, styles or frames at all.
_API_CSP = b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'"


class BrowserGuard(HttpMiddleware):
    """ASGI middleware: refuse cross-site unsafe requests that carry the session
    cookie (whatever other credential they carry), refuse non-JSON API bodies (415),
    add security headers."""

    def __init__(self, app: ASGIApp, *, cookie: str) -> None:
        super().__init__(app)
        self.cookie = cookie

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        method = scope["method"]
        path: str = scope["path"]
        dashboard = path == "/ui" or path.startswith("/ui/")
        if method in _UNSAFE:
            problem = self._check(scope, headers, dashboard)
            if problem is not None:
                await _refuse(send, *problem)
                return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = list(message.get("headers", []))
                present = {k.lower() for k, _ in raw}
                for name, value in SECURITY_HEADERS:
                    if name not in present:
                        raw.append((name, value))
                if b"content-security-policy" not in present and path not in _DOC_PAGES:
                    raw.append((b"content-security-policy", _API_CSP))
                if b"cache-control" not in present and path != "/healthz":
                    raw.append((b"cache-control", b"no-store"))
                message = {**message, "headers": raw}
            await send(message)

        await self.app(scope, receive, with_headers)

    def _check(self, scope: Scope, headers: Headers, dashboard: bool) -> tuple[int, str] | None:
        # The cookie is parsed as the endpoints parse it (every Cookie header), so the
        # guard sees it wherever they do.
        by_cookie = any(self.cookie in cookie_parser(v) for v in headers.getlist("cookie"))
        if (dashboard or by_cookie) and not _same_origin(scope, headers):
            return 403, (
                "cross-site request refused: a request that carries the dashboard's session "
                "cookie must come from this origin (Origin or Sec-Fetch-Site: same-origin), "
                "whatever other credential it has; scripts send 'Authorization: Bearer "
                "msk_…' and no cookie"
            )
        content_type = headers.get("content-type")
        if not dashboard and content_type is not None:
            media = content_type.split(";", 1)[0].strip().lower()
            if media != "application/json" and not media.endswith("+json"):
                return 415, (
                    f"the API takes application/json bodies, not {media!r}: send the header"
                    " 'Content-Type: application/json'"
                )
        return None


def _same_origin(scope: Scope, headers: Headers) -> bool:
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site == "same-origin"
    origin = headers.get("origin")
    if origin is None or origin == "null":
        return False
    host = headers.get("host")
    if host is None:
        return False
    scheme = headers.get("x-forwarded-proto") or scope.get("scheme", "http")
    return origin.rstrip("/").lower() == f"{scheme}://{host}".lower()


async def _refuse(send: Send, status: int, message: str) -> None:
    kind = "forbidden" if status == 403 else "unsupported_media_type"
    await send_json_error(
        send,
        status,
        kind,
        message,
        headers=(
            *SECURITY_HEADERS,
            (b"content-security-policy", _API_CSP),
            (b"cache-control", b"no-store"),
        ),
    )


async def send_json_error(
    send: Send,
    status: int,
    kind: str,
    message: str,
    *,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """Answer from raw ASGI with the API's error body, ``{"error": {type, message}}``."""
    body = json.dumps({"error": {"type": kind, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
