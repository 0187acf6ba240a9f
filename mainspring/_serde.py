"""JSON encoding of everything that goes into the journal. Never pickle.

Values are encoded with pydantic (dataclasses, pydantic models, datetimes, UUIDs,
enums, sets and tuples all work) and decoded either to plain JSON values or, when
the code declares a type (a step's return annotation, a workflow parameter), back
to that type. A value that cannot be encoded raises :class:`SerializationError`
naming what it was.
"""

from __future__ import annotations

import functools
import json
import operator
import types
import typing
from functools import lru_cache
from typing import Any

import pydantic_core
import typing_extensions
from pydantic import PydanticUserError, TypeAdapter, ValidationError

from ._errors import SerializationError

__all__ = ["decode", "dumps", "loads", "return_type_problem", "revive", "type_adapter"]


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
def _adapter(tp: Any) -> TypeAdapter[Any] | Exception:
    """The adapter for ``tp``, or why pydantic cannot build one (cached either way)."""
    try:
        return TypeAdapter(tp)
    except PydanticUserError as exc:
        if exc.code != "typed-dict-version":
            return exc
    except Exception as exc:  # an unresolvable forward reference and the like
        return exc
    # Python < 3.12: pydantic refuses typing.TypedDict; the same fields declared with
    # typing_extensions.TypedDict are what it asks for.
    try:
        return TypeAdapter(_compatible(tp))
    except Exception as exc:
        return exc


def type_adapter(tp: Any) -> TypeAdapter[Any]:
    """pydantic's adapter for ``tp``, built once (a stdlib ``TypedDict`` works on every
    Python).

    Raises:
        TypeError: pydantic cannot build one; says why.
    """
    adapter = _adapter(tp)
    if isinstance(adapter, TypeAdapter):
        return adapter
    raise TypeError(f"{type(adapter).__name__}: {str(adapter).splitlines()[0]}")


def return_type_problem(tp: Any) -> str | None:
    """Why a value annotated ``tp`` would come back from the journal as plain JSON
    instead of a ``tp`` (None when it is revived as declared)."""
    if tp is Any or tp is None or tp is type(None):
        return None
    adapter = _adapter(tp)
    if isinstance(adapter, TypeAdapter):
        return None
    return f"{type(adapter).__name__}: {str(adapter).splitlines()[0]}"


def revive(value: Any, tp: Any, *, what: str = "value") -> Any:
    """Turn a plain JSON value back into ``tp`` (a no-op for ``Any`` or no annotation).

    An annotation pydantic cannot build a schema for (an arbitrary class) gives the plain
    JSON value back: the value was stored, only its type is not rebuilt.
    """
    if tp is Any or tp is None or tp is type(None):
        return value
    adapter = _adapter(tp)
    if not isinstance(adapter, TypeAdapter):
        return value
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()[:3]
        )
        name = getattr(tp, "__name__", None) or repr(tp)
        raise SerializationError(
            f"{what}: {value!r:.200} is not a valid {name} ({problems})"
        ) from None


def decode(text: str | None, tp: Any = Any, *, what: str = "value") -> Any:
    """``loads`` then ``revive``."""
    return revive(loads(text), tp, what=what)


_TYPED_DICTS: dict[Any, Any] = {}


def _compatible(tp: Any) -> Any:
    """``tp`` with every stdlib ``typing.TypedDict`` in it (nested in lists, unions,
    ``Annotated``, other TypedDicts...) redeclared as a ``typing_extensions.TypedDict``."""
    if typing.is_typeddict(tp):
        if type(tp).__module__ == "typing_extensions":  # already what pydantic asks for
            return tp
        if tp not in _TYPED_DICTS:
            hints = typing.get_type_hints(tp, include_extras=True)
            fields = {}
            for name, hint in hints.items():
                # Required/NotRequired are already folded into the key sets: state each.
                while typing.get_origin(hint) in (typing.Required, typing.NotRequired):
                    hint = typing.get_args(hint)[0]
                wrap = typing.Required if name in tp.__required_keys__ else typing.NotRequired
                fields[name] = wrap[_compatible(hint)]
            _TYPED_DICTS[tp] = typing_extensions.TypedDict(tp.__name__, fields)  # type: ignore[operator]
        return _TYPED_DICTS[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is None or not args or origin is typing.Literal:
        return tp
    if origin is typing.Annotated:
        return typing.Annotated[(_compatible(args[0]), *tp.__metadata__)]
    new = tuple(_compatible(a) if a is not Ellipsis else a for a in args)
    if new == args:
        return tp
    if origin in (types.UnionType, typing.Union):
        return functools.reduce(operator.or_, new)
    generic: Any = origin
    return generic[new] if isinstance(origin, type) else tp.copy_with(new)
