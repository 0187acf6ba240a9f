"""A cap on request bodies, enforced before any endpoint reads them."""

from __future__ import annotations

import asyncio

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._guard import send_json_error

__all__ = ["BodySizeLimit"]


# HTTP exceptions, so that FastAPI's body reading lets them through (it turns any other
# error while reading into a 400) to the JSON error handler.
class _TooLarge(HTTPException):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body is larger than {max_bytes} bytes")


class _TooSlow(HTTPException):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(408, f"the request body paused for more than {timeout_s:g} s")


class BodySizeLimit:
    """Answer 413 to a body over ``max_bytes``: by its Content-Length at once, or
    while it streams in when it has none; and 408 to a body that pauses longer than
    ``timeout_s`` between chunks."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, timeout_s: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_large = int(value) > self.max_bytes
                except ValueError:
                    too_large = False
                if too_large:
                    await self._reject(send)
                    return
        seen = 0
        started = False
        done = False

        async def limited() -> Message:
            nonlocal seen, done
            if done:  # the body is in: the next receive waits for a disconnect, untimed
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except TimeoutError:
                raise _TooSlow(self.timeout_s) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                done = True
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited, tracking)
        except _TooLarge:
            if not started:
                await self._reject(send)
        except _TooSlow:
            if not started:
                await self._reject(
                    send,
                    408,
                    "request_timeout",
                    f"the request body paused for more than {self.timeout_s:g} s",
                )

    async def _reject(
        self, send: Send, status: int = 413, kind: str = "too_large", message: str = ""
    ) -> None:
        message = message or f"the request body is larger than {self.max_bytes} bytes"
        await send_json_error(send, status, kind, message)
