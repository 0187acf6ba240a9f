"""Reading what a model sent as a tool's arguments, and saying what was wrong with it.

Models wrap JSON in markdown fences, put prose around it, send ``""`` for a call with
no arguments, or encode the object twice. All of that is accepted. What cannot be
read, or does not match the schema, raises :class:`ToolInputError` with a message
written for the model to fix its call: each problem named, then the expected call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from .._errors import ToolInputError

__all__ = ["describe_errors", "parse_arguments", "validate_arguments"]

_FENCE = re.compile(r"```[ \t]*(?:json5?|JSON)?[ \t]*\r?\n?(.*?)```", re.DOTALL)
_MAX_PROBLEMS = 10
_MAX_SCAN = 64  # `{` positions tried in prose, so hostile text stays cheap to reject


def parse_arguments(
    raw: str | Mapping[str, Any] | None, *, tool: str, expected: str
) -> dict[str, Any]:
    """Read a tool call's arguments: a mapping as is, or JSON text, tolerantly.

    Raises:
        ToolInputError: no JSON object can be found; the message says why and shows
            ``expected`` (the tool's brief signature).
    """
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, str):
        raise ToolInputError(
            f"{tool}: arguments must be a JSON object, got {type(raw).__name__} "
            f"{_show(raw)}\nExpected: {expected}"
        )
    text = raw.strip()
    if not text:
        return {}
    value, error = _decode(text)
    if isinstance(value, str):  # encoded twice: '"{\\"a\\": 1}"'
        value, error = _decode(value.strip()) if value.strip() else ({}, None)
    if error is not None:
        raise ToolInputError(
            f"{tool}: arguments are not valid JSON ({error}) in {_show(text, 120)}; send "
            f"one JSON object with the arguments\nExpected: {expected}"
        )
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ToolInputError(
            f"{tool}: arguments must be a JSON object with one key per argument, got a "
            f"JSON {_json_kind(value)} {_show(value)}\nExpected: {expected}"
        )
    bad = _unencodable(value)
    if bad is not None:
        raise ToolInputError(
            f"{tool}: argument {bad!r} holds text that is not valid Unicode (an unpaired "
            f"surrogate escape such as \\ud83d); send whole characters\nExpected: {expected}"
        )
    return value


def _unencodable(value: Any, path: str = "") -> str | None:
    """The path of the first string that cannot be encoded as UTF-8 (half an emoji
    escaped as a lone surrogate), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "value"
        return None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _unencodable(key, path) if isinstance(key, str) else None
        found = found or _unencodable(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def _decode(text: str) -> tuple[Any, str | None]:
    """``(value, None)`` or ``(None, why not)``: the whole text, then fenced blocks,
    then the first ``{...}`` that parses inside prose."""
    try:
        return json.loads(text, strict=False), None
    except json.JSONDecodeError as exc:
        first = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return None, "nested too deeply"
    for block in _FENCE.findall(text):
        try:
            return json.loads(block.strip(), strict=False), None
        except (json.JSONDecodeError, RecursionError):
            continue
    decoder = json.JSONDecoder(strict=False)
    start = text.find("{")
    for _ in range(_MAX_SCAN):
        if start < 0:
            break
        try:
            value, _end = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            return value, None
        start = text.find("{", start + 1)
    return None, first


def validate_arguments(
    model: type[BaseModel],
    fields: Sequence[tuple[str, str]],
    args: Mapping[str, Any],
    *,
    tool: str,
    expected: str,
) -> dict[str, Any]:
    """Validate and coerce ``args`` against ``model``; keys are parameter names.

    Raises:
        ToolInputError: one message listing every problem, then the expected call.
    """
    if not isinstance(args, Mapping):
        raise ToolInputError(
            f"{tool}: arguments must be a JSON object, got {type(args).__name__} "
            f"{_show(args)}\nExpected: {expected}"
        )
    try:
        validated = model.model_validate(dict(args))
    except ValidationError as exc:
        problems = describe_errors(exc.errors())
        raise ToolInputError(f"{tool}: {'; '.join(problems)}\nExpected: {expected}") from None
    return {param: getattr(validated, internal) for internal, param in fields}


# -- messages ------------------------------------------------------------------------------

_MUST_BE = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer (no fractional part)",
    "float_type": "a number",
    "float_parsing": "a number",
    "decimal_type": "a number",
    "decimal_parsing": "a number",
    "bool_type": "a boolean (true or false)",
    "bool_parsing": "a boolean (true or false)",
    "string_type": "a string",
    "list_type": "a list (JSON array)",
    "tuple_type": "a list (JSON array)",
    "set_type": "a list (JSON array)",
    "frozen_set_type": "a list (JSON array)",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "dataclass_type": "an object",
    "dataclass_exact_type": "an object",
    "none_required": "null",
    "date_type": "a date (YYYY-MM-DD)",
    "date_parsing": "a date (YYYY-MM-DD)",
    "date_from_datetime_parsing": "a date (YYYY-MM-DD)",
    "datetime_type": "a date-time (ISO 8601)",
    "datetime_parsing": "a date-time (ISO 8601)",
    "datetime_from_date_parsing": "a date-time (ISO 8601)",
    "uuid_type": "a UUID",
    "uuid_parsing": "a UUID",
}
_SHOULD = re.compile(r"^(?:Input|Value|String|List|Dictionary|Tuple|Set|Data|Object) should ")
# Union branches add a tag to the error location ('int', 'list[str]', 'function-after[…]').
_TAGS = frozenset(
    {"int", "str", "float", "bool", "none", "bytes", "list", "dict", "tuple", "set", "frozenset"}
)


def describe_errors(errors: Sequence[ErrorDetails]) -> list[str]:
    """Phrase pydantic's errors for a model: ``argument 'to' is required``,
    ``argument 'count' must be an integer (got 'three')``, ``unexpected argument 'cc'``."""
    by_path: dict[str, list[tuple[str, str]]] = {}
    for err in errors:
        path = _path(err["loc"])
        phrase, got = _phrase(err, nested="." in path or "[" in path)
        entry = by_path.setdefault(path, [])
        if (phrase, got) not in entry:
            entry.append((phrase, got))
    problems = []
    for path, entries in by_path.items():
        if entries[0][0].startswith("unexpected"):
            problems.append(entries[0][0].format(path=path))
            continue
        phrases = [p for p, _ in entries]
        if len(phrases) > 1 and all(p.startswith("must be ") for p in phrases):
            phrases = ["must be " + " or ".join(p[len("must be ") :] for p in phrases)]
        problems.append(f"argument {path!r} {', or '.join(phrases)}{entries[0][1]}")
    if len(problems) > _MAX_PROBLEMS:
        extra = len(problems) - _MAX_PROBLEMS
        problems = [*problems[:_MAX_PROBLEMS], f"and {extra} more problem(s)"]
    return problems or ["the arguments are invalid"]


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i > 0 and (part in _TAGS or any(c in part for c in "[]-'\" ")):
            continue
        else:
            out += f".{part}" if out else part
    return out or "arguments"


def _phrase(err: ErrorDetails, *, nested: bool) -> tuple[str, str]:
    kind = err["type"]
    got = f" (got {_show(err.get('input'))})"
    if kind == "missing":
        return "is required", ""
    if kind == "extra_forbidden":
        return ("unexpected field {path!r}" if nested else "unexpected argument {path!r}"), ""
    if kind in _MUST_BE:
        return f"must be {_MUST_BE[kind]}", got
    ctx = err.get("ctx") or {}
    if kind in ("literal_error", "enum") and "expected" in ctx:
        return f"must be one of {ctx['expected']}", got
    msg = err["msg"]
    if msg.startswith(("Value error, ", "Assertion failed, ")):
        return f"is invalid: {msg.split(', ', 1)[1]}", got
    return _SHOULD.sub("must ", msg), got


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
