"""Pages of the dashboard. They read the store directly (server-side rendering); every
action (approve, reject, edit, answer, cancel) is a call to the API from the page, under
the same key, which the login stores in an HttpOnly, SameSite=Strict cookie."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from .._app import App
from .._errors import RunNotFound
from .._serde import loads
from ..limits import cost_usd
from ..models._types import Usage
from ..storage import RunRecord, StepRecord
from ..storage._api import ApiKey

__all__ = ["dashboard_router"]

COOKIE = "mainspring_key"
STATUSES = ("queued", "running", "sleeping", "waiting", "succeeded", "failed", "cancelled")
_env = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(["html"]),
)


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _took(s: StepRecord) -> float | None:
    return None if s.finished_at is None else max(0.0, s.finished_at - s.started_at)


def _pretty(text: str | None, limit: int = 4000) -> str:
    if text is None:
        return ""
    try:
        value = json.dumps(loads(text), indent=2, ensure_ascii=False, default=str)
    except Exception:
        value = text
    return value if len(value) <= limit else value[:limit] + "\n…"


_env.filters["when"] = _when
_env.filters["pretty"] = _pretty


def _usage(steps: list[StepRecord]) -> list[dict[str, Any]]:
    """Tokens and cost after each model call, cumulative (for the chart)."""
    points: list[dict[str, Any]] = []
    tokens = 0
    cost = 0.0
    for s in steps:
        if not s.name.startswith("model:") or s.status != "completed" or not s.output:
            continue
        try:
            usage = loads(s.output).get("usage") or {}
        except Exception:
            continue
        used = Usage(
            input_tokens=int(usage.get("input_tokens", 0)),
            output_tokens=int(usage.get("output_tokens", 0)),
            cache_read_tokens=int(usage.get("cache_read_tokens", 0)),
        )
        tokens += used.input_tokens + used.output_tokens
        cost += cost_usd(s.name.rsplit(":", 1)[-1], used)
        points.append({"seq": s.seq, "tokens": tokens, "cost": cost})
    return points


def _chart(points: list[dict[str, Any]], width: int = 560, height: int = 120) -> str:
    """An inline SVG line of cumulative tokens (no JavaScript, no library)."""
    if len(points) < 2:
        return ""
    top = max(p["tokens"] for p in points) or 1
    step = width / (len(points) - 1)
    xy = " ".join(
        f"{i * step:.1f},{height - 4 - (p['tokens'] / top) * (height - 8):.1f}"
        for i, p in enumerate(points)
    )
    return (
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        ' role="img" aria-label="cumulative tokens">'
        f'<polyline fill="none" stroke="#2563eb" stroke-width="2" points="{xy}"/></svg>'
    )


def dashboard_router(app: App) -> APIRouter:
    router = APIRouter(prefix="/ui", include_in_schema=False)

    def key_of(request: Request) -> ApiKey | None:
        token = request.cookies.get(COOKIE)
        if not token:
            return None
        key = app.store.verify_api_key(token, app.clock.now())
        return key if key is not None and key.allows("read") else None

    def page(name: str, **context: Any) -> HTMLResponse:
        return HTMLResponse(_env.get_template(name).render(**context))

    def login_first() -> RedirectResponse:
        return RedirectResponse("/ui/login", status_code=303)

    @router.get("/login")
    def login_form(error: str | None = None) -> HTMLResponse:
        return page("login.html", error=error)

    @router.post("/login")
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode(errors="replace"))
        token = (form.get("key") or [""])[0].strip()
        key = app.store.verify_api_key(token, app.clock.now()) if token else None
        if key is None or not key.allows("read"):
            return page("login.html", error="That key is not valid (or lacks the read scope).")
        response = RedirectResponse("/ui/", status_code=303)
        response.set_cookie(
            COOKIE, token, httponly=True, samesite="strict", max_age=7 * 86400, path="/"
        )
        return response

    @router.post("/logout")
    def logout() -> Response:
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @router.get("/")
    def runs(request: Request, status: str | None = None, offset: int = 0) -> Response:
        key = key_of(request)
        if key is None:
            return login_first()
        wanted = [status] if status in STATUSES else None
        records = app.list_runs(status=wanted, limit=50, offset=max(0, offset))
        current = app.store.last_steps([r.id for r in records])
        return page(
            "runs.html",
            key=key,
            runs=records,
            current=current,
            counts=app.store.count_runs(),
            statuses=STATUSES,
            status=status if wanted else None,
            offset=max(0, offset),
            pending=len(app.requests()),
            now=time.time(),
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
        steps = app.steps(run_id)
        points = _usage(steps)
        durations = [t for t in map(_took, steps) if t is not None]
        return page(
            "run.html",
            key=key,
            run=record,
            steps=steps,
            took=_took,
            longest=max(durations, default=0.0) or 0.001,
            requests=[] if record.finished else app.requests(run_id),
            tokens=points[-1]["tokens"] if points else 0,
            cost=points[-1]["cost"] if points else 0.0,
            chart=_chart(points),
            can_approve=key.allows("approve"),
            can_submit=key.allows("submit"),
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
            can_approve=key.allows("approve"),
            can_submit=key.allows("submit"),
        )

    return router
