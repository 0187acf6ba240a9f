"""Where spans go: the tracer provider live export uses, from the application or from
the standard ``OTEL_*`` environment variables.

A worker exports live when OpenTelemetry is configured: by ``app.observe.enable_tracing()``
(or ``--otel``), or by the environment alone, when it names an exporter
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or an
``OTEL_TRACES_EXPORTER`` other than ``none``) and ``OTEL_SDK_DISABLED`` is not
``true``. :func:`exporter_from_environment` reads that without importing
OpenTelemetry, so a process whose environment configures nothing pays nothing.
Where spans go is logged once; so is a configuration that cannot work (the extra
missing, an exporter that is not installed), rather than spans dropped in silence.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from .._errors import MissingExtra

__all__ = [
    "CAPTURE_VARIABLE",
    "capture_from_environment",
    "configured_provider",
    "exporter_from_environment",
    "otel",
    "unconfigured",
    "warn_no_exporter",
]

log = logging.getLogger("mainspring.observability")

_OTLP_PATH = "/v1/traces"


def otel() -> Any:
    """``opentelemetry.trace``, or :class:`MissingExtra` naming the ``[otel]`` extra."""
    try:
        import opentelemetry.trace
    except ImportError as exc:
        raise MissingExtra("OpenTelemetry export", "otel", exc.name) from None
    return opentelemetry.trace


def exporter_from_environment(environ: Mapping[str, str]) -> str | None:
    """Where the standard variables send spans (``"OTLP/HTTP to http://..."``,
    ``"the console"``), or ``None`` when they configure no exporter."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    wanted = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if wanted == "none":
        return None
    traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if not (wanted or traces or base):
        return None
    if wanted and wanted.split(",")[0].strip() == "console":
        return "the console"
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        return f"OTLP/gRPC to {traces or base or 'http://localhost:4317'}"
    # The SDK appends /v1/traces to the general endpoint, never to the traces one.
    url = traces or (base.rstrip("/") + _OTLP_PATH if base else "http://localhost:4318/v1/traces")
    return f"OTLP/HTTP to {url}"


#: The standard variable of the GenAI instrumentations that turns content capture on.
CAPTURE_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_CAPTURE_ON = frozenset({"true", "1", "yes", "on", "span_only", "span_and_event", "event_only"})
_CAPTURE_OFF = frozenset({"", "false", "0", "no", "off", "no_content"})


def capture_from_environment(environ: Mapping[str, str]) -> bool:
    """Whether ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` asks for content
    on spans (``true``; the newer ``SPAN_ONLY``, ``SPAN_AND_EVENT`` and ``EVENT_ONLY``
    too: mainspring puts content on spans only). Any other value is off, said once in
    the log when it is not ``false`` either."""
    value = environ.get(CAPTURE_VARIABLE, "").strip().lower()
    if value in _CAPTURE_ON:
        return True
    if value not in _CAPTURE_OFF and not _said_capture.is_set():
        _said_capture.set()
        log.warning(
            "OpenTelemetry: %s=%r is not true or false: content is not captured",
            CAPTURE_VARIABLE,
            environ.get(CAPTURE_VARIABLE),
        )
    return False


_said_capture = threading.Event()


def configured_provider(tracer_provider: Any, environ: Mapping[str, str]) -> Any:
    """``tracer_provider``, else the global one, else (when ``environ`` configures an
    exporter) an SDK provider exporting through it, set as the global provider. Says
    in the log, once, where spans go, or that they would go nowhere."""
    trace = otel()
    if tracer_provider is not None:
        log.info("OpenTelemetry: live spans go to the tracer provider given")
        return tracer_provider
    current = trace.get_tracer_provider()
    if not unconfigured(current):
        log.info("OpenTelemetry: live spans go to the global tracer provider")
        return current  # the application configured OpenTelemetry itself
    where = exporter_from_environment(environ)
    if where is None:
        warn_no_exporter()
        return current
    exporter = _exporter(where)
    if exporter is None:
        return current
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create())  # reads OTEL_SERVICE_NAME etc.
    # Batched: a slow collector never holds up a run; a stopping worker flushes it.
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("OpenTelemetry: live spans go %s (set by the OTEL_* variables)", _to(where))
    return provider


def _exporter(where: str) -> Any:
    """The SDK exporter ``where`` names, or ``None`` (said in the log) when it is not
    installed."""
    try:
        if where == "the console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            return ConsoleSpanExporter()
        if where.startswith("OTLP/gRPC"):
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as Grpc,
            )

            return Grpc()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )

        return OTLPSpanExporter()
    except ImportError as exc:
        package = (
            "opentelemetry-exporter-otlp-proto-grpc"
            if where.startswith("OTLP/gRPC")
            else "'mainspring[otel]'"
        )
        log.warning(
            "OpenTelemetry: the OTEL_* variables send spans %s, but %s is not "
            "installed (pip install %s): no spans are exported",
            _to(where),
            exc.name,
            package,
        )
        return None


def _to(where: str) -> str:
    return f"to {where}" if where.startswith("the ") else f"over {where}"


_warned = threading.Event()


def warn_no_exporter() -> None:
    """Say once per process that spans go nowhere (rather than drop them in silence)."""
    if not _warned.is_set():
        _warned.set()
        log.warning(
            "OpenTelemetry spans go nowhere: no tracer provider is configured. Set "
            "OTEL_EXPORTER_OTLP_ENDPOINT, or pass tracer_provider="
        )


def unconfigured(provider: Any) -> bool:
    """Whether ``provider`` is OpenTelemetry's placeholder (nothing was set up)."""
    return type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider")
