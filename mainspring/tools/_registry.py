"""``ToolRegistry``: the tools by name, and each agent's allowlist over them."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Iterator
from typing import Any

from .._errors import ConfigError, ToolNotAllowed, UnknownTool
from ..models import ToolSpec
from ._tool import Tool

__all__ = ["ToolRegistry"]


class ToolRegistry:
    """Tools by name. A name is registered once; an agent may use only its allowlist.

    Args:
        tools: tools to register at once.

    Raises:
        ConfigError: two different tools share a name.
    """

    def __init__(self, tools: Iterable[Tool[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool[..., Any]] = {}
        for t in tools:
            self.add(t)

    def add(self, tool: Tool[..., Any]) -> Tool[..., Any]:
        """Register ``tool`` (again registering the same tool is a no-op) and return it.

        Raises:
            ConfigError: another tool already has this name.
        """
        if not isinstance(tool, Tool):
            raise ConfigError(f"only tools can be registered (decorate it with @tool): {tool!r}")
        existing = self._tools.get(tool.name)
        if existing is not None and existing is not tool:
            raise ConfigError(
                f"two tools are named {tool.name!r} ({_where(existing)} and {_where(tool)}); "
                "pass name= to one of them"
            )
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool[..., Any] | None:
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool[..., Any]]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def resolve(self, name: str, allowed: Collection[str] | None = None) -> Tool[..., Any]:
        """The tool the model called, if this agent may use it.

        Args:
            name: the name in the model's tool call.
            allowed: this agent's allowlist; ``None`` allows every registered tool.

        Raises:
            UnknownTool: no tool has that name (the message lists those that exist).
            ToolNotAllowed: the tool exists but is not on ``allowed``.
        """
        found = self._tools.get(name)
        if found is None:
            usable = self.names if allowed is None else [n for n in self.names if n in allowed]
            close = difflib.get_close_matches(str(name), usable, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            listing = _listing(self.names)
            if allowed is not None:
                listing += f"; this agent may use: {_listing(usable)}"
            raise UnknownTool(f"no tool named {name!r}{hint} (tools that exist: {listing})")
        if allowed is not None and name not in allowed:
            raise ToolNotAllowed(
                f"tool {name!r} exists but is not on this agent's allowlist "
                f"(allowed: {_listing(sorted(n for n in allowed if n in self._tools))})"
            )
        return found

    def select(self, allowed: Collection[str] | None = None) -> list[Tool[..., Any]]:
        """The tools an agent may use, in registration order.

        Raises:
            ConfigError: the allowlist names a tool that is not registered.
        """
        if allowed is None:
            return list(self._tools.values())
        missing = sorted(set(allowed) - self._tools.keys())
        if missing:
            raise ConfigError(
                f"the allowlist names tools that are not registered: {missing} "
                f"(registered: {_listing(self.names)})"
            )
        return [t for t in self._tools.values() if t.name in allowed]

    def specs(self, allowed: Collection[str] | None = None) -> list[ToolSpec]:
        """What the model is told about the tools an agent may use."""
        return [t.spec() for t in self.select(allowed)]


def _listing(names: list[str], limit: int = 50) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _where(t: Tool[..., Any]) -> str:
    fn = t.fn
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
