"""``mainspring serve MODULE:APP``: the HTTP API, optionally with a worker inside."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from .. import MissingExtra
from ..storage import redact_url
from ._common import CaptureOption, LibraryLogLevelOption, LogLevelOption, OtelOption, app_process

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
    log_level: LogLevelOption = "INFO",
    library_log_level: LibraryLogLevelOption = None,
    docs: Annotated[
        bool,
        typer.Option(
            "--docs/--no-docs",
            help="Serve Swagger UI at /docs (it loads its scripts from a CDN).",
        ),
    ] = False,
    ssl_certfile: Annotated[
        str | None, typer.Option(help="Serve HTTPS with this certificate (PEM).")
    ] = None,
    ssl_keyfile: Annotated[str | None, typer.Option(help="The certificate's key (PEM).")] = None,
    webhook_allow: Annotated[
        list[str] | None,
        typer.Option(
            "--webhook-allow",
            metavar="CIDR",
            help="A network webhooks may target beside globally routable addresses (repeatable; "
            "'*' allows any).",
        ),
    ] = None,
    header_timeout: Annotated[
        float,
        typer.Option(help="Seconds a client has to send a request's headers (then closed)."),
    ] = 10.0,
    body_timeout: Annotated[
        float,
        typer.Option(help="Seconds a request body may pause between chunks (then 408)."),
    ] = 30.0,
    secure_cookies: Annotated[
        bool,
        typer.Option(
            "--secure-cookies",
            help="Mark the dashboard's session cookie Secure (behind a TLS proxy; "
            "automatic with --ssl-certfile).",
        ),
    ] = False,
    otel: OtelOption = None,
    capture_content: CaptureOption = None,
) -> None:
    """Serve the HTTP API (OpenAPI at /openapi.json; Swagger UI at /docs with --docs)."""
    try:
        import uvicorn

        from ..server import create_app, with_header_timeout
    except ImportError as exc:  # the CLI prints MissingExtra as one line with the fix
        raise MissingExtra("mainspring serve", "server", exc.name) from None

    with app_process(app_spec, log_level, library_log_level, otel, capture_content) as app:
        api = create_app(
            app,
            worker=worker,
            webhooks=webhooks,
            max_body_bytes=max_body_bytes,
            worker_options={"concurrency": concurrency},
            docs=docs,
            secure_cookies=True if secure_cookies or ssl_certfile else None,
            webhook_allow=webhook_allow or (),
            body_timeout_s=body_timeout,
        )
        logging.getLogger("mainspring.server").info(
            "serving %s on http://%s:%d (store %s, worker %s)",
            app_spec,
            host,
            port,
            redact_url(app.url),
            "on" if worker else "off",
        )
        uvicorn.run(
            api,
            host=host,
            port=port,
            # uvicorn installs no handler of its own: its records go to the one above
            # (redacted, one format), which lets them through as a library's.
            log_config=None,
            log_level=logging.getLogger().getEffectiveLevel(),
            access_log=False,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            timeout_keep_alive=5,  # idle connections are closed, not held
            http=with_header_timeout(header_timeout),  # and so are ones whose headers dawdle
            limit_concurrency=1000,  # past this, 503 rather than exhausting descriptors
        )
