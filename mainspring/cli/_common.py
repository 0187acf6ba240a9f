"""What the operator commands share: choosing the database, errors, output.

Every command that reads or steers a database finds it the same way: ``--db URL``,
else ``--app MODULE:APP`` (that App's database), else ``MAINSPRING_DATABASE_URL``,
else the default ``sqlite:///mainspring.db``. Errors are one ``error: ...`` line on
stderr with exit code 2, whether the command runs under ``main()`` or is invoked on
the Typer app directly.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import typer
from rich.console import Console

from .. import App, ConfigError, MainspringError
from ..observability import configure_logging, remove_logging
from ..storage import SCHEMA_VERSION, SQLiteStore, Store, open_store
from ._load import load_app

__all__ = [
    "AppOption",
    "DbOption",
    "ErrorsOption",
    "JsonOption",
    "LastOption",
    "LibraryLogLevelOption",
    "LogLevelOption",
    "OtelOption",
    "StepOption",
    "app_process",
    "cli_errors",
    "console",
    "database_url",
    "iso_time",
    "logging_to_stderr",
    "open_app",
    "open_existing_store",
    "pick_steps",
    "print_json",
    "require_file",
    "set_tracing",
    "sqlite_path",
]

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="URL",
        help="Database URL (default: MAINSPRING_DATABASE_URL, else sqlite:///mainspring.db).",
    ),
]
AppOption = Annotated[
    str | None,
    typer.Option("--app", metavar="MODULE:APP", help="Use the database of this App."),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON to stdout instead of a table.")
]


LastOption = Annotated[
    int | None, typer.Option("--last", metavar="N", min=1, help="Only the last N steps.")
]
ErrorsOption = Annotated[
    bool, typer.Option("--errors", help="Only the steps that failed or were retried.")
]
LogLevelOption = Annotated[
    str,
    typer.Option(
        help="DEBUG, INFO, WARNING or ERROR (DEBUG also lets libraries' own logs through)."
    ),
]
LibraryLogLevelOption = Annotated[
    str | None,
    typer.Option(
        envvar="MAINSPRING_LIBRARY_LOG_LEVEL",
        help="Level of third-party loggers (httpx, httpcore, openai, anthropic, mcp,"
        " uvicorn...): WARNING unless --log-level is DEBUG.",
        show_default=False,
    ),
]
OtelOption = Annotated[
    bool | None,
    typer.Option(
        "--otel/--no-otel",
        help="Export OpenTelemetry spans live (default: when the OTEL_* variables"
        " configure an exporter, e.g. OTEL_EXPORTER_OTLP_ENDPOINT).",
        show_default=False,
    ),
]
CaptureOption = Annotated[
    bool | None,
    typer.Option(
        "--capture-content/--no-capture-content",
        help="Put what steps took and returned (messages, tool arguments and results,"
        " redacted and capped) on the exported spans (default: as the standard"
        " OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT variable says, else off).",
        show_default=False,
    ),
]
StepOption = Annotated[
    str | None,
    typer.Option(
        "--step",
        metavar="N|S:N",
        help="Only this step: its seq in the run's current session, or session:seq.",
    ),
]

T = TypeVar("T")


def pick_steps(
    items: list[T],
    *,
    where: Callable[[T], tuple[int, int]],
    troubled: Callable[[T], bool],
    session: int,
    last: int | None,
    errors: bool,
    step: str | None,
) -> list[T]:
    """The steps ``--step``, ``--errors`` and ``--last`` keep, in that order, for runs of
    hundreds of steps. ``where`` gives an item's ``(session, seq)``.

    Raises:
        ConfigError: ``--step`` is malformed or names no step of the run.
    """
    picked = items
    if step is not None:
        text = step.strip()
        first, sep, second = text.partition(":")
        try:
            wanted = (int(first), int(second)) if sep else (session, int(first))
        except ValueError:
            raise ConfigError(f"--step takes N or SESSION:N, got {step!r}") from None
        picked = [i for i in picked if where(i) == wanted]
        if not picked:
            raise ConfigError(f"the run has no step {wanted[0]}:{wanted[1]} (--step {step})")
    if errors:
        picked = [i for i in picked if troubled(i)]
    if last is not None:
        picked = picked[-last:]
    return picked


def set_tracing(app: App, otel: bool | None, capture_content: bool | None = None) -> None:
    """``--otel`` / ``--no-otel``; neither: the ``OTEL_*`` variables decide when the
    worker starts. ``--capture-content`` / ``--no-capture-content``: content on the
    spans, whichever turns tracing on."""
    if otel is False and capture_content:
        raise typer.BadParameter(
            "--capture-content puts content on exported spans, and --no-otel exports none",
            param_hint="--capture-content",
        )
    app.telemetry.capture_content = capture_content
    if otel:
        app.observe.enable_tracing(capture_content=capture_content)
    elif otel is False:
        app.observe.disable_tracing()


def iso_time(ts: float | None) -> str | None:
    """``"2026-11-29T14:03:07.512Z"``: how ``--json`` prints a time (``None`` stays)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@contextmanager
def cli_errors() -> Iterator[None]:
    """A mainspring error becomes one ``error: ...`` line on stderr and exit code 2."""
    try:
        yield
    except MainspringError as exc:
        typer.echo(f"error: {_one_line(str(exc))}", err=True)
        raise typer.Exit(2) from None


def database_url(db: str | None, app_spec: str | None) -> tuple[str, str]:
    """The chosen database URL and where it came from (for messages).

    ``--db``, else ``--app``, else ``MAINSPRING_DATABASE_URL``, else the default.
    """
    url, source, _ = _choose(db, app_spec)
    return url, source


@contextmanager
def open_app(db: str | None, app_spec: str | None) -> Iterator[App]:
    """The App over the chosen database (see :func:`database_url`), which must exist."""
    url, source, loaded = _choose(db, app_spec)
    require_file(url, source)
    app = loaded if loaded is not None else App(open_existing_store(url))
    try:
        yield app
    finally:
        app.close()


def _choose(db: str | None, app_spec: str | None) -> tuple[str, str, App | None]:
    if db is not None and app_spec is not None:
        raise ConfigError(f"give --db or --app, not both (got --db {db!r} and --app {app_spec!r})")
    if db is not None:
        return db, "--db", None
    if app_spec is not None:
        loaded = load_app(app_spec)
        return loaded.url, f"the App {app_spec!r}", loaded
    if os.environ.get("MAINSPRING_DATABASE_URL"):
        return os.environ["MAINSPRING_DATABASE_URL"], "MAINSPRING_DATABASE_URL", None
    return App().url, "the default", None  # the URL an App gets by default


def sqlite_path(url: str) -> str | None:
    """The file a ``sqlite:///`` URL names; ``None`` for other stores and malformed URLs."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        return None  # other stores, and malformed URLs the store explains itself
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return path or None


def require_file(url: str, source: str) -> None:
    """Refuse a SQLite URL naming no file: opening it would create an empty database."""
    path = sqlite_path(url)
    if path and not os.path.isfile(path):
        raise ConfigError(
            f"no database file {path!r} (URL {url!r} from {source}); pass --db URL or "
            "--app MODULE:APP, or set MAINSPRING_DATABASE_URL"
        )


def open_existing_store(url: str) -> Store:
    """Open a store without writing to a file that is not a mainspring database."""
    if urlsplit(url).scheme != "sqlite":
        return open_store(url)
    store = SQLiteStore.from_url(url, migrate=False)
    try:
        # Fails with "is it a mainspring database?" before any table is created.
        if store.schema_version() != SCHEMA_VERSION:
            store.migrate()  # older: upgrade as any worker would; newer: a clear error
    except BaseException:
        store.close()
        raise
    return store


def console() -> Console:
    """The console tables and messages go to."""
    # No markup or emoji codes: run names, outputs and errors are shown as they are.
    out = Console(highlight=False, markup=False, emoji=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = 160  # piped output: do not squeeze tables into 80 columns
    return out


def print_json(value: Any) -> None:
    """One JSON document on stdout, and nothing else."""
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines()]
    # pydantic's validation errors end with a documentation link: noise on one line.
    return " ".join(ln for ln in lines if ln and not ln.startswith("For further information"))


@contextmanager
def app_process(
    app_spec: str,
    log_level: str,
    library_log_level: str | None,
    otel: bool | None,
    capture_content: bool | None,
) -> Iterator[App]:
    """The App of a process that runs until stopped (``worker``, ``serve``): loaded
    from ``app_spec`` under :func:`logging_to_stderr` (its own redaction patterns
    added), traced as ``--otel`` and ``--capture-content`` say. The log handler goes
    when the block ends."""
    with logging_to_stderr(log_level, library_log_level, app_spec) as loaded:
        app = load_app(app_spec)
        loaded(app)  # the App's own redaction patterns apply to the log too
        set_tracing(app, otel, capture_content)
        yield app


@contextmanager
def logging_to_stderr(
    level: str, library_level: str | None, app_spec: str
) -> Iterator[Callable[[App], None]]:
    """While the block runs, the log handler of ``worker`` and ``serve``
    (redacting, libraries quiet: :func:`~mainspring.observability.configure_logging`),
    the package of ``app_spec`` counting as the application's; a bad level is a usage
    error. Gives what to call once the App is loaded (its redactor applies too)."""
    for value, option in ((level, "--log-level"), (library_level, "--library-log-level")):
        if value is not None and not isinstance(logging.getLevelName(value.upper()), int):
            raise typer.BadParameter(
                f"{value!r} is not a log level: give DEBUG, INFO, WARNING or ERROR",
                param_hint=option,
            )
    package = app_spec.split(":", 1)[0].split(".", 1)[0]
    redacting, _ = configure_logging(level, library_level=library_level, packages=[package])

    def loaded(app: App) -> None:
        redacting.add(app.redactor)

    try:
        yield loaded
    finally:  # invoked in-process (a test, a script), the command leaves no handler
        remove_logging()
