"""The web dashboard: server-rendered pages (Jinja2) over the HTTP API, live over SSE,
with no front-end build step. Mounted at ``/ui`` by ``mainspring serve``."""

from ._sessions import Sessions
from ._views import dashboard_router

__all__ = ["Sessions", "dashboard_router"]
