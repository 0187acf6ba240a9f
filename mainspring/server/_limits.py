"""A cap on request bodies, enforced before any endpoint reads them."""

from __future__ import annotations

import asyncio

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._asgi import HttpMiddleware
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


class BodySizeLimit(HttpMiddleware):
    """Answer 413 to a body over ``max_bytes``: by its Content-Length at once, or
    while it streams in when it has none; and 408 to a body that pauses longer than
    ``timeout_s`` between chunks."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, timeout_s: float = 30.0) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._declared_too_large(scope):
            await self._reject(send)
            return
        body = _Metered(receive, send, max_bytes=self.max_bytes, timeout_s=self.timeout_s)
        try:
            await self.app(scope, body.receive, body.send)
        except _TooLarge:
            if not body.started:
                await self._reject(send)
        except _TooSlow:
            if not body.started:
                await self._reject(
                    send,
                    408,
                    "request_timeout",
                    f"the request body paused for more than {self.timeout_s:g} s",
                )

    def _declared_too_large(self, scope: Scope) -> bool:
        """Whether a Content-Length alone is over the cap (one that is not a number
        is left to the count as the body streams in)."""
        return any(
            name == b"content-length" and _length(value) > self.max_bytes
            for name, value in scope.get("headers", ())
        )

    async def _reject(
        self, send: Send, status: int = 413, kind: str = "too_large", message: str = ""
    ) -> None:
        message = message or f"the request body is larger than {self.max_bytes} bytes"
        await send_json_error(send, status, kind, message)


def _length(value: bytes) -> int:
    try:
        return int(value)
    except ValueError:
        return -1


class _Metered:
    """One request's ``receive`` and ``send``, wrapped: the body is counted and timed
    as it comes in, and whether the response has started is noted (after that, an
    error can no longer be answered)."""

    def __init__(self, receive: Receive, send: Send, *, max_bytes: int, timeout_s: float) -> None:
        self._receive = receive
        self._send = send
        self._max_bytes = max_bytes
        self._timeout_s = timeout_s
        self._seen = 0
        self._done = False
        self.started = False

    async def receive(self) -> Message:
        if self._done:  # the body is in: the next receive waits for a disconnect, untimed
            return await self._receive()
        try:
            message = await asyncio.wait_for(self._receive(), self._timeout_s)
        except TimeoutError:
            raise _TooSlow(self._timeout_s) from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._done = True
        if message["type"] == "http.request":
            self._seen += len(message.get("body", b""))
            if self._seen > self._max_bytes:
                raise _TooLarge(self._max_bytes)
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)
