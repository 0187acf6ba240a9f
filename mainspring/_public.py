"""What of a run's error may be shown beyond its operators.

A failed step's error keeps a Python traceback (server paths, source lines) for the
people who run the server: the CLI and ``admin`` keys. Everywhere else (``read``
keys, the dashboard of a non-admin, event streams, webhooks) the error is its type
and one-line message.
"""

from __future__ import annotations

from typing import Any

__all__ = ["public_error"]


def public_error(error: Any) -> Any:
    """``error`` (a decoded error object) without its traceback."""
    if isinstance(error, dict) and "traceback" in error:
        return {k: v for k, v in error.items() if k != "traceback"}
    return error
