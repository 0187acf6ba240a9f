"""Seeing runs: step traces, secret redaction, Prometheus metrics, OpenTelemetry
export, and ``doctor``'s diagnosis by the failure table.

``App.trace(run_id)`` returns a :class:`RunTrace`; :class:`MetricsCollector` (the
``[metrics]`` extra) renders what ``/metrics`` serves; :func:`export_trace` (the
``[otel]`` extra) emits a run as GenAI-convention spans.
"""

from ._doctor import Diagnosis, Finding, FindingKind, Progress, diagnose, progress
from ._live import Telemetry, serve_metrics
from ._logs import (
    LIBRARIES,
    LibraryLevel,
    RedactingFilter,
    configure_logging,
    redact_log_text,
    remove_logging,
)
from ._metrics import LATENCY_BUCKETS, MetricsCollector, metrics_text
from ._names import StepRole, model_of, step_role
from ._otel import export_trace
from ._redact import BUILTIN_PATTERNS, SECRET_KEYS, Redactor
from ._setup import capture_from_environment, exporter_from_environment
from ._spans import child_traceparent, fork_traceparent
from ._trace import RunTrace, TraceEntry, TraceKind, build_trace, trace_entries
from ._traceparent import parse_traceparent
from ._usage import ChildUsage, Family, Usage, family_usage, run_duration, usage_by_run

__all__ = [
    "BUILTIN_PATTERNS",
    "LATENCY_BUCKETS",
    "LIBRARIES",
    "SECRET_KEYS",
    "ChildUsage",
    "Diagnosis",
    "Family",
    "Finding",
    "FindingKind",
    "LibraryLevel",
    "MetricsCollector",
    "Progress",
    "RedactingFilter",
    "Redactor",
    "RunTrace",
    "StepRole",
    "Telemetry",
    "TraceEntry",
    "TraceKind",
    "Usage",
    "build_trace",
    "capture_from_environment",
    "child_traceparent",
    "configure_logging",
    "diagnose",
    "export_trace",
    "exporter_from_environment",
    "family_usage",
    "fork_traceparent",
    "metrics_text",
    "model_of",
    "parse_traceparent",
    "progress",
    "redact_log_text",
    "remove_logging",
    "run_duration",
    "serve_metrics",
    "step_role",
    "trace_entries",
    "usage_by_run",
]
