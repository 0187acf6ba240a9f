"""The service's own endpoints: liveness (``/healthz``, no key) and Prometheus
metrics (``/metrics``).

Two routers, not one: the OpenAPI document lists ``/healthz`` first and
``/metrics`` after the steering endpoints, and ``create_app`` includes each where
its paths stand in that document.
"""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations.
from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from ._context import ERRORS, Ctx, Scrape, responses
from ._schemas import Health

__all__ = ["health_router", "metrics_router"]

health_router = APIRouter(tags=["service"])
metrics_router = APIRouter(tags=["service"])


@health_router.get("/", include_in_schema=False)
def home() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@health_router.get("/healthz", response_model=Health, responses={503: ERRORS[503]})
def healthz(ctx: Ctx) -> Health:
    """Liveness and the store's schema (no key needed)."""
    store = ctx.app.store
    return Health(ok=True, store=store.dialect, schema_version=store.schema_version())


@metrics_router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "content": {"text/plain": {}, "application/openmetrics-text": {}},
            "description": "Prometheus text format, or OpenMetrics when asked"
            " (Accept: application/openmetrics-text).",
        },
        **responses(),
    },
)
def metrics(request: Request, _key: Scrape, ctx: Ctx) -> Response:
    """Store-wide gauges (runs by status, oldest queued and waiting runs, webhook
    backlog) and this process's counters (HTTP requests; steps, tokens, cost and
    429s of an embedded worker), for Prometheus (a ``metrics`` or ``read`` key as a
    bearer token)."""
    with ctx.metrics_lock:
        text, content_type = ctx.app.observe.metrics().render(request.headers.get("accept"))
    return Response(content=text, media_type=content_type)
