"""The HTTP API: submit, follow, steer and answer runs.

Endpoints that touch the store are plain ``def``: FastAPI runs them in its thread
pool, so a slow database never blocks the event loop that streams events.
"""

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from fastapi.security import APIKeyCookie, APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from .._app import App
from .._errors import (
    ConfigError,
    InvalidAnswer,
    MainspringError,
    RequestNotFound,
    RunConflict,
    RunNotFound,
    StoreUnavailable,
)
from .._serde import loads
from ..dashboard import dashboard_router
from ..hitl import Request as HumanRequest
from ..storage import RunRecord, StepRecord
from ..storage._api import ApiKey, Scope
from ..storage._records import FINISHED
from ._events import event_stream, runs_stream
from ._http_metrics import RequestCounter
from ._limits import BodySizeLimit
from ._schemas import (
    AnswerIn,
    CancelIn,
    CancelOut,
    CurrentStep,
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
    StepOut,
    SubmitIn,
    SubmitOut,
    WebhookIn,
    WebhookOut,
)
from ._webhooks import WebhookDispatcher

__all__ = ["create_app"]

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in (
        (401, "No key, or a wrong or revoked one."),
        (403, "The key lacks the scope this endpoint needs."),
        (404, "No such run or request."),
        (409, "The run's state does not allow it (finished, already answered)."),
        (413, "The body is larger than the server accepts."),
        (422, "The body or a parameter is malformed; the message names it."),
        (503, "The database is unavailable; retry after the Retry-After seconds."),
    )
}


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error responses an endpoint documents (auth and store errors always)."""
    return {c: _ERRORS[c] for c in sorted({401, 403, 503, *codes})}


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
) -> FastAPI:
    """The HTTP API of ``app`` as an ASGI application.

    Args:
        worker: also run a :class:`~mainspring.Worker` in the server's process.
        webhooks: deliver the webhook outbox from this process.
        max_body_bytes: larger request bodies get 413.
        events_poll_s: how often an event stream looks for new steps.
        worker_options: keyword arguments of the embedded worker.
    """

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        tasks: list[asyncio.Task[None]] = []
        running = app.worker(**(worker_options or {})) if worker else None
        dispatcher = WebhookDispatcher(app.store, clock=app.clock) if webhooks else None
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
    )
    api.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    api.add_middleware(RequestCounter, record=app.telemetry.http_request)  # outermost
    _errors(api)
    api.include_router(dashboard_router(app))

    @api.get("/", include_in_schema=False)
    def home() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=307)

    def key_with(scope: Scope) -> Callable[..., ApiKey]:
        def check(
            bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
            header: Annotated[str | None, Depends(_header)],
            cookie: Annotated[str | None, Depends(_cookie)],
        ) -> ApiKey:
            if bearer is not None and header and bearer.credentials != header:
                # Two different keys: refuse rather than guess which one was meant.
                raise _AuthError(401, "two different API keys (Authorization and X-API-Key)")
            token = bearer.credentials if bearer is not None else header or cookie
            if not token:
                raise _AuthError(401, "an API key is required: 'Authorization: Bearer msk_…'")
            key = app.store.verify_api_key(token, app.clock.now())
            if key is None:
                raise _AuthError(401, "the API key is not valid")
            if key.revoked_at is not None:
                raise _AuthError(401, f"the API key {key.id!r} was revoked")
            if not key.allows(scope):
                raise _AuthError(
                    403,
                    f"the API key {key.name!r} has scopes {list(key.scopes)!r};"
                    f" this needs {scope!r}",
                )
            return key

        return check

    metrics_lock = threading.Lock()
    Read = Annotated[ApiKey, Depends(key_with("read"))]
    Submit = Annotated[ApiKey, Depends(key_with("submit"))]
    Approve = Annotated[ApiKey, Depends(key_with("approve"))]
    Admin = Annotated[ApiKey, Depends(key_with("admin"))]

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
    ) -> SubmitOut:
        """Start a run; returns at once with its id (202) and its URL in Location.
        An idempotency key (body or header) makes retries of this request safe."""
        key = body.key or idempotency_key or None
        handle = app.enqueue(body.workflow, body.args, body.kwargs, key=key)
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
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    ) -> RunList:
        """Runs, newest first, filtered by status (repeatable) and workflow."""
        records = app.list_runs(status=status, workflow=workflow, limit=limit, offset=offset)
        current = app.store.last_steps([r.id for r in records])
        nxt = None
        if len(records) == limit:
            nxt = str(request.url.include_query_params(offset=offset + limit))
        return RunList(runs=[_run_out(r, current.get(r.id), []) for r in records], next=nxt)

    @api.get(
        "/runs/{run_id}",
        response_model=RunOut,
        tags=["runs"],
        responses=_responses(404),
    )
    def get_run(run_id: str, _key: Read) -> RunOut:
        """A run: status, current step, pending requests, and its result or error."""
        record = app.get_run(run_id)
        current = app.store.last_steps([run_id]).get(run_id)
        pending = [] if record.finished else app.requests(run_id)
        return _run_out(record, current, pending, full=True)

    @api.get(
        "/runs/{run_id}/steps",
        response_model=StepList,
        tags=["runs"],
        responses=_responses(404),
    )
    def get_steps(
        run_id: str,
        _key: Read,
        after_session: Annotated[int, Query(ge=-1, le=1_000_000)] = -1,
        after_seq: Annotated[int, Query(ge=-1, le=1_000_000_000)] = -1,
        limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
    ) -> StepList:
        """The run's journal in order, after a position if given (for paging)."""
        app.get_run(run_id)
        steps = app.store.steps_after(run_id, after_session, after_seq, limit=limit)
        return StepList(steps=[_step_out(s) for s in steps])

    @api.get(
        "/runs/{run_id}/events",
        tags=["runs"],
        response_class=StreamingResponse,
        responses={
            200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events."},
            **_responses(404),
        },
    )
    def run_events(
        run_id: str,
        _key: Read,
        last_event_id: Annotated[str | None, Header(max_length=200)] = None,
    ) -> StreamingResponse:
        """Follow a run as Server-Sent Events: ``status`` when it changes, ``step``
        for each journal row started or finished, ``end`` when it is over. Reconnect
        with ``Last-Event-ID`` to resume where the stream broke off."""
        app.get_run(run_id)
        return StreamingResponse(
            event_stream(app, run_id, last_event_id, poll_s=events_poll_s),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @api.get(
        "/events",
        tags=["runs"],
        response_class=StreamingResponse,
        responses={
            200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events."},
            **_responses(),
        },
    )
    def all_events(
        _key: Read,
        last_event_id: Annotated[str | None, Header(max_length=200)] = None,
    ) -> StreamingResponse:
        """Follow every run: a ``run`` event each time one is submitted, claimed,
        suspended or finished (for live lists)."""
        return StreamingResponse(
            runs_stream(app, last_event_id),
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
        """Send a signal; a ``ctx.wait_for(name)`` takes it, even one not reached yet."""
        signal_id = app.signal(run_id, body.name, body.payload)
        return SignalOut(run_id=run_id, name=body.name, signal_id=signal_id)

    @api.get(
        "/requests", response_model=list[RequestOut], tags=["steering"], responses=_responses()
    )
    def pending(_key: Read) -> list[RequestOut]:
        """Every request waiting for a human, oldest first."""
        return [_request_out(r) for r in app.requests()]

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
        return _request_out(request)

    @api.post(
        "/runs/{run_id}/cancel",
        status_code=202,
        response_model=CancelOut,
        tags=["steering"],
        responses=_responses(404, 409),
    )
    def cancel(run_id: str, _key: Submit, body: CancelIn | None = None) -> CancelOut:
        """Cancel a run: at once if no worker holds it, else at its next step."""
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
    def fork(run_id: str, body: ForkIn, response: Response, _key: Submit) -> SubmitOut:
        """Start a new run that replays this one's journal up to a step and executes
        live after it (time-travel debugging), optionally from an edited result."""
        if "edit" in body.model_fields_set:
            handle = app.fork(run_id, from_step=body.from_step, edit=body.edit)
        else:
            handle = app.fork(run_id, from_step=body.from_step)
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
            200: {"content": {"text/plain": {}}, "description": "Prometheus text format."},
            **_responses(),
        },
    )
    def metrics(_key: Read) -> Response:
        """Store-wide gauges (runs by status, oldest queued and waiting runs, webhook
        backlog) and this process's counters (HTTP requests; steps, tokens, cost and
        429s of an embedded worker), for Prometheus (the key as a bearer token)."""
        with metrics_lock:  # the collector caches finished runs: one scrape at a time
            text, content_type = app.metrics().render()
        return Response(content=text, media_type=content_type)

    @api.get("/webhooks", response_model=list[WebhookOut], tags=["admin"], responses=_responses())
    def list_webhooks(_key: Admin) -> list[WebhookOut]:
        return [
            WebhookOut(id=w.id, url=w.url, events=list(w.events), created_at=w.created_at)
            for w in app.store.list_webhooks()
        ]

    @api.post(
        "/webhooks",
        status_code=201,
        response_model=WebhookOut,
        tags=["admin"],
        responses=_responses(413),
    )
    def add_webhook(body: WebhookIn, _key: Admin) -> WebhookOut:
        """Register an endpoint; the response carries its signing secret, once."""
        hook, secret = app.store.add_webhook(
            body.url, app.clock.now(), secret=body.secret, events=body.events
        )
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
        if not app.store.remove_webhook(webhook_id, app.clock.now()):
            raise RunNotFound(f"no webhook {webhook_id!r}")
        return Response(status_code=204)

    return api


def _errors(api: FastAPI) -> None:
    """Every error is JSON ``{"error": {"type", "message"}}`` with the right status."""

    def body(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
        error: dict[str, Any] = {"type": kind, "message": message}
        error.update(extra)
        headers = {"Retry-After": "1"} if status == 503 else None
        return JSONResponse({"error": error}, status_code=status, headers=headers)

    statuses: list[tuple[type[MainspringError], int, str]] = [
        (RunNotFound, 404, "not_found"),
        (RequestNotFound, 404, "request_not_found"),
        (RunConflict, 409, "conflict"),
        (InvalidAnswer, 422, "invalid_answer"),
        (ConfigError, 422, "invalid_input"),
        (StoreUnavailable, 503, "store_unavailable"),
    ]

    @api.exception_handler(MainspringError)
    async def mainspring_error(_: Request, exc: MainspringError) -> JSONResponse:
        for cls, status, kind in statuses:
            if isinstance(exc, cls):
                return body(status, kind, exc.message)
        return body(400, type(exc).__name__, exc.message)

    @api.exception_handler(_AuthError)
    async def auth_error(_: Request, exc: _AuthError) -> JSONResponse:
        response = body(
            exc.status, "unauthorized" if exc.status == 401 else "forbidden", exc.message
        )
        if exc.status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        return response

    @api.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
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
        kinds = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
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


def _decode(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return loads(text)
    except Exception:  # a journal row that is not JSON: show it as text
        return text


def _step_out(s: StepRecord) -> StepOut:
    return StepOut(
        session=s.session,
        seq=s.seq,
        kind=s.kind,
        name=s.name,
        status=s.status,
        attempt=s.attempt,
        started_at=s.started_at,
        finished_at=s.finished_at,
        output=_decode(s.output),
        error=_decode(s.error),
    )


def _request_out(r: HumanRequest) -> RequestOut:
    return RequestOut(**r.to_json(), url=f"/runs/{r.run_id}/requests/{r.id}")


def _run_out(
    r: RunRecord, current: StepRecord | None, pending: list[HumanRequest], *, full: bool = False
) -> RunOut:
    suspended = r.status in ("sleeping", "waiting")
    return RunOut(
        id=r.id,
        workflow=r.workflow,
        key=r.key,
        status=r.status,
        session=r.session,
        recoveries=r.recoveries,
        created_at=r.created_at,
        updated_at=r.updated_at,
        finished_at=r.finished_at,
        wait_reason=r.wait_reason if suspended else None,
        wake_at=r.wake_at if suspended and r.wake_at else None,
        input=_decode(r.input) if full else None,
        output=_decode(r.output),
        error=_decode(r.error),
        current_step=(
            CurrentStep(
                session=current.session,
                seq=current.seq,
                kind=current.kind,
                name=current.name,
                status=current.status,
            )
            if current is not None
            else None
        ),
        pending_requests=[_request_out(p) for p in pending],
    )
