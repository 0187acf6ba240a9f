"""The W3C Trace Context ``traceparent`` header (https://www.w3.org/TR/trace-context/):
parsed without OpenTelemetry, so a server without the ``otel`` extra still keeps it."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["TraceParent", "parse_traceparent"]

# version-trace_id-parent_id-flags, lowercase hex. A later version may append fields
# after a "-": those are ignored, as the specification asks.
_FORMAT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A caller's span: the parent of a run's root span."""

    trace_id: int
    span_id: int
    flags: int


def parse_traceparent(text: str | None) -> TraceParent | None:
    """``text`` as a W3C ``traceparent``, or ``None`` when absent or not valid (the
    specification says to ignore a malformed header and start a new trace, rather than
    refuse the request)."""
    if not text:
        return None
    match = _FORMAT.fullmatch(text.strip())
    if match is None:
        return None
    version, trace, span, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None  # ff is forbidden; version 00 has exactly four fields
    trace_id, span_id = int(trace, 16), int(span, 16)
    if trace_id == 0 or span_id == 0:
        return None  # all-zero ids are invalid
    return TraceParent(trace_id=trace_id, span_id=span_id, flags=int(flags, 16))
