"""Tools: functions a model may call, with schemas, effect classes and allowlists.

``@tool`` turns a function into a :class:`Tool`: its arguments' JSON schema comes from
the type hints and the docstring; its effect class (``read``, ``write``,
``irreversible``) decides its default timeout, whether a crash may re-run it and
whether a human approves each call. A :class:`ToolRegistry` maps names to tools and
enforces each agent's allowlist. A :class:`Toolset` offers tools known only when a
run starts: :class:`MCPToolset`, the tools of an MCP server.
"""

from ._arguments import describe_errors as describe_errors
from ._arguments import parse_arguments as parse_arguments
from ._context import Effect as Effect
from ._context import ToolContext as ToolContext
from ._context import ToolDeps as ToolDeps
from ._decorator import tool as tool
from ._mcp import IDEMPOTENCY_META_KEY, MCPTool, MCPToolError, effect_of
from ._mcp import MCPToolset as MCPToolset
from ._output import OutputSchema as OutputSchema
from ._registry import ToolRegistry
from ._tool import Tool, mark_step_effect, step_effect, tool_of
from ._tool import Validator as Validator
from ._toolset import ToolList, Toolset

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "MCPTool",
    "MCPToolError",
    "Tool",
    "ToolList",
    "ToolRegistry",
    "Toolset",
    "effect_of",
    "mark_step_effect",
    "step_effect",
    "tool_of",
]

# For the floors above (see docs/architecture.md, "Layers"), never for users:
__internal__ = (
    "Effect",
    "MCPToolset",
    "OutputSchema",
    "ToolContext",
    "ToolDeps",
    "Validator",
    "describe_errors",
    "parse_arguments",
    "tool",
)
