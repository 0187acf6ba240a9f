"""``Toolset``: tools that an agent learns at run time (from an MCP server, say)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._tool import Tool

if TYPE_CHECKING:
    from ..journal import RunContext

__all__ = ["ToolList", "Toolset"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolList:
    """What a toolset offers one session of a run.

    Attributes:
        tools: every tool it has (a model calling one not in ``allowed`` is refused
            like any tool off the agent's allowlist).
        allowed: the names the agent may call and the model is told about.
    """

    tools: tuple[Tool[..., Any], ...]
    allowed: tuple[str, ...]


class Toolset(ABC):
    """A source of tools known only when a run starts: give it to
    ``app.agent(..., tools=[...])`` beside plain tools.

    The agent asks it once per session of each run, with :meth:`list_tools`, which
    must be deterministic on replay (journal what it learns from outside, as a step).
    """

    name: str

    @abstractmethod
    async def list_tools(self, ctx: RunContext) -> ToolList:
        """The tools this session of the run may use."""
