"""Rendering values and exceptions as text without ever failing.

User code can raise anything, including an exception whose ``__str__`` or
``__repr__`` raises (or returns a non-string). Every place that turns an
exception into text (journaled errors, ``StepFailed`` messages, logs, what a
model is told about a failed tool) goes through these helpers, so that the
rendering of an error can never replace the error itself.
"""

from __future__ import annotations

import traceback

__all__ = ["safe_repr", "safe_str", "safe_traceback"]


def safe_str(value: object) -> str:
    """``str(value)``, or a description of the value when ``str`` fails."""
    try:
        return str(value)  # a __str__ that returns no str raises TypeError here
    except BaseException as exc:  # any failure of user code
        return f"<{_type_name(value)} whose str() raised {_type_name(exc)}>"


def safe_repr(value: object) -> str:
    """``repr(value)``, or a description of the value when ``repr`` fails."""
    try:
        return repr(value)
    except BaseException as exc:  # any failure of user code
        return f"<{_type_name(value)} whose repr() raised {_type_name(exc)}>"


def safe_traceback(exc: BaseException, *, limit: int | None = None) -> str:
    """The formatted traceback of ``exc``; never raises."""
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=limit))
    except BaseException:  # a hostile __str__, __cause__ or frame
        return f"{_type_name(exc)}: {safe_str(exc)} (its traceback could not be formatted)\n"


def _type_name(value: object) -> str:
    cls = type(value)
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', '?')}"
