"""What stands in for a tool with an effect while the lab runs it: no real effect unless
``--live``. A stub is a function of the call's arguments that returns what the tool would
have (a value the user gives, or a placeholder that fits the tool's return annotation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .. import ConfigError, SerializationError
from ..serde import revive
from ..tools import Tool

__all__ = ["Stub", "lab_stubs", "stub_for"]

Stub = Callable[[dict[str, Any]], Any]

_STUB_NOTE = "[mainspring lab] {name} was not performed: a stub stood in (--live runs it)"


def lab_stubs(
    tools: Iterable[Tool[..., Any]], given: Mapping[str, Any] | None = None
) -> dict[str, Stub]:
    """What stands in for each ``write`` and ``irreversible`` tool of the target's App,
    so that the lab performs no real effect.

    ``given`` maps a tool's name to a value it returns, or to a function of the call's
    arguments that returns one. A tool with no stub given gets a placeholder that fits
    its return annotation (a note for ``str``, a dict for ``dict`` or ``Any``, ``[]``,
    ``None``, ``0``, ``True``...).

    Raises:
        ConfigError: a stub for an unknown or read-only tool, or a tool whose return
            type no placeholder fits (a TypedDict or model with required fields).
    """
    effects = {t.name: t for t in tools if t.effect != "read"}
    stubs: dict[str, Stub] = {}
    for name, value in (given or {}).items():
        if name not in effects:
            known = ", ".join(sorted(effects)) or "none"
            raise ConfigError(
                f"a stub for {name!r}, which is not a write or irreversible tool of the "
                f"target (those are: {known})"
            )
        stubs[name] = value if callable(value) else _constant(value)
    for name, t in effects.items():
        if name not in stubs:
            stubs[name] = stub_for(t)
    return stubs


def stub_for(t: Tool[..., Any]) -> Stub:
    """A placeholder stub for a tool, fitting its return annotation.

    Raises:
        ConfigError: no placeholder fits (a TypedDict or model with required fields).
    """
    placeholder = _placeholder(t)
    if placeholder is _NONE:
        raise ConfigError(
            f"the lab stubs {t.effect} tool {t.name!r} so that it performs no real effect, "
            f"and no placeholder fits its return type {t.schema.return_type!r}: give one "
            f"(CLI: --stub {t.name}='<JSON>'; Python: stubs={{{t.name!r}: value}}), or "
            "run it for real with --live"
        )
    return _constant(placeholder)


def _constant(value: Any) -> Callable[[dict[str, Any]], Any]:
    def stub(arguments: dict[str, Any]) -> Any:
        return value

    return stub


_NONE = object()


def _placeholder(t: Tool[..., Any]) -> Any:
    note = _STUB_NOTE.format(name=t.name)
    candidates: tuple[Any, ...] = (note, {"lab_stub": True, "note": note}, [], None, True, 0, {})
    for candidate in candidates:
        try:
            revive(candidate, t.schema.return_type)
        except SerializationError:
            continue
        return candidate
    return _NONE
