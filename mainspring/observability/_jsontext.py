"""Reading the JSON columns of journal rows for people, who must see every row.

A row's output, error or arguments are JSON as a step journaled them, but a capped
value no longer parses and an older or foreign row may hold plain text: the readers
that explain a run (trace, doctor, captured content) show such a value as the text it
is rather than fail on it.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_or_text"]


def json_or_text(text: str | None) -> Any:
    """``text`` decoded as JSON, else ``text`` itself (``None`` stays ``None``)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
