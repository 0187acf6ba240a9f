"""How a dashboard page is rendered: the Jinja2 templates, the filters they use to
show times, JSON and errors, and the Content-Security-Policy each page carries."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from ..serde import loads, public_error
from ._timeline import duration, money
from ._triage import ago, stamp

__all__ = ["page"]

_env = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(["html"]),
)


def page(name: str, *, status_code: int = 200, **context: Any) -> HTMLResponse:
    """The template ``name`` rendered with ``context``, under a fresh script nonce."""
    # Scripts run only with this response's nonce: an injected <script> does not.
    nonce = secrets.token_urlsafe(16)
    html = _env.get_template(name).render(nonce=nonce, **context)
    return HTMLResponse(
        html, status_code=status_code, headers={"Content-Security-Policy": _csp(nonce)}
    )


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
