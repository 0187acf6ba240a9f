"""The HTTP API: submit, follow, steer and answer runs.

Endpoints that touch the store are plain ``def``: FastAPI runs them in its thread
pool, so a slow database never blocks the event loop that streams events.
"""

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from fastapi.security import APIKeyCookie, APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from .. import (
    App,
    ConfigError,
    InvalidAnswer,
    MainspringError,
    RequestNotFound,
    ReservedSignal,
    RunConflict,
    RunNotFound,
    ScheduleNotFound,
    StoreUnavailable,
)
from ..dashboard import Sessions, dashboard_router
from ..storage import FINISHED, ApiKey, Scope, redact_url
from ._events import event_stream, runs_stream
from ._guard import BrowserGuard
from ._http_metrics import RequestCounter
from ._limits import BodySizeLimit
from ._queues import queue_routes
from ._schedules import add_schedule_routes
from ._schemas import (
    AnswerIn,
    CancelIn,
    CancelOut,
    ChildOut,
    ErrorOut,
    ForkIn,
    Health,
    RequestOut,
    RunList,
    RunOut,
    RunStatusName,
    SignalIn,
    SignalOut,
    StepList,
    SubmitIn,
    SubmitOut,
    WebhookIn,
    WebhookOut,
)
from ._targets import TargetPolicy
from ._views import family_out, request_out, run_out, step_out, usage_out
from ._webhooks import WebhookDispatcher

__all__ = ["create_app"]

audit = logging.getLogger("mainspring.auth")

_ERRORS: dict[int | str, dict[str, Any]] = {
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


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error responses an endpoint documents (auth and store errors always; a
    body that is not JSON wherever a body is taken)."""
    body = {415} if 413 in codes else set()
    return {c: _ERRORS[c] for c in sorted({401, 403, 503, *codes, *body})}


_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer msk_…`")
_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="An API key.")
# The dashboard's session: the same key, in an HttpOnly, SameSite=Strict cookie.
COOKIE = "mainspring_key"
_cookie = APIKeyCookie(name=COOKIE, auto_error=False, description="The dashboard's key.")


class _AuthError(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message


def create_app(
    app: App,
    *,
    worker: bool = False,
    webhooks: bool = True,
    max_body_bytes: int = 1 << 20,
    events_poll_s: float = 0.2,
    worker_options: dict[str, Any] | None = None,
    docs: bool = False,
    secure_cookies: bool | None = None,
    max_streams_per_key: int = 16,
    webhook_allow: Sequence[str] = (),
    body_timeout_s: float = 30.0,
    max_stream_s: float | None = 3600.0,
) -> FastAPI:
    """The HTTP API of ``app`` as an ASGI application.

    Args:
        worker: also run a :class:`~mainspring.Worker` in the server's process.
        webhooks: deliver the webhook outbox from this process.
        max_body_bytes: larger request bodies get 413.
        events_poll_s: how often an event stream looks for new steps.
        worker_options: keyword arguments of the embedded worker.
        docs: serve Swagger UI at ``/docs`` and ReDoc at ``/redoc`` (off by default:
            they load scripts from a CDN on the dashboard's origin). ``/openapi.json``
            is always served.
        secure_cookies: mark the dashboard's session cookie ``Secure`` (``None``: when
            the login request came over HTTPS; set ``True`` behind a TLS proxy).
        max_streams_per_key: open event streams one key may hold; more get 429.
        webhook_allow: networks beside globally routable addresses that webhooks may target
            (``"10.0.0.0/8"``; ``"*"``: any), checked when one is registered and at
            each delivery.
        body_timeout_s: a request body that pauses longer than this between chunks
            gets 408 (a slow client cannot hold a worker thread).
        max_stream_s: an event stream ends after this long and the client resumes
            from ``Last-Event-ID`` (EventSource does it by itself); ``None``: never.
    """
    targets = TargetPolicy(webhook_allow)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        tasks: list[asyncio.Task[None]] = []
        running = app.worker(**(worker_options or {})) if worker else None
        dispatcher = (
            WebhookDispatcher(app.store, clock=app.clock, allow_networks=webhook_allow)
            if webhooks
            else None
        )
        if running is not None:
            tasks.append(asyncio.create_task(running.run()))
        if dispatcher is not None:
            tasks.append(asyncio.create_task(dispatcher.run()))
        try:
            yield
        finally:
            if running is not None:
                running.request_stop()
            if dispatcher is not None:
                dispatcher.stop()
            await asyncio.gather(*tasks, return_exceptions=True)

    api = FastAPI(
        title="mainspring",
        version="1",
        description="Submit long-running agent runs, follow them, and steer them: "
        "signals, answers to approvals and questions, cancellation. Every endpoint but "
        "/healthz needs an API key (`mainspring keys create`).",
        lifespan=lifespan,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
    )
    api.add_middleware(BodySizeLimit, max_bytes=max_body_bytes, timeout_s=body_timeout_s)
    api.add_middleware(BrowserGuard, cookie=COOKIE)
    api.add_middleware(RequestCounter, record=app.telemetry.http_request)  # outermost
    _errors(api, app)
    sessions = Sessions(app)
    api.include_router(dashboard_router(app, sessions, secure_cookies=secure_cookies))

    @api.get("/", include_in_schema=False)
    def home() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=307)

    def key_with(scope: Scope, *also: Scope) -> Callable[..., ApiKey]:
        """A dependency admitting a key with ``scope`` (or any of ``also``)."""

        def check(
            bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
            header: Annotated[str | None, Depends(_header)],
            cookie: Annotated[str | None, Depends(_cookie)],
        ) -> ApiKey:
            if bearer is not None and header and bearer.credentials != header:
                # Two different keys: refuse rather than guess which one was meant.
                raise _AuthError(401, "two different API keys (Authorization and X-API-Key)")
            token = bearer.credentials if bearer is not None else header
            if not token and not cookie:
                raise _AuthError(401, "an API key is required: 'Authorization: Bearer msk_…'")
            if token:
                key = app.verify_key(token)
            else:  # the dashboard's session: the cookie stands for a key, never holds one
                key_id = sessions.key_id(cookie or "", app.clock.now())
                key = app.get_key(key_id) if key_id is not None else None
            if key is None:
                audit.warning("API request with an invalid key or session refused")
                raise _AuthError(401, "the API key is not valid")
            if key.revoked_at is not None:
                audit.warning("API request with the revoked key %r refused", key.id)
                raise _AuthError(401, f"the API key {key.id!r} was revoked")
            if not any(key.allows(s) for s in (scope, *also)):
                needs = " or ".join(repr(s) for s in (scope, *also))
                raise _AuthError(
                    403,
                    f"the API key {key.name!r} has scopes {list(key.scopes)!r}; this needs {needs}",
                )
            return key

        return check

    metrics_lock = threading.Lock()
    streams = _StreamCap(max_streams_per_key)
    Read = Annotated[ApiKey, Depends(key_with("read"))]
    Submit = Annotated[ApiKey, Depends(key_with("submit"))]
    Approve = Annotated[ApiKey, Depends(key_with("approve"))]
    Admin = Annotated[ApiKey, Depends(key_with("admin"))]
    # A scrape key needs only "metrics"; read keys kept scraping before that scope existed.
    Scrape = Annotated[ApiKey, Depends(key_with("metrics", "read"))]

    @api.get("/healthz", response_model=Health, tags=["service"], responses={503: _ERRORS[503]})
    def healthz() -> Health:
        """Liveness and the store's schema (no key needed)."""
        return Health(ok=True, store=app.store.dialect, schema_version=app.store.schema_version())

    @api.post(
        "/runs",
        status_code=202,
        response_model=SubmitOut,
        tags=["runs"],
        responses=_responses(409, 413),
    )
    def submit_run(
        body: SubmitIn,
        response: Response,
        _key: Submit,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
        traceparent: Annotated[str | None, Header(max_length=200)] = None,
    ) -> SubmitOut:
        """Start a run; returns at once with its id (202) and its URL in Location.
        An idempotency key (body or header) makes retries of this request safe. A W3C
        ``traceparent`` header puts the run's spans in the caller's trace."""
        key = body.key or idempotency_key or None
        handle = app.enqueue(
            body.workflow,
            body.args,
            body.kwargs,
            key=key,
            traceparent=traceparent,
            queue=body.queue,
            queue_key=body.queue_key,
            priority=body.priority,
        )
        url = f"/runs/{handle.run_id}"
        response.headers["Location"] = url
        if not handle.created:
            response.headers["Idempotent-Replayed"] = "true"
        record = app.get_run(handle.run_id)
        return SubmitOut(
            id=record.id,
            workflow=record.workflow,
            status=record.status,
            created=handle.created,
            url=url,
        )

    @api.get("/runs", response_model=RunList, tags=["runs"], responses=_responses())
    def list_runs(
        request: Request,
        _key: Read,
        status: Annotated[list[RunStatusName] | None, Query()] = None,
        workflow: Annotated[str | None, Query(max_length=200)] = None,
        version: Annotated[str | None, Query(max_length=200)] = None,
        queue: Annotated[str | None, Query(max_length=200)] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    ) -> RunList:
        """Runs, newest first, filtered by status (repeatable), workflow, queue and the
        code version that submitted them (``App(version=...)``)."""
        records = app.list_runs(
            status=status,
            queue=queue,
            workflow=workflow,
            limit=limit,
            offset=offset,
            summary=True,
            versions=None if version is None else [version],
        )
        current = app.store.last_steps([r.id for r in records])
        nxt = None
        if len(records) == limit:
            nxt = str(request.url.include_query_params(offset=offset + limit))
        return RunList(
            runs=[run_out(r, current.get(r.id), [], summary=True) for r in records], next=nxt
        )

    @api.get(
        "/runs/{run_id}",
        response_model=RunOut,
        tags=["runs"],
        responses=_responses(404),
    )
    def get_run(run_id: str, key: Read) -> RunOut:
        """A run: status, current step, pending requests, and its result or error
        (with the traceback of a failure for admin keys only)."""
        record = app.get_run(run_id)
        current = app.store.last_steps([run_id]).get(run_id)
        pending = [] if record.finished else app.requests(run_id)
        out = run_out(record, current, pending, full=True, admin=key.allows("admin"))
        family = app.family(run_id)
        out.usage = family_out(family)
        out.children = [
            ChildOut(
                id=c.run.id,
                workflow=c.run.workflow,
                status=c.run.status,
                parent_step=c.run.parent_step,
                parent_close=c.run.parent_close,
                url=f"/runs/{c.run.id}",
                duration_s=round(c.duration_s, 3),
                usage=usage_out(c.total),
            )
            for c in family.children
        ]
        return out

    @api.get(
        "/runs/{run_id}/steps",
        response_model=StepList,
        tags=["runs"],
        responses=_responses(404),
    )
    def get_steps(
        run_id: str,
        key: Read,
        after_session: Annotated[int, Query(ge=-1, le=1_000_000)] = -1,
        after_seq: Annotated[int, Query(ge=-1, le=1_000_000_000)] = -1,
        limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
    ) -> StepList:
        """The run's journal in order, after a position if given (for paging)."""
        app.get_run(run_id)
        steps = app.store.steps_after(run_id, after_session, after_seq, limit=limit)
        return StepList(steps=[step_out(s, admin=key.allows("admin")) for s in steps])

    @api.get(
        "/runs/{run_id}/events",
        tags=["runs"],
        response_class=StreamingResponse,
        responses={
            200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events."},
            **_responses(404, 429),
        },
    )
    def run_events(
        run_id: str,
        key: Read,
        last_event_id: Annotated[str | None, Header(max_length=200)] = None,
    ) -> StreamingResponse:
        """Follow a run as Server-Sent Events: ``status`` when it changes, ``step``
        for each journal row started or finished, ``tokens`` for a model's text as
        it forms (and the end of each attempt's stream), ``tool_call_delta`` for the
        arguments of the tool calls it writes, ``end`` when it is over. Reconnect
        with ``Last-Event-ID`` to resume where the stream broke off."""
        app.get_run(run_id)
        return StreamingResponse(
            streams.hold(
                key,
                event_stream(
                    app,
                    run_id,
                    last_event_id,
                    poll_s=events_poll_s,
                    full=key.allows("admin"),
                    still_allowed=lambda: _active(app, key.id),
                    max_s=max_stream_s,
                ),
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @api.get(
        "/events",
        tags=["runs"],
        response_class=StreamingResponse,
        responses={
            200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events."},
            **_responses(429),
        },
    )
    def all_events(
        key: Read,
        last_event_id: Annotated[str | None, Header(max_length=200)] = None,
    ) -> StreamingResponse:
        """Follow every run: a ``run`` event each time one is submitted, claimed,
        suspended or finished (for live lists)."""
        return StreamingResponse(
            streams.hold(
                key,
                runs_stream(
                    app,
                    last_event_id,
                    still_allowed=lambda: _active(app, key.id),
                    max_s=max_stream_s,
                ),
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @api.post(
        "/runs/{run_id}/signals",
        status_code=202,
        response_model=SignalOut,
        tags=["steering"],
        responses=_responses(404, 409, 413),
    )
    def send_signal(run_id: str, body: SignalIn, _key: Submit) -> SignalOut:
        """Send a signal; a ``ctx.wait_for(name)`` takes it, even one not reached yet.
        Names reserved for requests to humans (``approval:…``, ``question:…``,
        ``budget:…``, ``checkpoint:…``, ``resume``) are refused with 403 whatever the
        key: answer those at ``/runs/{run_id}/requests/{request_id}``."""
        signal_id = app.signal(run_id, body.name, body.payload)
        return SignalOut(run_id=run_id, name=body.name, signal_id=signal_id)

    @api.get(
        "/requests", response_model=list[RequestOut], tags=["steering"], responses=_responses()
    )
    def pending(_key: Read) -> list[RequestOut]:
        """Every request waiting for a human, oldest first."""
        return [request_out(r) for r in app.requests()]

    @api.post(
        "/runs/{run_id}/requests/{request_id}",
        response_model=RequestOut,
        tags=["steering"],
        responses=_responses(404, 409, 413),
    )
    def answer(run_id: str, request_id: str, body: AnswerIn, key: Approve) -> RequestOut:
        """Answer a request once: approve, reject (with a reason the agent sees) or edit
        (new arguments) an approval; ``answer`` a question."""
        request = app.answer(
            run_id,
            request_id,
            decision=body.decision,
            reason=body.reason,
            arguments=body.arguments,
            answer=body.answer,
            by=key.name,
        )
        return request_out(request)

    @api.post(
        "/runs/{run_id}/cancel",
        status_code=202,
        response_model=CancelOut,
        tags=["steering"],
        responses=_responses(404, 409, 413),
    )
    def cancel(run_id: str, _key: Submit, body: CancelIn | None = None) -> CancelOut:
        """Cancel a run: at once if no worker holds it (`cancelled`), else asked
        (`running`): the run ends `cancelled` at its next step boundary, even if
        its workflow returns first (its result is discarded). A run that had already
        ended keeps its end (`409`)."""
        record = app.get_run(run_id)
        if record.finished:
            raise RunConflict(f"cannot cancel: run {run_id!r} is already {record.status}")
        status = app.cancel(run_id, body.reason if body else None)
        if status in FINISHED and status != "cancelled":
            raise RunConflict(f"cannot cancel: run {run_id!r} is already {status}")
        return CancelOut(id=run_id, status=status)  # type: ignore[arg-type]

    @api.post(
        "/runs/{run_id}/fork",
        status_code=202,
        response_model=SubmitOut,
        tags=["steering"],
        responses=_responses(404, 413),
    )
    def fork(run_id: str, body: ForkIn, response: Response, key: Submit) -> SubmitOut:
        """Start a new run that replays this one's journal up to a step and executes
        live after it (time-travel debugging), optionally from an edited result.
        By default the fork asks again every request to a human at or before that
        step; ``decisions: "keep"`` copies the answers as this key's decisions and
        needs the ``approve`` scope."""
        if body.decisions == "keep" and not key.allows("approve"):
            raise _AuthError(
                403,
                f"the API key {key.name!r} has scopes {list(key.scopes)!r}; keeping the "
                "decisions of a fork needs 'approve'",
            )
        edit = {"edit": body.edit} if "edit" in body.model_fields_set else {}
        handle = app.fork(
            run_id, from_step=body.from_step, decisions=body.decisions, by=key.name, **edit
        )
        return _accepted(handle.run_id, response)

    @api.post(
        "/runs/{run_id}/retry",
        status_code=202,
        response_model=SubmitOut,
        tags=["steering"],
        responses=_responses(404, 409),
    )
    def retry(run_id: str, response: Response, _key: Submit) -> SubmitOut:
        """Queue a failed run again from its failing step; completed steps are not
        executed again."""
        handle = app.retry(run_id)
        return _accepted(handle.run_id, response)

    def _accepted(run_id: str, response: Response) -> SubmitOut:
        record = app.get_run(run_id)
        response.headers["Location"] = f"/runs/{run_id}"
        return SubmitOut(
            id=record.id,
            workflow=record.workflow,
            status=record.status,
            created=True,
            url=f"/runs/{run_id}",
        )

    @api.get(
        "/metrics",
        tags=["service"],
        response_class=Response,
        responses={
            200: {
                "content": {"text/plain": {}, "application/openmetrics-text": {}},
                "description": "Prometheus text format, or OpenMetrics when asked"
                " (Accept: application/openmetrics-text).",
            },
            **_responses(),
        },
    )
    def metrics(request: Request, _key: Scrape) -> Response:
        """Store-wide gauges (runs by status, oldest queued and waiting runs, webhook
        backlog) and this process's counters (HTTP requests; steps, tokens, cost and
        429s of an embedded worker), for Prometheus (a ``metrics`` or ``read`` key as a
        bearer token)."""
        with metrics_lock:  # the collector caches finished runs: one scrape at a time
            text, content_type = app.metrics().render(request.headers.get("accept"))
        return Response(content=text, media_type=content_type)

    api.include_router(queue_routes(app, key_with("read"), _responses()))

    @api.get("/webhooks", response_model=list[WebhookOut], tags=["admin"], responses=_responses())
    def list_webhooks(_key: Admin) -> list[WebhookOut]:
        return [
            WebhookOut(id=w.id, url=w.url, events=list(w.events), created_at=w.created_at)
            for w in app.list_webhooks()
        ]

    @api.post(
        "/webhooks",
        status_code=201,
        response_model=WebhookOut,
        tags=["admin"],
        responses=_responses(413),
    )
    def add_webhook(body: WebhookIn, _key: Admin) -> WebhookOut:
        """Register an endpoint; the response carries its signing secret, once.
        Targets that are not globally routable (loopback, private, link-local, shared
        and the IPv6 forms that carry such an IPv4 address) are refused unless the
        server allows their network (``--webhook-allow``)."""
        targets.check_url(body.url)
        hook, secret = app.add_webhook(body.url, secret=body.secret, events=body.events)
        return WebhookOut(
            id=hook.id,
            url=hook.url,
            events=list(hook.events),
            created_at=hook.created_at,
            secret=secret,
        )

    @api.delete(
        "/webhooks/{webhook_id}",
        status_code=204,
        tags=["admin"],
        responses=_responses(404),
    )
    def remove_webhook(webhook_id: str, _key: Admin) -> Response:
        if not app.remove_webhook(webhook_id):
            raise RunNotFound(f"no webhook {webhook_id!r}")
        return Response(status_code=204)

    add_schedule_routes(api, app, read=Read, admin=Admin, responses=_responses)
    return api


class _StreamCap:
    """Open event streams per key, at most ``limit``: a key cannot hold the server's
    connections (or database polls) without bound."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def hold(self, key: ApiKey, stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        with self._lock:
            if self._open.get(key.id, 0) >= self.limit:
                raise _AuthError(
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


def _errors(api: FastAPI, app: App) -> None:
    """Every error is JSON ``{"error": {"type", "message"}}`` with the right status."""

    def body(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
        error: dict[str, Any] = {"type": kind, "message": message}
        error.update(extra)
        headers = {"Retry-After": "1"} if status == 503 else None
        return JSONResponse({"error": error}, status_code=status, headers=headers)

    statuses: list[tuple[type[MainspringError], int, str]] = [
        (RunNotFound, 404, "not_found"),
        (ScheduleNotFound, 404, "not_found"),
        (RequestNotFound, 404, "request_not_found"),
        (RunConflict, 409, "conflict"),
        (ReservedSignal, 403, "forbidden"),
        (InvalidAnswer, 422, "invalid_answer"),
        (ConfigError, 422, "invalid_input"),
        (StoreUnavailable, 503, "store_unavailable"),
    ]

    # App.get_run names the database for the CLI; over HTTP its location stays private.
    where = f" in {redact_url(app.url)!r}"

    @api.exception_handler(MainspringError)
    async def mainspring_error(_: Request, exc: MainspringError) -> JSONResponse:
        message = exc.message.replace(where, "")
        for cls, status, kind in statuses:
            if isinstance(exc, cls):
                return body(status, kind, message)
        return body(400, type(exc).__name__, message)

    @api.exception_handler(_AuthError)
    async def auth_error(_: Request, exc: _AuthError) -> JSONResponse:
        kinds = {401: "unauthorized", 403: "forbidden", 429: "too_many_streams"}
        response = body(exc.status, kinds.get(exc.status, "forbidden"), exc.message)
        if exc.status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        return response

    @api.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        sent = request.headers.get("content-type")
        if _body_error(exc) and not _is_json(sent):
            # The body was never read as JSON (curl -d sends a form type): say how to fix
            # it rather than that the fields are missing. The API reads JSON only.
            return body(
                422,
                "invalid_request",
                f"body: the API reads JSON only, and this request's Content-Type is {sent!r}: "
                "send the header 'Content-Type: application/json' "
                "(with curl: -H 'content-type: application/json')",
            )
        problems = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e.get("loc", ()))
            problems.append(f"{where}: {e.get('msg', 'invalid')}")
        details = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
            for e in exc.errors()
        ]
        return body(
            422, "invalid_request", "; ".join(problems) or "invalid request", details=details
        )

    @api.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI's answer to a body it cannot decode at all
            return body(422, "invalid_request", f"body: not JSON ({exc.detail})")
        kinds = {
            404: "not_found",
            405: "method_not_allowed",
            408: "request_timeout",
            413: "too_large",
        }
        response = body(exc.status_code, kinds.get(exc.status_code, "http_error"), str(exc.detail))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:
            # RFC 9110: a 405 lists every method of the path; Starlette's names only the
            # first route's (GET /runs, not POST /runs too).
            methods: set[str] = set()
            for route in api.router.routes:
                if route.matches(request.scope)[0] is Match.PARTIAL:
                    methods |= getattr(route, "methods", None) or set()
            if methods:
                response.headers["Allow"] = ", ".join(sorted(methods))
        return response


def _active(app: App, key_id: str) -> bool:
    """Whether the key still exists unrevoked (an open stream re-checks its own)."""
    key = app.get_key(key_id)
    return key is not None and key.revoked_at is None


def _is_json(content_type: str | None) -> bool:
    """Whether a Content-Type names JSON (``application/json``, ``application/x+json``)."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _body_error(exc: RequestValidationError) -> bool:
    return any(tuple(e.get("loc", ()))[:1] == ("body",) for e in exc.errors())
