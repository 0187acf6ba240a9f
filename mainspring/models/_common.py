"""What the provider adapters share: rate-limit headers, ``retry-after`` parsing,
error bodies, token estimates and one SDK client per event loop."""

from __future__ import annotations

import asyncio
import email.utils
import functools
import importlib
import importlib.util
import json
import math
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Generic, TypeVar

from ._types import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)

__all__ = [
    "LoopClients",
    "error_fields",
    "estimate_input_tokens",
    "estimate_tokens",
    "parse_duration",
    "rate_limit_headers",
    "retry_after_from_headers",
    "transport_errors",
]


@functools.cache
def transport_errors() -> tuple[type[Exception], ...]:
    """The HTTP transport errors of the SDKs' HTTP clients: ``httpx`` (openai) and
    ``httpx2`` (newer anthropic releases). A connection dropped in the middle of a
    streamed body surfaces as one of them, not as the SDK's own error. Imported when
    first asked (an ``except`` clause evaluates it only for an exception)."""
    found: list[type[Exception]] = []
    for name in ("httpx", "httpx2"):
        if importlib.util.find_spec(name) is not None:
            error = getattr(importlib.import_module(name), "TransportError", None)
            if isinstance(error, type) and issubclass(error, Exception):
                found.append(error)
    return tuple(found)


_RATE_LIMIT_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")
_RETRY_HEADERS = ("retry-after", "retry-after-ms")


def rate_limit_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The rate-limit headers of a response, names lower-cased."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        low = name.lower()
        if low.startswith(_RATE_LIMIT_PREFIXES) or low in _RETRY_HEADERS:
            out[low] = value
    return out


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_duration(text: str) -> float | None:
    """Seconds in an OpenAI reset duration such as ``"1s"``, ``"6m0s"``, ``"20ms"``,
    ``"1h2m3.5s"`` (or a bare number of seconds); ``None`` if it is not one."""
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def _seconds_until(text: str, now: float) -> float | None:
    """Seconds from ``now`` to an RFC 3339 or HTTP date; ``None`` if it is neither."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text).timestamp()
        except (TypeError, ValueError):
            return None
    return max(0.0, when - now)


def _reset_header(name: str, value: str, now: float) -> tuple[str, float | None, str] | None:
    """``(word, seconds, remaining header)`` of a rate-limit reset header (``name``
    lower-cased), or ``None`` for any other header: OpenAI's ``x-ratelimit-reset-*`` is
    a duration, Anthropic's ``anthropic-ratelimit-*-reset`` a timestamp."""
    if name.startswith("x-ratelimit-reset-"):
        word = name.removeprefix("x-ratelimit-reset-")
        return word, parse_duration(value), "x-ratelimit-remaining-" + word
    if name.startswith("anthropic-ratelimit-") and name.endswith("-reset"):
        word = name.removeprefix("anthropic-ratelimit-").removesuffix("-reset")
        return word, _seconds_until(value, now), name.removesuffix("-reset") + "-remaining"
    return None


def reset_seconds(headers: Mapping[str, str], *, now: float) -> dict[str, float]:
    """When each rate-limit bucket a response names is full again, in seconds from
    ``now``, keyed by the header's word (``"requests"``, ``"tokens"``,
    ``"input-tokens"``, ``"output-tokens"``): OpenAI's ``x-ratelimit-reset-*`` durations
    (``"1s"``, ``"6m0s"``) and Anthropic's ``anthropic-ratelimit-*-reset`` timestamps.
    Values that cannot be read are left out."""
    out: dict[str, float] = {}
    for name, value in headers.items():
        reset = _reset_header(name.lower(), value, now)
        if reset is not None and reset[1] is not None:
            out[reset[0]] = reset[1]
    return out


def _explicit_retry_after(low: Mapping[str, str], now: float) -> float | None:
    """``retry-after-ms``, then ``retry-after`` in seconds or as an HTTP date."""
    if "retry-after-ms" in low:
        try:
            return max(0.0, float(low["retry-after-ms"]) / 1000.0)
        except ValueError:
            pass
    if "retry-after" in low:
        value = low["retry-after"].strip()
        try:
            return max(0.0, float(value))
        except ValueError:
            return _seconds_until(value, now)
    return None


def _longest_reset(low: Mapping[str, str], now: float) -> float | None:
    """The latest reset among the exhausted dimensions, or among all if none says it
    is exhausted: the request needs every dimension to have room again."""
    found: list[float] = []
    exhausted: list[float] = []
    for name, value in low.items():
        reset = _reset_header(name, value, now)
        if reset is None:
            continue
        _, seconds, remaining_header = reset
        if seconds is None:
            continue
        found.append(seconds)
        remaining = low.get(remaining_header)
        if remaining is not None and remaining.strip() in ("0", "0.0"):
            exhausted.append(seconds)
    chosen = exhausted or found
    return max(chosen) if chosen else None


def retry_after_from_headers(
    headers: Mapping[str, str], *, now: float | None = None, resets: bool = True
) -> float | None:
    """How long a 429 asks the caller to wait, in seconds, or ``None`` if it does not say.

    The explicit headers win (``retry-after-ms``, then ``retry-after`` in seconds or as
    an HTTP date). Failing those, and if ``resets``, the reset time of each exhausted
    dimension (``x-ratelimit-reset-*`` durations, ``anthropic-ratelimit-*-reset``
    timestamps): the longest one, because the request needs every dimension to have
    room again.
    """
    low = {k.lower(): v for k, v in headers.items()}
    now = time.time() if now is None else now
    explicit = _explicit_retry_after(low, now)
    if explicit is not None or not resets:
        return explicit
    return _longest_reset(low, now)


def error_fields(body: object) -> tuple[str | None, str | None, str | None]:
    """``(type, code, message)`` of a provider error body.

    Accepts the whole body (``{"error": {...}}``, Anthropic's
    ``{"type": "error", "error": {...}}``) or just its inner object, as the SDKs pass
    one or the other as ``APIStatusError.body``.
    """
    if not isinstance(body, Mapping):
        return None, None, (str(body) if body else None)
    inner = body.get("error")
    err: Mapping[str, Any] = inner if isinstance(inner, Mapping) else body

    def text(key: str) -> str | None:
        value = err.get(key)
        return None if value is None else str(value)

    code = text("code")
    details = err.get("details")
    if code is None and isinstance(details, Mapping) and details.get("error_code"):
        code = str(details["error_code"])
    return text("type"), code, text("message")


def estimate_tokens(text: str) -> int:
    """A provider-free token estimate: UTF-8 bytes / 4, rounded up."""
    return math.ceil(len(text.encode()) / 4)


def _message_text(message: Message) -> str:
    if isinstance(message, SystemMessage | UserMessage):
        return message.content
    if isinstance(message, AssistantMessage):
        calls = "".join(c.name + c.arguments for c in message.tool_calls)
        return (message.text or "") + calls
    if isinstance(message, ToolResultMessage):
        return message.name + message.content
    raise TypeError(f"not a message: {message!r}")  # pragma: no cover - typed away


def estimate_input_tokens(messages: Iterable[Message], tools: Sequence[ToolSpec] = ()) -> int:
    """Estimated prompt tokens of a request: its messages and tool schemas."""
    text = "".join(_message_text(m) for m in messages)
    text += "".join(t.name + t.description + json.dumps(t.parameters) for t in tools)
    return estimate_tokens(text)


C = TypeVar("C")


class LoopClients(Generic[C]):
    """One SDK client per running event loop.

    An async HTTP client's pooled connections belong to the loop that opened them, and
    one ``Model`` object outlives loops (defined at import time, used by a worker's loop,
    by ``asyncio.run`` in a script, by each test's loop). So the adapter makes a client
    the first time a loop asks. Call ``aclose()`` before a loop ends to close its client
    cleanly; a client left open is dropped once its loop is closed.
    """

    def __init__(self, factory: Callable[[], C], close: Callable[[C], Awaitable[None]]) -> None:
        self._factory = factory
        self._close = close
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, C] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> C:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            # A client's pooled connections keep their loop alive, so a weak key alone
            # never lets go: drop the clients of closed loops here (they were not
            # closed with aclose(), and their sockets go with the garbage collector).
            for dead in [other for other in self._clients if other.is_closed()]:
                del self._clients[dead]
            client = self._factory()
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        """Close the client of the running loop (the others' loops own their sockets)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await self._close(client)
