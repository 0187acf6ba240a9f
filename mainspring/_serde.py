"""JSON encoding of everything that goes into the journal. Never pickle.

Values are encoded with pydantic (dataclasses, pydantic models, datetimes, UUIDs,
enums, sets and tuples all work) and decoded either to plain JSON values or, when
the code declares a type (a step's return annotation, a workflow parameter), back
to that type. A value that cannot be encoded raises :class:`SerializationError`
naming what it was.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import pydantic_core
from pydantic import TypeAdapter, ValidationError

from ._errors import SerializationError

__all__ = ["decode", "dumps", "loads", "revive"]


def dumps(value: Any, *, what: str = "value") -> str:
    """Encode ``value`` as compact JSON text.

    Raises:
        SerializationError: the value (or something inside it) has no JSON form.
    """
    try:
        return pydantic_core.to_json(value).decode()
    except (pydantic_core.PydanticSerializationError, TypeError, ValueError) as exc:
        raise SerializationError(
            f"{what} of type {type(value).__name__} cannot be stored as JSON "
            f"(mainspring never pickles): {value!r:.200}; {exc}"
        ) from None


def loads(text: str | None) -> Any:
    """Decode JSON text to plain values (``None`` stays ``None``)."""
    if text is None:
        return None
    return json.loads(text)


@lru_cache(maxsize=1024)
def _adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


def revive(value: Any, tp: Any, *, what: str = "value") -> Any:
    """Turn a plain JSON value back into ``tp`` (a no-op for ``Any`` or no annotation)."""
    if tp is Any or tp is None or tp is type(None):
        return value
    try:
        return _adapter(tp).validate_python(value)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()[:3]
        )
        name = getattr(tp, "__name__", None) or repr(tp)
        raise SerializationError(
            f"{what}: {value!r:.200} is not a valid {name} ({problems})"
        ) from None
    except TypeError:  # an annotation pydantic cannot build a schema for: keep plain JSON
        return value


def decode(text: str | None, tp: Any = Any, *, what: str = "value") -> Any:
    """``loads`` then ``revive``."""
    return revive(loads(text), tp, what=what)
