"""The ``@tool`` decorator."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, Unpack, overload

from ._tool import Tool, ToolOptions

__all__ = ["tool"]

P = ParamSpec("P")
R = TypeVar("R")

# Frames of these modules are plumbing between the user's decorator and us: the types a
# tool's annotations name are looked up in the first frame outside them.
_PLUMBING = ("mainspring.tools.", "mainspring._app")


@overload
def tool(fn: Callable[P, R], /) -> Tool[P, R]: ...


@overload
def tool(
    fn: None = None, /, **options: Unpack[ToolOptions]
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None, /, **options: Unpack[ToolOptions]
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Make a function (sync or async) a tool a model can call.

    Use as ``@tool`` or ``@tool(effect="write", ...)``. The arguments' JSON schema
    comes from the type hints; the description from the docstring's prose and each
    argument's from its ``Args:`` entry. A keyword-only parameter annotated
    :class:`ToolContext` receives the call's context and is not part of the schema.

    Args:
        fn: the function (when used as ``@tool`` without parentheses).
        name: the name the model uses; the function's name by default.
        description: overrides the docstring's description.
        effect: ``"read"`` (safe to repeat), ``"write"`` (repeatable with the
            idempotency key) or ``"irreversible"``.
        timeout_s: seconds per attempt; 30 / 60 / 120 by effect.
        retry: the retry policy of its steps; the App's default when ``None``.
        requires_approval: a human approves each call; ``True`` by default only for
            ``irreversible`` tools.
        validators: rules each result must pass (raise :class:`ValidationFailed` or
            return an error string).
        max_result_chars: longest text of a result shown to the model.

    Raises:
        ConfigError: a bad name (``^[a-zA-Z0-9_-]{1,64}$``), effect, timeout or limit,
            or arguments that have no JSON schema.
    """

    def decorate(f: Callable[P, R]) -> Tool[P, R]:
        return Tool.from_function(f, localns=_caller_locals(), **options)

    return decorate(fn) if fn is not None else decorate


def _caller_locals() -> dict[str, Any]:
    """The locals of the code that applies the decorator (so that a tool defined in a
    function may use types defined in that function)."""
    frame = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith(_PLUMBING):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None or frame.f_locals is frame.f_globals:
        return {}
    return dict(frame.f_locals)
