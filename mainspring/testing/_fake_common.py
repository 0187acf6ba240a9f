"""The machinery of the fake provider servers: a real HTTP server on 127.0.0.1 in a
background thread, a script of replies, and a record of every request.

Each provider's server (:class:`~mainspring.testing.FakeOpenAIServer`,
:class:`~mainspring.testing.FakeAnthropicServer`) only says how its wire looks: the
path it serves, how a reply and an error are rendered, how the API key is sent. The
official SDKs talk to them unmodified, so a test exercises the real client code, its
headers, its error classes and its timeouts.

Handling one request (:meth:`FakeProviderServer._respond`) runs in this order::

    record it → check the API key → take the next scripted reply → wait its delay
    → render its body and headers (usage and rate-limit headers included)

Rate-limit enforcement (``rpm=``, ``tpm=``, ``itpm=``, ``otpm=`` and ``period_s=``, see
:mod:`~mainspring.testing._fake_limits`) sits between "check the API key" and
rendering: the request's input tokens (its reply's usage) are charged to continuously
refilled token buckets; when one cannot pay, the server answers the provider's real
429 (body and headers) and puts the scripted reply back for the retry. Output tokens
are charged once the reply is rendered, and every reply reports the buckets in the
provider's rate-limit headers. ``too_many_requests`` counts every 429 the server sent.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

from ..models import Usage, estimate_tokens
from ._fake_limits import Dim, Refusal, TokenBuckets

__all__ = [
    "FakeProviderServer",
    "FakeReply",
    "FakeToolCall",
    "RecordedRequest",
    "ScriptItem",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedRequest:
    """A request the fake server received.

    Attributes:
        method: ``"POST"``, ...
        path: the request path, query included (``"/v1/chat/completions"``).
        headers: the request headers, names lower-cased.
        body: the JSON body, decoded (``None`` if there was none or it was not JSON).
        at: when it arrived, on the server's clock (its buckets' clock when it
            enforces limits, else ``time.monotonic``).
    """

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeToolCall:
    """A tool call in a scripted reply.

    Attributes:
        name: the tool's name.
        arguments: a dict (sent as the provider sends arguments), or a string sent as
            is: OpenAI's raw ``arguments`` text, broken JSON included; for Anthropic a
            string is decoded to the ``input`` object when it is JSON, else sent as is.
        id: the call id; ``None`` numbers it (``call_1_0``, ``toolu_1_0``: reply 1, call 0).
    """

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeReply:
    """One scripted answer. Build them with the servers' helpers (``text``,
    ``tool_call``, ``error``, ...) rather than by hand.

    Attributes:
        status: the HTTP status.
        text: the assistant's text.
        refusal: a refusal (OpenAI's ``message.refusal``; Anthropic's ``refusal`` stop).
        tool_calls: the tool calls, in order.
        stop_reason: the wire's finish/stop reason; ``None`` derives it (tool calls →
            ``tool_calls``/``tool_use``, else ``stop``/``end_turn``).
        usage: the tokens to report (provider-neutral; rendered in the provider's
            shape); ``None`` estimates them from the request and the reply (bytes / 4).
        error: the error body, for a status of 400 or more.
        body: a whole body sent verbatim, for malformed-reply tests (wins over the rest).
        headers: extra response headers (``retry-after``, rate-limit headers, ...).
        delay_s: how long to wait before answering (past the client's timeout: a hang).
    """

    status: int = 200
    text: str | None = None
    refusal: str | None = None
    tool_calls: tuple[FakeToolCall, ...] = ()
    stop_reason: str | None = None
    usage: Usage | None = None
    error: Mapping[str, Any] | None = None
    body: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


ScriptItem = FakeReply | Callable[[RecordedRequest], FakeReply]
"""A scripted reply, or a function of the request that returns one."""


@dataclass(frozen=True, slots=True)
class _Wire:
    status: int
    headers: dict[str, str]
    body: Mapping[str, Any]
    # A streamed reply (the request said "stream": true): (event name or None, data).
    events: tuple[tuple[str | None, str], ...] | None = None


_REASONS = {429: "Too Many Requests", 529: "Overloaded"}


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps connections alive, as the SDKs' pools expect of a real provider.
    protocol_version = "HTTP/1.1"
    timeout = 30  # an idle kept-alive connection frees its thread after this
    # Headers and body go out in two writes; with Nagle on, each reply waits ~40 ms on
    # the client's delayed ACK.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.connections_lock:
                self.server.connections.discard(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read server.requests, not an access log on stderr

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        request = RecordedRequest(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            at=self.server.owner.now(),
        )
        owner: FakeProviderServer = self.server.owner
        try:
            wire = owner._respond(request)
        except Exception as exc:  # a test's reply function failed: say so, in the wire shape
            wire = owner._render_error(
                owner._error(500, f"{type(owner).__name__}: the scripted reply raised {exc!r}")
            )
        if wire.events is not None:
            self._stream(wire)
            return
        data = json.dumps(wire.body).encode()
        self.send_response(wire.status, _REASONS.get(wire.status))
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in wire.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, wire: _Wire) -> None:
        """Server-sent events, one HTTP chunk each, as the providers stream."""
        assert wire.events is not None
        self.send_response(wire.status)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for name, value in wire.headers.items():
            self.send_header(name, value)
        self.end_headers()
        owner: FakeProviderServer = self.server.owner
        gap = owner.stream_gap_s
        with owner._lock:
            cut, owner.stream_cut_after = owner.stream_cut_after, None
        for n, (event, data) in enumerate(wire.events):
            if cut is not None and n >= cut:  # the connection drops mid-stream
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            frame = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
            raw = frame.encode()
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()
            if gap > 0 and owner._stopping.wait(gap):
                break
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    do_POST = _serve
    do_GET = _serve


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, owner: FakeProviderServer) -> None:
        self.owner = owner
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out and hung up is part of the tests (hangs, timeouts):
        # writing to it fails, and that is not worth a traceback.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class FakeProviderServer(ABC):
    """Base of the fake provider servers: lifecycle, script, record, request pipeline.

    Args:
        api_key: if set, requests with another key get the provider's 401.
        fallback: the reply when the script is empty (a reply or a function of the
            request); ``None`` answers a 400 that names the request, so a test that
            scripted too few replies fails with a clear, non-retryable error.
        rate_limit_headers: headers sent with every successful reply; ``None`` sends
            the provider's typical ones (``DEFAULT_RATE_LIMIT_HEADERS``).
        rpm / tpm / itpm / otpm: enforce these limits per ``period_s`` with token
            buckets (``None``: not enforced); refusals are the provider's 429s.
        period_s: the length of the enforced "minute" (shorter in tests and benches).
        clock: monotonic seconds for the buckets (``time.monotonic``).
        outside_share: another client of the same account (a colleague's script, a
            second service) takes this share of the refill, in gulps at random
            moments (``outside_seed``), from a background thread on the real clock.
            It takes what the buckets hold, never more; ``outside_used`` sums it.

    An enforcing server announces its limits only through its headers, as the
    providers do: every reply (and every 429) carries the buckets' limit, remaining
    and reset in the provider's own header family and formats.

    Attributes:
        requests: every request received, in order.
        too_many_requests: how many 429s the server has sent (scripted or enforced).
        served_usage: ``(clock time, input tokens, output tokens)`` of each reply served.
        refusals: ``(clock time, retry-after seconds, request index)`` of each
            enforced 429 (the index into ``requests``).
        outside_used: what the outside consumer took, per dimension.
        outside_events: ``(clock time, what it took)`` of each of its gulps.
    """

    #: The rate-limit header word of each dimension the provider reports.
    RATE_LIMIT_WORDS: Mapping[Dim, str] = {}
    #: Whether cache reads count toward the input-token limits (not on Anthropic).
    CACHE_READS_COUNT: bool = True

    #: The path the provider serves.
    endpoint: str
    #: Every path it serves (``endpoint`` and any other API of the same provider).
    endpoints: tuple[str, ...] = ()
    #: Rate-limit headers of a reply when the constructor is given none.
    DEFAULT_RATE_LIMIT_HEADERS: Mapping[str, str] = {}

    def __init__(
        self,
        *,
        api_key: str | None = None,
        fallback: ScriptItem | None = None,
        rate_limit_headers: Mapping[str, str] | None = None,
        rpm: float | None = None,
        tpm: float | None = None,
        itpm: float | None = None,
        otpm: float | None = None,
        period_s: float = 60.0,
        clock: Callable[[], float] | None = None,
        outside_share: float = 0.0,
        outside_seed: int = 0,
    ) -> None:
        if not 0 <= outside_share < 1:
            raise ValueError(f"outside_share must be in [0, 1), got {outside_share!r}")
        self.api_key = api_key
        self.outside_share = outside_share
        self._outside_rng = random.Random(outside_seed)
        self.outside_used: dict[Dim, float] = {}
        self.outside_events: list[tuple[float, dict[Dim, float]]] = []
        self.refusals: list[tuple[float, float, int]] = []
        self._outside: threading.Thread | None = None
        given: dict[Dim, float | None] = {"rpm": rpm, "tpm": tpm, "itpm": itpm, "otpm": otpm}
        enforced = {d: v for d, v in given.items() if v is not None}
        self.buckets: TokenBuckets | None = (
            TokenBuckets(enforced, period_s=period_s, **({"clock": clock} if clock else {}))
            if enforced
            else None
        )
        self.too_many_requests = 0
        self.served_usage: list[tuple[float, int, int]] = []
        self.fallback = fallback
        self.rate_limit_headers = dict(
            self.DEFAULT_RATE_LIMIT_HEADERS if rate_limit_headers is None else rate_limit_headers
        )
        self.requests: list[RecordedRequest] = []
        self._script: deque[ScriptItem] = deque()
        self._lock = threading.Lock()
        self._served = 0
        self._stopping = threading.Event()
        #: Seconds between two streamed events (0: send them back to back).
        self.stream_gap_s = 0.0
        #: The next streamed reply drops its connection after this many events.
        self.stream_cut_after: int | None = None
        self._http: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def now(self) -> float:
        """The server's clock: its buckets' when it enforces limits."""
        return self.buckets.clock() if self.buckets is not None else time.monotonic()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Listen on an ephemeral port of 127.0.0.1 and serve in a background thread."""
        if self._http is not None:
            return self
        self._stopping.clear()
        self._http = _HTTPServer(self)
        self._thread = threading.Thread(
            target=self._http.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{type(self).__name__}:{self.port}",
            daemon=True,
        )
        self._thread.start()
        if self.outside_share > 0 and self.buckets is not None:
            self._outside = threading.Thread(
                target=self._consume_outside, name=f"{type(self).__name__}:outside", daemon=True
            )
            self._outside.start()
        return self

    def _consume_outside(self) -> None:
        """Gulps of 5 to 25 % of a period's refill, at random moments, averaging
        ``outside_share`` of the refill."""
        assert self.buckets is not None
        period = self.buckets.period_s
        while True:
            gulp = self._outside_rng.uniform(0.05, 0.25)
            # A gulp of g periods' refill share, every g / share periods on average.
            pause = self._outside_rng.expovariate(self.outside_share / (gulp * period))
            if self._stopping.wait(pause):
                return
            taken = self.buckets.drain(gulp)
            with self._lock:
                self.outside_events.append((self.buckets.clock(), taken))
                for d, v in taken.items():
                    self.outside_used[d] = self.outside_used.get(d, 0.0) + v

    def stop(self) -> None:
        """Stop serving, wake delayed replies and close every connection."""
        http, self._http = self._http, None
        if http is None:
            return
        self._stopping.set()
        http.shutdown()
        with http.connections_lock:
            open_connections = list(http.connections)
        for conn in open_connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        http.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._outside is not None:
            self._outside.join(timeout=5)
            self._outside = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port the server listens on (started servers only)."""
        if self._http is None:
            raise RuntimeError(f"{type(self).__name__} is not started: use it with `with`")
        return int(self._http.server_address[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, without a path."""
        return f"http://127.0.0.1:{self.port}"

    @property
    @abstractmethod
    def base_url(self) -> str:
        """The ``base_url`` to give the provider's SDK (or mainspring's adapter)."""

    # -- script ------------------------------------------------------------------------

    def script(self, replies: Iterable[ScriptItem]) -> Self:
        """Queue replies, answered in order, one per request (appends to the queue)."""
        with self._lock:
            self._script.extend(replies)
        return self

    def reset(self) -> Self:
        """Forget the script and the recorded requests (to share one server between tests)."""
        with self._lock:
            self._script.clear()
            self.requests.clear()
            self._served = 0
            self.too_many_requests = 0
            self.served_usage.clear()
            self.refusals.clear()
        return self

    @property
    def pending(self) -> int:
        """Scripted replies not yet used."""
        with self._lock:
            return len(self._script)

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies of the requests received, in order."""
        with self._lock:
            return [r.body for r in self.requests]

    # -- reply builders (the same for every provider) ------------------------------------

    @staticmethod
    def text(
        text: str,
        *,
        usage: Usage | None = None,
        stop_reason: str | None = None,
        headers: Mapping[str, str] | None = None,
        delay_s: float = 0.0,
    ) -> FakeReply:
        """A text reply."""
        return FakeReply(
            text=text, usage=usage, stop_reason=stop_reason, headers=headers or {}, delay_s=delay_s
        )

    @staticmethod
    def tool_call(
        name: str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        id: str | None = None,
        text: str | None = None,
        usage: Usage | None = None,
        headers: Mapping[str, str] | None = None,
        delay_s: float = 0.0,
    ) -> FakeReply:
        """A reply that calls one tool (``arguments`` as a string is sent verbatim)."""
        call = FakeToolCall(name=name, arguments={} if arguments is None else arguments, id=id)
        return FakeReply(
            text=text, tool_calls=(call,), usage=usage, headers=headers or {}, delay_s=delay_s
        )

    @staticmethod
    def tool_calls(
        *calls: FakeToolCall | tuple[str, Mapping[str, Any] | str],
        text: str | None = None,
        usage: Usage | None = None,
        headers: Mapping[str, str] | None = None,
        delay_s: float = 0.0,
    ) -> FakeReply:
        """A reply that calls several tools at once: ``tool_calls(("a", {...}), ("b", {...}))``."""
        made = tuple(
            c if isinstance(c, FakeToolCall) else FakeToolCall(name=c[0], arguments=c[1])
            for c in calls
        )
        return FakeReply(
            text=text, tool_calls=made, usage=usage, headers=headers or {}, delay_s=delay_s
        )

    @staticmethod
    def refusal(text: str = "I can't help with that.", *, delay_s: float = 0.0) -> FakeReply:
        """A refusal, in the provider's way of saying it."""
        return FakeReply(refusal=text, delay_s=delay_s)

    # -- request pipeline ----------------------------------------------------------------

    def _respond(self, request: RecordedRequest) -> _Wire:
        wire = self._answer(request)
        if wire.status == 429:
            with self._lock:
                self.too_many_requests += 1
        return wire

    def _answer(self, request: RecordedRequest) -> _Wire:
        with self._lock:
            self.requests.append(request)
            index = len(self.requests)
        path = request.path.split("?", 1)[0]
        if request.method != "POST" or path not in (self.endpoint, *self.endpoints):
            return self._render_error(self._error(404, f"no route {request.method} {path}"))
        if self.api_key is not None and self._api_key_of(request) != self.api_key:
            return self._render_error(self._unauthorized())
        reply, scripted = self._next_reply(request, index)
        usage, refused = self._admit(reply, request, index, scripted)
        if refused is not None:
            return refused
        if reply.delay_s > 0 and self._stopping.wait(reply.delay_s):
            return self._render_error(self._error(503, "the fake server is stopping"))
        if reply.body is not None:
            return _Wire(reply.status, {**reply.headers}, reply.body)
        if reply.status >= 400:
            return self._render_error(reply)
        with self._lock:
            self._served += 1
            served = self._served
        body = self._render_reply(reply, request, served)
        if usage is not None:
            self._charge(usage)
        headers = {**self._rate_limit_headers(request), **reply.headers}
        if isinstance(request.body, Mapping) and request.body.get("stream"):
            events = tuple(self._stream_events(body, request))
            return _Wire(reply.status, headers, body, events)
        return _Wire(reply.status, headers, body)

    def _admit(
        self, reply: FakeReply, request: RecordedRequest, index: int, scripted: bool
    ) -> tuple[Usage | None, _Wire | None]:
        """Where the buckets are enforced, ask them to admit a successful reply: its
        usage, or the provider's 429 (a scripted reply is kept for the retry)."""
        if self.buckets is None or reply.status >= 400 or reply.body is not None:
            return None, None
        usage = self._usage(reply, request)
        counted = usage.input_tokens - (0 if self.CACHE_READS_COUNT else usage.cache_read_tokens)
        refusal = self.buckets.admit({"rpm": 1, "tpm": counted, "itpm": counted})
        if refusal is None:
            return usage, None
        with self._lock:
            self.refusals.append((self.buckets.clock(), refusal.retry_after, index - 1))
        if scripted:  # the retry gets the same reply
            with self._lock:
                self._script.appendleft(reply)
        return usage, self._render_error(self._refused(refusal, request))

    def _charge(self, usage: Usage) -> None:
        """Charge a served reply's output to the buckets (``usage``: as admitted)."""
        assert self.buckets is not None  # usage is only admitted by buckets
        self.buckets.charge({"tpm": usage.output_tokens, "otpm": usage.output_tokens})
        with self._lock:
            self.served_usage.append(
                (self.buckets.clock(), usage.input_tokens, usage.output_tokens)
            )

    def _next_reply(self, request: RecordedRequest, index: int) -> tuple[FakeReply, bool]:
        """The next reply, and whether it came from the script (not the fallback)."""
        with self._lock:
            scripted = bool(self._script)
            item = self._script.popleft() if self._script else self.fallback
        if item is None:
            return self._error(
                400,
                f"{type(self).__name__}: nothing scripted for request #{index} "
                f"(script more replies with server.script([...]))",
            ), False
        return (item(request) if callable(item) else item), scripted

    def _bucket_headers(self) -> dict[str, str]:
        """The buckets in the provider's rate-limit headers (none when not enforcing)."""
        return {}

    def _refused(self, refusal: Refusal, request: RecordedRequest) -> FakeReply:
        """The provider's 429 for a request the buckets refused."""
        return self._error(429, f"rate limit exceeded on {refusal.dim}")

    def _render_error(self, reply: FakeReply) -> _Wire:
        error = reply.error
        if error is None:
            error = self._error(reply.status, f"HTTP {reply.status}").error or {}
        return _Wire(reply.status, {**reply.headers}, error)

    def _rate_limit_headers(self, request: RecordedRequest) -> dict[str, str]:
        """Rate-limit headers of a successful reply: the buckets' own where they are
        enforced, the constructor's ``rate_limit_headers`` for the rest."""
        headers = dict(self.rate_limit_headers)
        headers.update(self._bucket_headers())  # the enforced dimensions' own
        return headers

    def estimate_input_tokens(self, body: Any) -> int:
        """Estimated input tokens of a request body (JSON bytes / 4)."""
        if not isinstance(body, Mapping):
            return 0
        keys = ("system", "messages", "instructions", "input", "tools")
        parts = [body.get(k) for k in keys if body.get(k)]
        return estimate_tokens(json.dumps(parts))

    def _usage(self, reply: FakeReply, request: RecordedRequest) -> Usage:
        if reply.usage is not None:
            return reply.usage
        out = (reply.text or "") + "".join(
            c.name + (c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments))
            for c in reply.tool_calls
        )
        return Usage(
            input_tokens=self.estimate_input_tokens(request.body),
            output_tokens=estimate_tokens(out),
        )

    # -- what each provider defines ------------------------------------------------------

    @abstractmethod
    def _stream_events(
        self, body: Mapping[str, Any], request: RecordedRequest
    ) -> list[tuple[str | None, str]]:
        """A rendered reply as the provider's streamed events (``stream: true``)."""

    @abstractmethod
    def _api_key_of(self, request: RecordedRequest) -> str | None:
        """The API key the request carries."""

    @abstractmethod
    def _unauthorized(self) -> FakeReply:
        """The provider's reply to a wrong API key."""

    @abstractmethod
    def _render_reply(self, reply: FakeReply, request: RecordedRequest, n: int) -> dict[str, Any]:
        """The body of a successful reply (``n`` numbers the replies, from 1)."""

    @abstractmethod
    def _error(self, status: int, message: str) -> FakeReply:
        """An error reply in the provider's shape, of the type that fits ``status``."""


def pieces(text: str, size: int = 4) -> list[str]:
    """Text in the small pieces a provider streams it in."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def rate_limited_headers(
    remaining: str, retry_after: float | None, headers: Mapping[str, str] | None
) -> dict[str, str]:
    """The headers of a scripted 429, in every provider's shape: ``remaining`` (the
    provider's name for the exhausted dimension's remaining count) at 0,
    ``retry-after`` in seconds unless ``retry_after`` is None, and the caller's
    ``headers`` over them."""
    sent = {remaining: "0"}
    if retry_after is not None:
        sent["retry-after"] = f"{retry_after:g}"
    sent.update(headers or {})
    return sent


def call_id(call: FakeToolCall, reply_n: int, index: int, prefix: str = "call") -> str:
    """The id of a scripted call: its own, or ``{prefix}_{reply}_{index}``."""
    return call.id or f"{prefix}_{reply_n}_{index}"
