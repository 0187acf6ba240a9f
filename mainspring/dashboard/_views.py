"""Pages of the dashboard. They read the store directly (server-side rendering); every
action (approve, reject, edit, answer, cancel) is a call to the API from the page, under
the same key, which the login stores in an HttpOnly, SameSite=Strict cookie.

:func:`dashboard_router` builds the two objects the routes share (:class:`Pages` and
:class:`~mainspring.dashboard._login.Login`) and registers their methods as the routes:
each route is a method of a small object rather than a closure of one long function.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse, Response

from .. import App, RunNotFound
from ..storage import ApiKey, RunRecord
from ._chart import usage_chart
from ._login import COOKIE, Login
from ._render import page
from ._sessions import Sessions
from ._timeline import KINDS, Filters, build_timeline
from ._triage import run_rows

__all__ = ["Sessions", "dashboard_router"]

STATUSES = ("queued", "running", "sleeping", "waiting", "succeeded", "failed", "cancelled")


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
    login = Login(
        app,
        sessions,
        secure_cookies=secure_cookies,
        attempts=login_attempts,
        window_s=login_window_s,
    )
    pages = Pages(app, sessions)
    router = APIRouter(prefix="/ui", include_in_schema=False)
    router.add_api_route("/login", login.login_form, methods=["GET"])
    router.add_api_route("/login", login.login, methods=["POST"])
    router.add_api_route("/logout", login.logout, methods=["POST"])
    router.add_api_route("/", pages.runs, methods=["GET"])
    router.add_api_route("/workers", pages.workers, methods=["GET"])
    router.add_api_route("/schedules", pages.schedules, methods=["GET"])
    router.add_api_route("/runs/{run_id}", pages.run_page, methods=["GET"])
    router.add_api_route("/runs/{run_id}/timeline", pages.timeline_part, methods=["GET"])
    router.add_api_route("/runs/{run_id}/panel", pages.panel, methods=["GET"])
    return router


def _login_first() -> RedirectResponse:
    return RedirectResponse("/ui/login", status_code=303)


def _can(key: ApiKey) -> dict[str, bool]:
    """What the page may offer the viewer: buttons for what the key may do."""
    return {
        "can_approve": key.allows("approve"),
        "can_submit": key.allows("submit"),
        "can_admin": key.allows("admin"),
    }


class Pages:
    """The pages behind the login; its methods are the routes. A page without a
    session redirects to the login; a part redrawn by a live page answers 401."""

    def __init__(self, app: App, sessions: Sessions) -> None:
        self.app = app
        self.sessions = sessions

    def viewer(self, request: Request) -> ApiKey | None:
        """The key the request's session stands for, if it may read."""
        token = request.cookies.get(COOKIE)
        if not token:
            return None
        key_id = self.sessions.key_id(token, self.app.clock.now())
        key = self.app.admin.get_key(key_id) if key_id is not None else None
        return key if key is not None and key.allows("read") else None

    def runs(
        self,
        request: Request,
        status: str | None = None,
        workflow: Annotated[str | None, Query(max_length=200)] = None,
        q: Annotated[str | None, Query(max_length=200)] = None,
        offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    ) -> Response:
        key = self.viewer(request)
        if key is None:
            return _login_first()
        app = self.app
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
            records, app.store.last_steps([r.id for r in records]), app.observe.usage(records), now
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
            can_admin=key.allows("admin"),  # the replay check's button
        )

    def workers(self, request: Request) -> Response:
        key = self.viewer(request)
        if key is None:
            return _login_first()
        now = self.app.clock.now()
        return page("workers.html", key=key, workers=self.app.store.list_workers(), now=now)

    def schedules(self, request: Request) -> Response:
        key = self.viewer(request)
        if key is None:
            return _login_first()
        return page(
            "schedules.html",
            key=key,
            schedules=self.app.schedules.list(),
            can_admin=key.allows("admin"),
        )

    def run_page(self, request: Request, run_id: str) -> Response:
        key = self.viewer(request)
        if key is None:
            return _login_first()
        try:
            record = self.app.get_run(run_id)
        except RunNotFound:
            return page("missing.html", key=key, run_id=run_id)
        diagnosis = (
            self.app.observe.diagnose(run_id) if record.status in ("failed", "running") else None
        )
        return page(
            "run.html",
            key=key,
            **self._live(request, run_id),
            findings=diagnosis.findings if diagnosis else (),
            **self._status(record),
            **_can(key),
        )

    def timeline_part(self, request: Request, run_id: str) -> Response:
        """The timeline alone, redrawn as a live run's steps arrive (same filters)."""
        if self.viewer(request) is None:
            return Response(status_code=401)
        try:
            live = self._live(request, run_id)
        except RunNotFound:
            return Response(status_code=404)
        return page(
            "_live.html", run=live["trace"].run, family=self.app.observe.family(run_id), **live
        )

    def panel(self, request: Request, run_id: str) -> Response:
        """The run's status and pending requests, redrawn when the status changes."""
        key = self.viewer(request)
        if key is None:
            return Response(status_code=401)
        return page("_panel.html", **self._status(self.app.get_run(run_id)), **_can(key))

    def _live(self, request: Request, run_id: str) -> dict[str, Any]:
        """What the live part of a run's page shows: its trace, as a filtered
        timeline, and the usage chart of its model turns."""
        trace = self.app.observe.trace(run_id)
        timeline = build_timeline(
            trace.entries, Filters.parse(request.query_params), now=self.app.clock.now()
        )
        return {
            "trace": trace,
            "tl": timeline,
            "kinds": KINDS,
            "chart": usage_chart(timeline.turns),
        }

    def _status(self, record: RunRecord) -> dict[str, Any]:
        """What the run's panel shows: its requests, its children and their costs."""
        run_id = record.id
        return {
            "run": record,
            "requests": [] if record.finished else self.app.requests(run_id),
            "children": self.app.children(run_id),
            "family": self.app.observe.family(run_id),
        }
