"""Pages of the dashboard. They read the store directly (server-side rendering); every
action (approve, reject, edit, answer, cancel) is a call to the API from the page, under
the same key, which the login stores in an HttpOnly, SameSite=Strict cookie."""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from .. import App, RunNotFound
from ..serde import loads, public_error
from ..storage import ApiKey, RunRecord
from ._chart import usage_chart
from ._sessions import Sessions
from ._timeline import KINDS, Filters, build_timeline, duration, money
from ._triage import ago, run_rows, stamp

__all__ = ["Sessions", "dashboard_router"]

audit = logging.getLogger("mainspring.auth")

COOKIE = "mainspring_key"
STATUSES = ("queued", "running", "sleeping", "waiting", "succeeded", "failed", "cancelled")
_env = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(["html"]),
)


class _Failures:
    """Failed logins in a sliding window, counted per client address and per
    presented key id (so one address, or one key id from many addresses, is
    throttled). Only failures count: a valid key is never looked up here."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self._seen: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, who: str, now: float) -> list[float]:
        kept = [t for t in self._seen.get(who, []) if t > now - self.window_s]
        if kept:
            self._seen[who] = kept
        else:
            self._seen.pop(who, None)
        return kept

    def blocked(self, who: Sequence[str], now: float) -> bool:
        with self._lock:
            return any(len(self._recent(w, now)) >= self.limit for w in who)

    def add(self, who: Sequence[str], now: float) -> None:
        with self._lock:
            for w in who:
                self._seen[w] = [*self._recent(w, now), now]
            while len(self._seen) > 100_000:  # a flood of addresses: forget the oldest
                self._seen.pop(next(iter(self._seen)))


def _key_id(token: str) -> str | None:
    """The public id part of a presented key (never its secret), for the audit log."""
    parts = token.split("_", 2)
    return parts[1][:12] if len(parts) == 3 and parts[0] == "msk" else None


def _csp(nonce: str) -> str:
    """The dashboard's Content-Security-Policy: its own origin only, scripts by nonce,
    never framed."""
    return (
        f"default-src 'self'; script-src 'nonce-{nonce}'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    )


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _zoned(ts: float | None, tz: str) -> str:
    """A time as a wall time of the IANA zone ``tz`` (``2026-12-08 09:00 CET``); the
    UTC time when the zone is unknown here."""
    if ts is None:
        return ""
    try:
        zone = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        return _when(ts) + " UTC"
    return datetime.fromtimestamp(ts, zone).strftime("%Y-%m-%d %H:%M %Z")


def _pretty(text: str | None, limit: int = 4000) -> str:
    if text is None:
        return ""
    try:
        value = json.dumps(loads(text), indent=2, ensure_ascii=False, default=str)
    except Exception:
        value = text
    return value if len(value) <= limit else value[:limit] + "\n…"


def _error_text(text: str | None, admin: bool = False) -> str:
    """A run's error as shown: the traceback for admins only."""
    if text is None or admin:
        return _pretty(text)
    try:
        value = public_error(loads(text))
    except Exception:
        return _pretty(text)
    return _pretty(json.dumps(value, ensure_ascii=False, default=str))


def _json_text(value: Any) -> str:
    """A value as readable JSON: apostrophes and non-ASCII as they are (the page
    escapes HTML), never ``\\u0027``."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


_env.filters["json_text"] = _json_text
_env.filters["when"] = _when
_env.filters["zoned"] = _zoned
_env.filters["error_text"] = _error_text
_env.filters["pretty"] = _pretty
_env.filters["duration"] = duration
_env.filters["money"] = money
_env.filters["stamp"] = stamp
_env.filters["ago"] = ago


def dashboard_router(
    app: App,
    sessions: Sessions,
    *,
    secure_cookies: bool | None = None,
    login_attempts: int = 10,
    login_window_s: float = 60.0,
) -> APIRouter:
    """The dashboard's pages. ``secure_cookies``: mark the session cookie ``Secure``
    (``None``: when the request came over HTTPS). ``login_attempts`` failed logins
    per client address, or per presented key id, within ``login_window_s`` seconds,
    then 429 for further failures until it passes (a valid key always logs in)."""
    router = APIRouter(prefix="/ui", include_in_schema=False)
    failures = _Failures(login_attempts, login_window_s)

    def key_of(request: Request) -> ApiKey | None:
        token = request.cookies.get(COOKIE)
        if not token:
            return None
        key_id = sessions.key_id(token, app.clock.now())
        key = app.get_key(key_id) if key_id is not None else None
        return key if key is not None and key.allows("read") else None

    def page(name: str, *, status_code: int = 200, **context: Any) -> HTMLResponse:
        # Scripts run only with this response's nonce: an injected <script> does not.
        nonce = secrets.token_urlsafe(16)
        html = _env.get_template(name).render(nonce=nonce, **context)
        return HTMLResponse(
            html, status_code=status_code, headers={"Content-Security-Policy": _csp(nonce)}
        )

    def login_first() -> RedirectResponse:
        return RedirectResponse("/ui/login", status_code=303)

    @router.get("/login")
    def login_form(error: str | None = None) -> HTMLResponse:
        return page("login.html", error=error)

    @router.post("/login")
    async def login(request: Request) -> Response:
        client = request.client.host if request.client else "?"
        form = parse_qs((await request.body()).decode(errors="replace"))
        token = (form.get("key") or [""])[0].strip()
        # The key is checked before any throttling, on every attempt: a valid key logs
        # in whatever others failed from its address (everyone behind one NAT), and a
        # throttled attempt takes the same path as any other (no timing tells them
        # apart). Keys carry 256 random bits: the throttle bounds noise and load.
        key = app.verify_key(token) if token else None
        if key is not None and key.allows("read"):
            audit.info("dashboard login of key %r (%s) from %s", key.id, key.name, client)
            response = RedirectResponse("/ui/", status_code=303)
            secure = request.url.scheme == "https" if secure_cookies is None else secure_cookies
            response.set_cookie(
                COOKIE,
                sessions.start(key.id, app.clock.now()),
                httponly=True,
                samesite="strict",
                secure=secure,
                max_age=int(sessions.ttl_s),
                path="/",
            )
            return response
        key_id = _key_id(token)
        who = [f"address {client}", *([f"key {key_id}"] if key_id else [])]
        now = time.monotonic()
        throttled = failures.blocked(who, now)
        failures.add(who, now)
        if throttled:
            audit.warning(
                "dashboard login refused: too many failures from %s or for key id %r",
                client,
                key_id,
            )
            return page(
                "login.html",
                status_code=429,
                error="Too many failed logins from this address or with this key; wait a "
                "minute (a valid key still logs in).",
            )
        audit.warning("dashboard login failed from %s (key id %r)", client, key_id)
        return page("login.html", error="That key is not valid (or lacks the read scope).")

    @router.post("/logout")
    def logout(request: Request) -> Response:
        token = request.cookies.get(COOKIE)
        if token:
            sessions.end(token)
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @router.get("/")
    def runs(
        request: Request,
        status: str | None = None,
        workflow: Annotated[str | None, Query(max_length=200)] = None,
        q: Annotated[str | None, Query(max_length=200)] = None,
        offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    ) -> Response:
        key = key_of(request)
        if key is None:
            return login_first()
        wanted = [status] if status in STATUSES else None
        search = (q or "").strip() or None
        records = app.list_runs(
            status=wanted,
            workflow=workflow or None,
            search=search,
            limit=50,
            offset=max(0, offset),
            summary=True,
        )
        now = app.clock.now()
        rows = run_rows(
            records, app.store.last_steps([r.id for r in records]), app.usage(records), now
        )
        filters = {
            k: v for k, v in (("status", status if wanted else None), ("workflow", workflow),
                              ("q", search)) if v
        }  # fmt: skip
        return page(
            "runs.html",
            key=key,
            rows=rows,
            counts=app.store.count_runs(),
            statuses=STATUSES,
            status=status if wanted else None,
            workflow=workflow or None,
            workflows=app.store.run_workflows(),
            q=search,
            filters=filters,
            rest={k: v for k, v in filters.items() if k != "status"},
            offset=max(0, offset),
            pending=len(app.requests()),
            now=now,
        )

    @router.get("/workers")
    def workers(request: Request) -> Response:
        key = key_of(request)
        if key is None:
            return login_first()
        now = app.clock.now()
        return page("workers.html", key=key, workers=app.store.list_workers(), now=now)

    @router.get("/schedules")
    def schedules(request: Request) -> Response:
        key = key_of(request)
        if key is None:
            return login_first()
        return page(
            "schedules.html",
            key=key,
            schedules=app.list_schedules(),
            can_admin=key.allows("admin"),
        )

    @router.get("/runs/{run_id}")
    def run_page(request: Request, run_id: str) -> Response:
        key = key_of(request)
        if key is None:
            return login_first()
        try:
            record = app.get_run(run_id)
        except RunNotFound:
            return page("missing.html", key=key, run_id=run_id)
        trace = app.trace(run_id)
        timeline = build_timeline(
            trace.entries, Filters.parse(request.query_params), now=app.clock.now()
        )
        diagnosis = app.diagnose(run_id) if record.status in ("failed", "running") else None
        return page(
            "run.html",
            key=key,
            run=record,
            trace=trace,
            tl=timeline,
            kinds=KINDS,
            findings=diagnosis.findings if diagnosis else (),
            requests=[] if record.finished else app.requests(run_id),
            children=app.children(run_id),
            family=app.family(run_id),
            chart=usage_chart(timeline.turns),
            can_approve=key.allows("approve"),
            can_submit=key.allows("submit"),
            can_admin=key.allows("admin"),
        )

    @router.get("/runs/{run_id}/timeline")
    def timeline_part(request: Request, run_id: str) -> Response:
        """The timeline alone, redrawn as a live run's steps arrive (same filters)."""
        key = key_of(request)
        if key is None:
            return Response(status_code=401)
        try:
            trace = app.trace(run_id)
        except RunNotFound:
            return Response(status_code=404)
        timeline = build_timeline(
            trace.entries, Filters.parse(request.query_params), now=app.clock.now()
        )
        return page(
            "_live.html",
            run=trace.run,
            trace=trace,
            tl=timeline,
            kinds=KINDS,
            chart=usage_chart(timeline.turns),
            family=app.family(run_id),
        )

    @router.get("/runs/{run_id}/panel")
    def panel(request: Request, run_id: str) -> Response:
        """The run's status and pending requests, redrawn when the status changes."""
        key = key_of(request)
        if key is None:
            return Response(status_code=401)
        record: RunRecord = app.get_run(run_id)
        return page(
            "_panel.html",
            run=record,
            requests=[] if record.finished else app.requests(run_id),
            children=app.children(run_id),
            family=app.family(run_id),
            can_approve=key.allows("approve"),
            can_submit=key.allows("submit"),
            can_admin=key.allows("admin"),
        )

    return router
