"""The HTTP API: submit, follow, steer and answer runs.

``create_app`` builds the server's :class:`~mainspring.server._context.ApiContext`,
keeps it on ``api.state`` and includes one router per resource; each endpoint takes
the context and its caller's key as FastAPI dependencies. Endpoints that touch the
store are plain ``def``: FastAPI runs them in its thread pool, so a slow database
never blocks the event loop that streams events.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import FastAPI

from .. import App
from ..dashboard import Sessions, dashboard_router
from . import _admin, _deploys, _queues, _runs, _schedules, _steering, _streams
from ._context import COOKIE, ApiContext, StreamCap
from ._errors import HANDLERS
from ._guard import BrowserGuard
from ._http_metrics import RequestCounter
from ._limits import BodySizeLimit
from ._service import health_router, metrics_router
from ._targets import TargetPolicy
from ._webhooks import WebhookDispatcher

__all__ = ["create_app"]

_DESCRIPTION = (
    "Submit long-running agent runs, follow them, and steer them: signals, answers to "
    "approvals and questions, cancellation. Every endpoint but /healthz needs an API key "
    "(`mainspring keys create`)."
)

# In the order the OpenAPI document lists their paths (tests/golden/openapi.json).
_ROUTERS = (
    health_router,
    _runs.router,
    _streams.router,
    _steering.router,
    metrics_router,
    _queues.router,
    _deploys.router,
    _admin.router,
    _schedules.router,
)


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
    api = FastAPI(
        title="mainspring",
        version="1",
        description=_DESCRIPTION,
        lifespan=_lifespan(
            app,
            (worker_options or {}) if worker else None,
            webhook_allow if webhooks else None,
        ),
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        exception_handlers=HANDLERS,
    )
    api.add_middleware(BodySizeLimit, max_bytes=max_body_bytes, timeout_s=body_timeout_s)
    api.add_middleware(BrowserGuard, cookie=COOKIE)
    api.add_middleware(RequestCounter, record=app.telemetry.http_request)  # outermost
    sessions = Sessions(app)
    api.state.mainspring = ApiContext(
        app=app,
        sessions=sessions,
        targets=TargetPolicy(webhook_allow),
        streams=StreamCap(max_streams_per_key),
        events_poll_s=events_poll_s,
        max_stream_s=max_stream_s,
    )
    api.include_router(dashboard_router(app, sessions, secure_cookies=secure_cookies))
    for router in _ROUTERS:
        api.include_router(router)
    return api


def _lifespan(
    app: App, worker_options: dict[str, Any] | None, webhook_allow: Sequence[str] | None
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """Run an embedded worker (``worker_options`` not ``None``) and a webhook
    dispatcher (``webhook_allow`` not ``None``) for as long as the server runs."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        running = app.worker(**worker_options) if worker_options is not None else None
        dispatcher = (
            WebhookDispatcher(app.store, clock=app.clock, allow_networks=webhook_allow)
            if webhook_allow is not None
            else None
        )
        tasks: list[asyncio.Task[None]] = []
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

    return lifespan
