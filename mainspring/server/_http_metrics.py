"""Counts HTTP requests by route template, method and status for ``/metrics``."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._asgi import HttpMiddleware

__all__ = ["METHODS", "RequestCounter"]

#: The methods counted by name; any other (a client may send any token) is ``other``.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestCounter(HttpMiddleware):
    """ASGI middleware: after each response starts, ``record(method, route, status)``.

    Every label is bounded, whatever a client sends (anyone may send requests, with no
    key): ``route`` is the matched route's template (``/runs/{run_id}``), never the raw
    path, so run ids do not become label values, and an unmatched path is
    ``unmatched``; ``method`` is one of :data:`METHODS` or ``other`` (an invented
    method would otherwise add a series to every scrape, for ever).
    """

    def __init__(self, app: ASGIApp, *, record: Callable[[str, str, int], None]) -> None:
        super().__init__(app)
        self.record = record

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 500  # an exception before any response is a server error

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = str(scope.get("method", ""))
            self.record(method if method in METHODS else "other", route, status)
