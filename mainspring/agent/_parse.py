"""Tolerant parsing of actions from text-mode replies.

Some models (or endpoints without native tool calling) answer with an action as
JSON in their text: bare, inside a markdown fence, or with prose around it. Each
of these is still an action.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any

from ..models import ToolCall

__all__ = ["action_from_text"]

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n(.*?)```", re.S)
_NAME_KEYS = ("tool", "name", "action", "function")
_ARG_KEYS = ("arguments", "args", "input", "parameters")


def action_from_text(text: str, call_id: str, tools: Collection[str]) -> ToolCall | None:
    """The call of one of ``tools`` that a text reply holds, or ``None``.

    JSON naming anything else is data (an answer that happens to be JSON), not an action.
    """
    for candidate in _candidates(text):
        try:
            data = json.loads(candidate)
        except (ValueError, RecursionError):
            continue
        call = _as_call(data, call_id)
        if call is not None and call.name in tools:
            return call
    return None


def _candidates(text: str) -> list[str]:
    found = [m.group(1).strip() for m in _FENCE.finditer(text)]
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start:
        found.append(text[start : end + 1])
    return found


def _as_call(data: Any, call_id: str) -> ToolCall | None:
    if not isinstance(data, dict):
        return None
    name = next((data[k] for k in _NAME_KEYS if isinstance(data.get(k), str)), None)
    if name is None:
        return None
    args: Any = next((data[k] for k in _ARG_KEYS if k in data), {})
    arguments = args if isinstance(args, str) else json.dumps(args)
    return ToolCall(id=call_id, name=name, arguments=arguments)
