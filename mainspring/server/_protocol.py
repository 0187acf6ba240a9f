"""uvicorn's HTTP/1.1 protocol with a deadline for a request's headers.

uvicorn closes a connection that idles between requests (``timeout_keep_alive``) but
waits forever for the headers of a request that trickle in a byte at a time: a few
hundred such connections (slowloris) hold the server's sockets. Here the header
section must be complete within ``HEADER_TIMEOUT_S`` of the connection opening or of
the previous response; a connection still waiting for it then is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HeaderDeadlineProtocol", "with_header_timeout"]


class HeaderDeadlineProtocol(H11Protocol):
    """:class:`H11Protocol` that closes connections whose headers are late."""

    header_timeout_s: float = 10.0

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def _arm(self) -> None:
        waiting_after = self.cycle  # a new request replaces it once its headers are in
        self._header_deadline: asyncio.TimerHandle = self.loop.call_later(
            self.header_timeout_s, self._headers_late, waiting_after
        )

    def _headers_late(self, waiting_after: Any) -> None:
        if self.cycle is waiting_after and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        deadline = getattr(self, "_header_deadline", None)
        if deadline is not None:
            deadline.cancel()
        super().connection_lost(exc)


def with_header_timeout(seconds: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class with its deadline set (uvicorn takes a class)."""
    return type("HeaderDeadline", (HeaderDeadlineProtocol,), {"header_timeout_s": seconds})
