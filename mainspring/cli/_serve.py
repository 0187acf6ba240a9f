"""``mainspring serve MODULE:APP``: the HTTP API, optionally with a worker inside."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from ..storage import redact_url
from ._load import load_app

__all__ = ["serve"]


def serve(
    app_spec: Annotated[str, typer.Argument(metavar="MODULE:APP", help="Where the App lives.")],
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    worker: Annotated[
        bool, typer.Option("--worker/--no-worker", help="Also execute runs in this process.")
    ] = False,
    concurrency: Annotated[int, typer.Option(help="Runs the embedded worker executes.")] = 64,
    webhooks: Annotated[
        bool, typer.Option("--webhooks/--no-webhooks", help="Deliver webhooks from here.")
    ] = True,
    max_body_bytes: Annotated[int, typer.Option(help="Larger request bodies get 413.")] = 1 << 20,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    otel: Annotated[
        bool,
        typer.Option(
            "--otel/--no-otel",
            help="Export OpenTelemetry spans live (configured by the OTEL_* variables).",
        ),
    ] = False,
) -> None:
    """Serve the HTTP API (docs at /docs, OpenAPI at /openapi.json)."""
    try:
        import uvicorn

        from ..server import create_app
    except ImportError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    app = load_app(app_spec)
    if otel:
        app.enable_tracing()
    api = create_app(
        app,
        worker=worker,
        webhooks=webhooks,
        max_body_bytes=max_body_bytes,
        worker_options={"concurrency": concurrency},
    )
    logging.getLogger("mainspring.server").info(
        "serving %s on http://%s:%d (store %s, worker %s)",
        app_spec,
        host,
        port,
        redact_url(app.url),
        "on" if worker else "off",
    )
    uvicorn.run(api, host=host, port=port, log_level=log_level.lower(), access_log=False)
