"""MCP tool calls carry their step's idempotency key to the server.

Every call of an MCP server's tool is a journaled step like any tool call (see
``_tools``): once it completed it is never sent again. A call that a crash interrupted
is sent again by the recovering worker; with :func:`forward_idempotency_key` as the
``MCPToolset``'s ``process_tool_call``, both sends carry the same key in the request's
``_meta`` (``mainspring/idempotency_key``, as mainspring's own MCP client sends it), so
a server that deduplicates by it applies the effect once.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.tools import RunContext as PaiContext

from mainspring import current_step
from mainspring.tools import IDEMPOTENCY_META_KEY

__all__ = ["forward_idempotency_key"]


async def forward_idempotency_key(
    ctx: PaiContext[Any], call_tool: Any, name: str, tool_args: dict[str, Any]
) -> Any:
    """A ``process_tool_call`` for Pydantic AI's ``MCPToolset``: sends the call with
    ``_meta`` ``{"mainspring/idempotency_key": KEY, "mainspring/attempt": N}``, the
    key of the step the call runs in (outside a durable run: sends it unchanged)::

        MCPToolset("server.py", process_tool_call=forward_idempotency_key)
    """
    try:
        step = current_step()
    except RuntimeError:
        return await call_tool(name, tool_args)
    meta = {IDEMPOTENCY_META_KEY: step.idempotency_key, "mainspring/attempt": step.attempt}
    return await call_tool(name, tool_args, metadata=meta)
