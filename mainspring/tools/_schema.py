"""Argument schemas: a pydantic model built from a tool function's signature.

The model validates and coerces what the model sent; its JSON schema, cleaned of
pydantic's ``title`` clutter and with ``$defs`` inlined when nothing is recursive, is
what the model is told. Parameters become fields under internal names (``p0``,
``p1``, ...) with the parameter's name as the alias, so that any name works, even one
that would shadow a ``BaseModel`` attribute (``json``, ``copy``, ``schema``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, PydanticUserError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from .._errors import ConfigError
from ._context import ToolContext
from ._docstring import parse_docstring

__all__ = ["ArgumentSchema", "brief_signature", "build_schema"]

_CONFIG = ConfigDict(extra="forbid", protected_namespaces=())


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgumentSchema:
    """What a tool function's signature and docstring say about its arguments.

    Attributes:
        model: validates the arguments (fields under internal names, aliased).
        fields: ``(internal field, parameter name)`` pairs in signature order.
        context_param: the parameter that receives the :class:`ToolContext`, if any.
        json_schema: the clean JSON schema of the arguments.
        description: the docstring's description.
        return_type: the resolved return annotation (``Any`` when absent).
    """

    model: type[BaseModel]
    fields: tuple[tuple[str, str], ...]
    context_param: str | None
    json_schema: dict[str, Any]
    description: str
    return_type: Any


def build_schema(
    fn: Callable[..., Any], tool: str, localns: Mapping[str, Any] | None = None
) -> ArgumentSchema:
    """Build the argument schema of ``fn`` (a tool named ``tool``).

    Raises:
        ConfigError: a parameter cannot be part of a schema (``*args``, positional-only,
            a type with no JSON schema) or an annotation cannot be resolved.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"tool {tool!r}: cannot read the signature of {fn!r}: {exc}") from None
    hints = _resolve_hints(fn, tool, localns)
    description, arg_docs = parse_docstring(inspect.getdoc(fn))
    definitions: dict[str, Any] = {}
    fields: list[tuple[str, str]] = []
    context_param: str | None = None
    for param in signature.parameters.values():
        hint = hints.get(param.name, Any)
        if hint is ToolContext or get_origin(hint) is ToolContext:  # ToolContext[Deps]
            if context_param is not None:
                raise ConfigError(f"tool {tool!r} takes two ToolContext parameters")
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                raise ConfigError(f"tool {tool!r}: the ToolContext parameter must be keyword-only")
            context_param = param.name
            continue
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ConfigError(
                f"tool {tool!r}: parameter {param.name!r} is *args or **kwargs; a tool's "
                "arguments must be named parameters, each with a type hint"
            )
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ConfigError(
                f"tool {tool!r}: parameter {param.name!r} is positional-only; tools are "
                "called with keyword arguments"
            )
        internal = f"p{len(fields)}"
        definitions[internal] = _field(hint, param.default, param.name, arg_docs.get(param.name))
        fields.append((internal, param.name))
    try:
        model = create_model(f"{tool}_arguments", __config__=_CONFIG, **definitions)
        raw = model.model_json_schema()
    except (PydanticUserError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"tool {tool!r}: its arguments have no JSON schema (use JSON-like types: str, "
            f"int, float, bool, list, dict, Literal, enums, pydantic models, dataclasses): "
            f"{exc}"
        ) from None
    return ArgumentSchema(
        model=model,
        fields=tuple(fields),
        context_param=context_param,
        json_schema=clean_schema(raw),
        description=description,
        return_type=hints.get("return", Any),
    )


def _resolve_hints(
    fn: Callable[..., Any], tool: str, localns: Mapping[str, Any] | None
) -> dict[str, Any]:
    local = dict(localns or {})
    try:
        return get_type_hints(fn, localns=local, include_extras=True)
    except Exception:  # one bad annotation: resolve the others one by one below
        pass
    hints: dict[str, Any] = {}
    globalns = getattr(fn, "__globals__", {})
    for name, raw in getattr(fn, "__annotations__", {}).items():
        try:
            value = eval(raw, globalns, local) if isinstance(raw, str) else raw
        except Exception as exc:
            if name == "return":  # only used to revive replayed results: plain JSON will do
                continue
            raise ConfigError(
                f"tool {tool!r}: the annotation {raw!r} of parameter {name!r} cannot be "
                f"resolved ({type(exc).__name__}: {exc}); define or import it before the tool"
            ) from None
        hints[name] = value
    return hints


def _field(hint: Any, default: Any, name: str, doc: str | None) -> tuple[Any, FieldInfo]:
    described = _has_description(hint)
    kwargs: dict[str, Any] = {"alias": name}
    if isinstance(default, FieldInfo):  # `x: int = Field(3, ge=1)`: keep its constraints
        described = described or default.description is not None
        hint = Annotated[hint, default]
        if default.default_factory is not None:
            kwargs["default_factory"] = default.default_factory
        else:
            kwargs["default"] = default.default
    else:
        kwargs["default"] = PydanticUndefined if default is inspect.Parameter.empty else default
    if doc and not described:
        kwargs["description"] = doc
    return hint, Field(**kwargs)


def _has_description(hint: Any) -> bool:
    if get_origin(hint) is not Annotated:
        return False
    return any(isinstance(m, FieldInfo) and m.description for m in get_args(hint)[1:])


# -- cleaning ------------------------------------------------------------------------

_SUB_ONE = frozenset(
    {"items", "not", "additionalProperties", "if", "then", "else", "contains", "propertyNames"}
)
_SUB_LIST = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SUB_MAP = frozenset({"properties", "$defs", "definitions", "patternProperties"})
_REF = "#/$defs/"


class _Recursive(Exception):
    pass


def clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop ``title`` keywords and inline ``$defs`` (kept when a type is recursive)."""
    defs = schema.get("$defs")
    if isinstance(defs, dict):
        try:
            inlined: dict[str, Any] = _clean(schema, defs, frozenset())
            return inlined
        except _Recursive:
            pass
    cleaned: dict[str, Any] = _clean(schema, None, frozenset())
    return cleaned


def _clean(node: Any, defs: dict[str, Any] | None, seen: frozenset[str]) -> Any:
    if not isinstance(node, dict):
        return node  # `true`/`false` schemas
    out: dict[str, Any] = {}
    ref = node.get("$ref")
    inline = False
    if defs is not None and isinstance(ref, str) and ref.startswith(_REF):
        target = ref[len(_REF) :]
        if target in seen or target not in defs:
            raise _Recursive
        out.update(_clean(defs[target], defs, seen | {target}))
        inline = True
    for key, value in node.items():
        if key == "title" or (defs is not None and key in ("$defs", "discriminator")):
            continue  # the mapping of an OpenAPI discriminator points at dropped $defs
        if inline and key == "$ref":
            continue
        if key in _SUB_ONE:
            out[key] = _clean(value, defs, seen)
        elif key in _SUB_LIST and isinstance(value, list):
            out[key] = [_clean(v, defs, seen) for v in value]
        elif key in _SUB_MAP and isinstance(value, dict):
            out[key] = {k: _clean(v, defs, seen) for k, v in value.items()}
        else:
            out[key] = value
    return out


# -- a one-line summary for error messages ---------------------------------------------


def brief_signature(name: str, schema: Mapping[str, Any], *, limit: int = 600) -> str:
    """``send_email(to: string, cc: list[string] = [], urgency: "low"|"high" = "low")``."""
    props: Mapping[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", ()))
    parts = []
    for prop, sub in props.items():
        label = _label(sub, schema)
        if prop in required:
            parts.append(f"{prop}: {label}")
        elif isinstance(sub, dict) and "default" in sub:
            parts.append(f"{prop}: {label} = {_short(json.dumps(sub['default']), 40)}")
        else:
            parts.append(f"{prop}?: {label}")
    return _short(f"{name}({', '.join(parts)})", limit)


def _label(sub: Any, root: Mapping[str, Any], depth: int = 0) -> str:
    if not isinstance(sub, dict) or depth > 3:
        return "any"
    if "enum" in sub:
        return _short("|".join(json.dumps(v) for v in sub["enum"]), 80)
    if "const" in sub:
        return json.dumps(sub["const"])
    if "$ref" in sub:
        return str(sub["$ref"]).rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf"):
        if key in sub:
            labels = dict.fromkeys(_label(s, root, depth + 1) for s in sub[key])
            return "|".join(labels)
    kind = sub.get("type")
    if isinstance(kind, list):
        return "|".join(map(str, kind))
    if kind == "array":
        return f"list[{_label(sub.get('items'), root, depth + 1)}]"
    if isinstance(kind, str):
        return kind
    return "any"


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
