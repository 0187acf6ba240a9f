"""The base of the API's own ASGI middleware."""

from __future__ import annotations

from abc import ABC, abstractmethod

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["HttpMiddleware"]


class HttpMiddleware(ABC):
    """ASGI middleware that acts on HTTP requests only: the server's lifespan messages
    (and a websocket, were there one) go to the app untouched, so that a check meant
    for requests never answers them. Subclasses write :meth:`http`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    @abstractmethod
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one HTTP request, passing it on to ``self.app`` or answering it."""
