"""The log of mainspring's long-running commands (``worker``, ``serve``): one line per
record on stderr, no secret in any line whoever's logger wrote it, and third-party
libraries quiet unless the operator asks.

Redaction is a filter on the handler mainspring installs, not on mainspring's own
loggers, so it sees every record that reaches the output: httpx's ``HTTP Request:
POST https://user:pw@host/hook?token=…``, uvicorn's access lines, a traceback that
quotes a URL. Each line goes through the builtin :class:`Redactor` (and the App's,
with its own patterns), and every URL in it loses its user, password and query
values, which is where webhook receivers, proxies and presigned links keep tokens.

Libraries log their own chatter at INFO (httpx a line per request, so a line per
model call). Under ``worker`` and ``serve`` a record from a third-party library
passes at WARNING and above, so that the INFO log is about runs; ``--log-level
debug`` lets libraries through at DEBUG, and ``--library-log-level``
(``MAINSPRING_LIBRARY_LOG_LEVEL``) sets their level on its own. A record is a
library's when its logger's top-level name is one of :data:`LIBRARIES`, or when the
code that logged it is installed (site-packages, the standard library) and the
logger is neither mainspring's nor under the application's own package: a list of
names alone would miss the next HTTP client a provider SDK switches to.
"""

from __future__ import annotations

import logging
import os
import re
import site
import sys
import sysconfig
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from ._redact import Redactor

__all__ = [
    "LIBRARIES",
    "LibraryLevel",
    "RedactingFilter",
    "configure_logging",
    "redact_log_text",
    "remove_logging",
]

# Third-party loggers a worker or server process meets: HTTP clients and servers,
# model and MCP SDKs, database drivers, exporters.
LIBRARIES: frozenset[str] = frozenset({
    "httpx", "httpx2", "httpcore", "httpcore2", "h11", "h2", "hpack", "urllib3", "requests",
    "aiohttp",
    "openai", "anthropic", "mcp", "agents", "pydantic_ai", "langgraph", "langchain",
    "uvicorn", "fastapi", "starlette", "sse_starlette", "multipart", "python_multipart",
    "psycopg", "psycopg_pool", "opentelemetry", "watchfiles", "websockets", "asyncio",
    "google_genai", "botocore", "grpc", "jinja2", "filelock", "charset_normalizer",
})  # fmt: skip
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_REPLACEMENT = "[REDACTED]"
# A URL: scheme, then everything up to white space or a quote.
_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^\s\"'<>`]+)")
# An HTTP request line as access logs print it: "GET /path?query HTTP/1.1".
_REQUEST_LINE = re.compile(
    r"\b((?:GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS|CONNECT|TRACE) [^\s?\"]*\?)([^\s\"]*)"
)
_BUILTIN = Redactor()


def _query(query: str) -> str:
    """Every value of a query string replaced (a bare item too: it may be a token)."""
    parts = []
    for item in query.split("&"):
        name, equals, _ = item.partition("=")
        parts.append(f"{name}={_REPLACEMENT}" if equals else (_REPLACEMENT if item else ""))
    return "&".join(parts)


def _url(m: re.Match[str]) -> str:
    scheme, rest = m.group(1), m.group(2)
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, end)
    if at >= 0:  # user and password: both go (a user name can be the token)
        rest = f"{_REPLACEMENT}@{rest[at + 1 :]}"
    path, mark, query = rest.partition("?")
    if mark:
        query, hash_mark, fragment = query.partition("#")
        rest = f"{path}?{_query(query)}{hash_mark}{fragment}"
    return scheme + rest


def redact_log_text(text: str, redactors: Sequence[Redactor] = ()) -> str:
    """``text`` with URLs' credentials and query values, request lines' query values
    and whatever the redactors (the builtin one first) recognise replaced."""
    for redactor in (_BUILTIN, *redactors):
        text = redactor.redact_text(text)
    if "://" in text:
        text = _URL.sub(_url, text)
    if "?" in text:
        text = _REQUEST_LINE.sub(lambda m: m.group(1) + _query(m.group(2)), text)
    return text


class RedactingFilter(logging.Filter):
    """A handler filter that rewrites each record's message, traceback and stack
    without secrets (:func:`redact_log_text`). Add an App's redactor with
    :meth:`add` to apply its patterns too."""

    def __init__(self, redactors: Sequence[Redactor] = ()) -> None:
        super().__init__()
        self._redactors = list(redactors)
        self._lock = threading.Lock()
        self._formatter = logging.Formatter()

    def add(self, redactor: Redactor | None) -> None:
        """Apply ``redactor`` too (``None``: nothing to add)."""
        with self._lock:
            if redactor is not None and redactor is not _BUILTIN:
                self._redactors = [*self._redactors, redactor]

    def filter(self, record: logging.LogRecord) -> bool:
        redactors = self._redactors
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: the handler reports it as logging does
            return True
        clean = redact_log_text(message, redactors)
        if clean != message or record.args:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_log_text(record.exc_text, redactors)
        if record.stack_info:
            record.stack_info = redact_log_text(record.stack_info, redactors)
        return True


def _installed_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.update(getattr(site, "getsitepackages", list)())
    dirs.add(site.getusersitepackages())
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


class LibraryLevel(logging.Filter):
    """A handler filter that lets a third-party library's record through at
    ``library`` and above, and the others (mainspring's, the application's) at
    ``own`` and above."""

    def __init__(self, own: int, library: int, packages: Iterable[str] = ()) -> None:
        super().__init__()
        self.own = own
        self.library = library
        self.packages = {"mainspring", *packages}
        self._installed = _installed_dirs()
        self._files: dict[str, bool] = {}  # source file -> installed (one realpath each)

    def is_library(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` comes from a third-party library (see the module)."""
        top = record.name.split(".", 1)[0]
        if top in self.packages:
            return False
        if top in LIBRARIES:
            return True
        path = record.pathname or ""
        installed = self._files.get(path)
        if installed is None:
            installed = os.path.realpath(path).startswith(self._installed)
            if len(self._files) < 10_000:
                self._files[path] = installed
        return installed

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= max(self.own, self.library):
            return True
        return record.levelno >= (self.library if self.is_library(record) else self.own)


def configure_logging(
    level: str, *, library_level: str | None = None, packages: Iterable[str] = ()
) -> tuple[RedactingFilter, LibraryLevel]:
    """Install mainspring's log handler on the root logger (replacing one installed
    before, so calling it again is harmless): ``level`` for mainspring and the
    application (``packages``: its top-level package names), ``library_level`` for
    third-party libraries (default WARNING, or ``level`` when it is DEBUG or above
    WARNING). Returns the handler's filters: the redacting one, and the levels (add
    packages to ``packages`` once the application is loaded).

    Raises:
        ValueError: a level that is not a logging level name.
    """
    wanted = _level(level)
    if library_level:
        libraries = _level(library_level)
    else:
        libraries = wanted if wanted <= logging.DEBUG else max(wanted, logging.WARNING)
    root = logging.getLogger()
    before = remove_logging()
    handler = _Stderr(before)
    handler.setFormatter(logging.Formatter(FORMAT))
    levels = LibraryLevel(wanted, libraries, packages)
    redacting = RedactingFilter()
    handler.addFilter(levels)  # first: a record dropped is never redacted for nothing
    handler.addFilter(redacting)
    root.addHandler(handler)
    root.setLevel(min(wanted, libraries))
    return redacting, levels


def remove_logging() -> int:
    """Take out the handler :func:`configure_logging` installed, if any, and give the
    root logger back its level from before; returns that level."""
    root = logging.getLogger()
    level = root.level
    for old in [h for h in root.handlers if isinstance(h, _Stderr)]:
        root.removeHandler(old)
        level = old.root_level
    root.setLevel(level)
    return level


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to whatever ``sys.stderr`` is when a record comes (a test
    runner or a daemon may swap it)."""

    def __init__(self, root_level: int) -> None:
        super().__init__()
        self.root_level = root_level

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _level(name: str) -> int:
    value = logging.getLevelName(name.strip().upper())
    if not isinstance(value, int):
        raise ValueError(
            f"{name!r} is not a log level: give DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )
    return value
