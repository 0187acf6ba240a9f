"""Every error is JSON ``{"error": {"type", "message"}}`` with the right status.

``HANDLERS`` goes to ``FastAPI(exception_handlers=...)``; each handler finds what it
needs about its server on the request (its context, its routes)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from .. import (
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
from ..storage import redact_url
from ._context import AuthError, context

__all__ = ["HANDLERS"]

_STATUSES: tuple[tuple[type[MainspringError], int, str], ...] = (
    (RunNotFound, 404, "not_found"),
    (ScheduleNotFound, 404, "not_found"),
    (RequestNotFound, 404, "request_not_found"),
    (RunConflict, 409, "conflict"),
    (ReservedSignal, 403, "forbidden"),
    (InvalidAnswer, 422, "invalid_answer"),
    (ConfigError, 422, "invalid_input"),
    (StoreUnavailable, 503, "store_unavailable"),
)
_AUTH_KINDS = {401: "unauthorized", 403: "forbidden", 429: "too_many_streams"}
_HTTP_KINDS = {
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "too_large",
}


def _body(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    error: dict[str, Any] = {"type": kind, "message": message}
    error.update(extra)
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse({"error": error}, status_code=status, headers=headers)


async def mainspring_error(request: Request, exc: MainspringError) -> JSONResponse:
    # App.get_run names the database for the CLI; over HTTP its location stays private.
    message = exc.message.replace(f" in {redact_url(context(request).app.url)!r}", "")
    status, kind = next(
        ((status, kind) for cls, status, kind in _STATUSES if isinstance(exc, cls)),
        (400, type(exc).__name__),
    )
    return _body(status, kind, message)


async def auth_error(_: Request, exc: AuthError) -> JSONResponse:
    response = _body(exc.status, _AUTH_KINDS.get(exc.status, "forbidden"), exc.message)
    if exc.status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    sent = request.headers.get("content-type")
    if _body_error(exc) and not _is_json(sent):
        # The body was never read as JSON (curl -d sends a form type): say how to fix
        # it rather than that the fields are missing. The API reads JSON only.
        return _body(
            422,
            "invalid_request",
            f"body: the API reads JSON only, and this request's Content-Type is {sent!r}: "
            "send the header 'Content-Type: application/json' "
            "(with curl: -H 'content-type: application/json')",
        )
    errors = exc.errors()
    problems = [
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors
    ]
    details = [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
        for e in errors
    ]
    return _body(422, "invalid_request", "; ".join(problems) or "invalid request", details=details)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 400:  # FastAPI's answer to a body it cannot decode at all
        return _body(422, "invalid_request", f"body: not JSON ({exc.detail})")
    kind = _HTTP_KINDS.get(exc.status_code, "http_error")
    response = _body(exc.status_code, kind, str(exc.detail))
    response.headers.update(exc.headers or {})
    if exc.status_code == 405:
        methods = _methods(request)
        if methods:
            response.headers["Allow"] = ", ".join(sorted(methods))
    return response


def _methods(request: Request) -> set[str]:
    """Every method of the request's path. RFC 9110: a 405 lists them all; Starlette's
    names only the first route's (GET /runs, not POST /runs too)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if route.matches(request.scope)[0] is Match.PARTIAL:
            methods |= getattr(route, "methods", None) or set()
    return methods


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


HANDLERS: dict[int | type[Exception], Callable[[Request, Any], Coroutine[Any, Any, Response]]] = {
    MainspringError: mainspring_error,
    AuthError: auth_error,
    RequestValidationError: invalid,
    StarletteHTTPException: http_error,
}
