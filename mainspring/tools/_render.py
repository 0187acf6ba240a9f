"""What a tool's result or failure looks like in the model's context: short text."""

from __future__ import annotations

import re
from typing import Any

from .._describe import safe_str
from .._errors import MainspringError, SerializationError, StepFailed
from .._serde import dumps

__all__ = ["render_error", "render_result", "truncate"]

_STEP_FAILED = re.compile(r"^step .*? failed after \d+ attempt\(s\): ")
_WHERE = re.compile(r" \(run \S+(?:, step .*)?\)$")  # MainspringError.__str__'s suffix
_MAX_ERROR_CHARS = 1000


def render_result(value: Any, *, limit: int) -> str:
    """``value`` as compact JSON (a string as itself), at most ``limit`` characters."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = dumps(value, what="tool result")
        except SerializationError:
            text = repr(value)
    return truncate(text, limit)


def truncate(text: str, limit: int) -> str:
    """Cut ``text`` to at most ``limit`` characters, ending with a marker that says
    how much was cut: ``…[truncated 9,999,000 of 10,000,000 chars]``."""
    total = len(text)
    if total <= limit:
        return text
    keep = limit
    for _ in range(3):  # the marker's length depends on the numbers in it
        marker = f"…[truncated {total - keep:,} of {total:,} chars]"
        keep = max(0, limit - len(marker))
    marker = f"…[truncated {total - keep:,} of {total:,} chars]"
    return text[:keep] + marker


def render_error(exc: BaseException) -> str:
    """``"ValueError: no such ticket 42"``: the error's type and message, short.

    A :class:`StepFailed` (what a workflow sees when a journaled tool failed) is shown
    as the tool's own error, so the model reads the same text on the first run and on
    replay, where the original exception no longer exists.
    """
    if isinstance(exc, StepFailed):
        kind = exc.error_type.rsplit(".", 1)[-1]
        message = _WHERE.sub("", _STEP_FAILED.sub("", exc.message))
        prefix = f"{kind}: "
        if message.startswith(prefix):
            message = message[len(prefix) :]
        if kind.endswith("StepTimeout"):
            message = f"the tool ran past its time limit ({message})"
    else:
        kind = type(exc).__name__
        message = exc.message if isinstance(exc, MainspringError) else safe_str(exc)
    text = f"{kind}: {message}" if message else kind
    return truncate(text, _MAX_ERROR_CHARS)
