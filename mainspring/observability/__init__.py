"""Seeing runs: step traces, secret redaction, Prometheus metrics, OpenTelemetry
export, and ``doctor``'s diagnosis by the failure table.

``app.observe.trace(run_id)`` returns a :class:`RunTrace`; :class:`MetricsCollector` (the
``[metrics]`` extra) renders what ``/metrics`` serves; :func:`export_trace` (the
``[otel]`` extra) emits a run as GenAI-convention spans.
"""

from ._doctor import Diagnosis, Finding, FindingKind, Progress, progress
from ._doctor import diagnose as diagnose
from ._live import Telemetry as Telemetry
from ._live import serve_metrics
from ._logs import LIBRARIES, LibraryLevel, RedactingFilter, configure_logging, remove_logging
from ._metrics import MetricsCollector as MetricsCollector
from ._names import StepRole, model_of, step_role
from ._otel import export_trace
from ._redact import BUILTIN_PATTERNS, SECRET_KEYS, Redactor
from ._setup import capture_from_environment as capture_from_environment
from ._setup import exporter_from_environment as exporter_from_environment
from ._spans import child_traceparent as child_traceparent
from ._spans import fork_traceparent as fork_traceparent
from ._trace import RunTrace, TraceEntry, TraceKind, build_trace
from ._traceparent import parse_traceparent as parse_traceparent
from ._usage import ChildUsage, Family, Usage, run_duration
from ._usage import family_usage as family_usage
from ._usage import usage_by_run as usage_by_run

__all__ = [
    "BUILTIN_PATTERNS",
    "LIBRARIES",
    "SECRET_KEYS",
    "ChildUsage",
    "Diagnosis",
    "Family",
    "Finding",
    "FindingKind",
    "LibraryLevel",
    "Progress",
    "RedactingFilter",
    "Redactor",
    "RunTrace",
    "StepRole",
    "TraceEntry",
    "TraceKind",
    "Usage",
    "build_trace",
    "configure_logging",
    "export_trace",
    "model_of",
    "progress",
    "remove_logging",
    "run_duration",
    "serve_metrics",
    "step_role",
]

# For the floors above (see docs/architecture.md, "Layers"), never for users:
__internal__ = (
    "MetricsCollector",
    "Telemetry",
    "capture_from_environment",
    "child_traceparent",
    "diagnose",
    "exporter_from_environment",
    "family_usage",
    "fork_traceparent",
    "parse_traceparent",
    "usage_by_run",
)
