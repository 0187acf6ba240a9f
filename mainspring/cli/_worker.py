"""``mainspring worker MODULE:APP``."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Annotated, Literal

import typer

from ..observability import serve_metrics
from ..storage import redact_url
from ._common import CaptureOption, LibraryLogLevelOption, LogLevelOption, OtelOption, app_process

__all__ = ["accept_version_values", "worker"]


def worker(
    app_spec: Annotated[str, typer.Argument(metavar="MODULE:APP", help="Where the App lives.")],
    concurrency: Annotated[int, typer.Option(help="Runs executed at once.")] = 64,
    lease_s: Annotated[
        float | None, typer.Option(help="Lease length in seconds (default: the App's).")
    ] = None,
    worker_id: Annotated[str | None, typer.Option(help="Name used in leases and logs.")] = None,
    shutdown_grace_s: Annotated[
        float, typer.Option(help="On SIGTERM, how long runs may take to reach a step boundary.")
    ] = 30.0,
    until_idle: Annotated[
        bool, typer.Option(help="Exit when nothing is runnable or running.")
    ] = False,
    log_level: LogLevelOption = "INFO",
    library_log_level: LibraryLogLevelOption = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="Serve this worker's Prometheus counters on this port (/metrics)."),
    ] = None,
    metrics_host: Annotated[str, typer.Option(help="Interface for --metrics-port.")] = "127.0.0.1",
    otel: OtelOption = None,
    capture_content: CaptureOption = None,
    accept_version: Annotated[
        list[str] | None,
        typer.Option(
            help="Claim only runs submitted by this code version (repeatable; 'none': runs"
            " with no version; 'any': every run). Default: the App's version and 'none' when"
            " the App declares one, else every run."
        ),
    ] = None,
    sticky: Annotated[
        bool,
        typer.Option(
            help="Keep the live execution of runs that suspend and resume it instead of"
            " replaying (--no-sticky: every wake-up replays)."
        ),
    ] = True,
    schedules: Annotated[
        list[Path] | None,
        typer.Option(
            "--schedules",
            help="A TOML or JSON file of schedules to declare (repeatable;"
            " docs/schedules-and-queues.md).",
        ),
    ] = None,
) -> None:
    """Execute runs: claim, replay, step, heartbeat. Stops gracefully on SIGTERM/SIGINT."""
    if lease_s is not None and lease_s <= 0:
        raise typer.BadParameter(f"must be > 0, got {lease_s!r}", param_hint="--lease-s")
    with app_process(app_spec, log_level, library_log_level, otel, capture_content) as app:
        for path in schedules or []:
            app.schedules.load(path)
        if metrics_port is not None:
            serve_metrics(app.telemetry, metrics_host, metrics_port)
        if lease_s is not None:
            app.lease_s = lease_s
            app.heartbeat_s = lease_s / 3
        w = app.worker(
            concurrency=concurrency,
            worker_id=worker_id,
            shutdown_grace_s=shutdown_grace_s,
            sticky=sticky,
            versions=accept_version_values(accept_version),
        )

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, w.request_stop)
            logging.getLogger("mainspring.worker").info(
                "worker %s started on %s (concurrency %d, workflows: %s, versions: %s)",
                w.worker_id,
                redact_url(app.url),
                concurrency,
                ", ".join(sorted(app.workflows)) or "none",
                "any"
                if w.versions is None
                else ", ".join("none" if v is None else v for v in w.versions) or "none at all",
            )
            await w.run(until_idle=until_idle)
            logging.getLogger("mainspring.worker").info(
                "worker %s stopped: %s", w.worker_id, w.stats.outcomes
            )

        asyncio.run(main())


def accept_version_values(values: list[str] | None) -> list[str | None] | Literal["any"] | None:
    """``--accept-version`` values as ``Worker(versions=...)`` takes them."""
    if not values:
        return None
    words = [v.strip() for v in values]
    if any(w.lower() == "any" for w in words):
        if len(words) > 1:
            raise typer.BadParameter(
                f"'any' accepts every version: give it alone, got {values!r}",
                param_hint="--accept-version",
            )
        return "any"
    if any(not w for w in words):
        raise typer.BadParameter(
            f"a version cannot be empty, got {values!r}", param_hint="--accept-version"
        )
    return [None if w.lower() == "none" else w for w in words]
