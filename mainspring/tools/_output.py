"""The schema of an agent's final answer, checked like a tool's arguments.

``app.agent(..., output_type=Report)`` makes the ``finish`` tool take ``Report``'s
fields as its arguments. A type whose JSON schema is not an object with fields (``int``,
``list[str]``, a union) goes under one argument, ``answer``. What the model sends is
validated with pydantic; what is wrong comes back to it as a repair message naming
each field, worded like a tool's argument errors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from .._errors import ConfigError, ToolInputError
from .._serde import type_adapter
from ..models import ToolSpec
from ._arguments import describe_errors, parse_arguments
from ._schema import brief_signature, clean_schema

__all__ = ["OutputSchema"]

_WRAP = "answer"  # the one argument of a type with no fields of its own


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputSchema:
    """An output type, its ``finish`` tool and its validation.

    Attributes:
        type: the output type (a pydantic model, a dataclass, a ``TypedDict``, or any
            type pydantic's ``TypeAdapter`` accepts, such as ``list[str]``).
        name: the type's name, as errors quote it.
        wrapped: the answer goes under ``finish``'s one argument ``answer``.
        spec: the ``finish`` tool the model is given.
    """

    type: Any
    name: str
    wrapped: bool
    spec: ToolSpec
    adapter: TypeAdapter[Any]

    @classmethod
    def of(cls, tp: Any, *, agent: str) -> OutputSchema:
        """The schema of ``tp``, the output type of ``agent``.

        Raises:
            ConfigError: pydantic cannot validate ``tp`` or give it a JSON schema.
        """
        name = getattr(tp, "__name__", None) or repr(tp)
        try:
            adapter = type_adapter(tp)
            schema = clean_schema(adapter.json_schema())
        except Exception as exc:
            raise ConfigError(
                f"agent {agent!r}: output_type={tp!r} has no JSON schema (use a pydantic "
                f"model, a dataclass, a TypedDict or a JSON-like type such as list[str]): "
                f"{exc}"
            ) from None
        wrapped = schema.get("type") != "object" or "properties" not in schema
        doc = schema.pop("description", None) if not wrapped else None
        if wrapped:
            parameters = {
                "type": "object",
                "properties": {_WRAP: schema},
                "required": [_WRAP],
            }
        else:
            parameters = schema
        description = (
            f"Finish the task and give the final answer: a {name}"
            + (f" ({doc})" if doc else "")
            + (f", as the argument {_WRAP!r}" if wrapped else ", one argument per field")
            + ". Call it only when the task is complete; the answer is checked before it "
            "is accepted."
        )
        spec = ToolSpec(name="finish", description=description, parameters=parameters)
        return cls(type=tp, name=name, wrapped=wrapped, spec=spec, adapter=adapter)

    @property
    def expected(self) -> str:
        """The one-line signature of ``finish``, shown in repair messages."""
        return brief_signature("finish", self.spec.parameters)

    def from_arguments(self, raw: str) -> Any:
        """The answer in the arguments of a ``finish`` call, validated.

        Raises:
            ToolInputError: the arguments are not a valid answer; names each field.
        """
        arguments = parse_arguments(raw, tool="finish", expected=self.expected)
        if self.wrapped:
            if _WRAP not in arguments:
                raise ToolInputError(
                    f"finish: argument {_WRAP!r} is required\nExpected: {self.expected}"
                )
            return self._validate(arguments[_WRAP], prefix=(_WRAP,))
        try:
            return self._validate(arguments, prefix=())
        except ToolInputError:
            # The untyped finish's habit, {"answer": {...fields}}: accept what it holds.
            inner = arguments.get(_WRAP)
            if len(arguments) == 1 and isinstance(inner, dict):
                try:
                    return self._validate(inner, prefix=())
                except ToolInputError:
                    pass
            raise

    def from_text(self, text: str) -> Any:
        """The answer written as text instead of a ``finish`` call, validated: JSON
        (bare, fenced or in prose), or for a wrapped type the text itself (a ``str``).

        Raises:
            ToolInputError: it is not a valid answer; says what to send instead.
        """
        if not self.wrapped:
            return self.from_arguments(text)
        try:
            value: Any = json.loads(text)
        except (ValueError, RecursionError):
            return self._validate(text, prefix=(_WRAP,))
        try:
            return self._validate(value, prefix=(_WRAP,))
        except ToolInputError:
            if isinstance(value, str):
                raise
            try:  # "42" is a valid str too
                return self._validate(text, prefix=(_WRAP,))
            except ToolInputError:
                pass
            raise

    def _validate(self, value: Any, *, prefix: tuple[str, ...]) -> Any:
        try:
            return self.adapter.validate_python(value)
        except ValidationError as exc:
            errors: list[ErrorDetails] = [
                {**e, "loc": (*prefix, *e["loc"])} for e in exc.errors(include_url=False)
            ]
            problems = "; ".join(describe_errors(errors))
            raise ToolInputError(
                f"finish: the answer is not a valid {self.name}: {problems}\n"
                f"Expected: {self.expected}"
            ) from None
