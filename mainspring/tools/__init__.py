"""Tools: functions a model may call, with schemas, effect classes and allowlists.

``@tool`` turns a function into a :class:`Tool`: its arguments' JSON schema comes from
the type hints and the docstring; its effect class (``read``, ``write``,
``irreversible``) decides its default timeout, whether a crash may re-run it and
whether a human approves each call. A :class:`ToolRegistry` maps names to tools and
enforces each agent's allowlist. A :class:`Toolset` offers tools known only when a
run starts: :class:`MCPToolset`, the tools of an MCP server.
"""

from ._arguments import describe_errors, parse_arguments
from ._context import Effect, ToolContext, ToolDeps
from ._decorator import tool
from ._mcp import IDEMPOTENCY_META_KEY, MCPTool, MCPToolError, MCPToolset, effect_of
from ._output import OutputSchema
from ._registry import ToolRegistry
from ._tool import Tool, Validator, mark_step_effect, step_effect, tool_of
from ._toolset import ToolList, Toolset

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "Effect",
    "MCPTool",
    "MCPToolError",
    "MCPToolset",
    "OutputSchema",
    "Tool",
    "ToolContext",
    "ToolDeps",
    "ToolList",
    "ToolRegistry",
    "Toolset",
    "Validator",
    "describe_errors",
    "effect_of",
    "mark_step_effect",
    "parse_arguments",
    "step_effect",
    "tool",
    "tool_of",
]
