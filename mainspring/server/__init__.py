"""The HTTP API (FastAPI) and webhook delivery. Needs the ``[server]`` extra.

``mainspring serve MODULE:APP`` runs it; :func:`create_app` gives the ASGI app to
mount or to run under any ASGI server.
"""

from .. import MissingExtra

try:
    import fastapi  # noqa: F401
    import httpx  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("the HTTP API", "server", exc.name) from exc

from ._api import create_app
from ._events import parse_event_id
from ._protocol import with_header_timeout
from ._targets import TargetPolicy
from ._webhooks import (
    WebhookDispatcher,
    sign_standard_webhook,
    sign_webhook,
    verify_standard_webhook,
    verify_webhook,
)

__all__ = [
    "TargetPolicy",
    "WebhookDispatcher",
    "create_app",
    "parse_event_id",
    "sign_standard_webhook",
    "sign_webhook",
    "verify_standard_webhook",
    "verify_webhook",
    "with_header_timeout",
]
