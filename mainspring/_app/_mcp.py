"""MCP tool servers as an App declares them: ``app.mcp``, a part of
:class:`~mainspring.App`. Their options are :class:`~mainspring.tools.MCPToolset`'s,
declared there once."""

from __future__ import annotations

from typing import Any

from .._errors import ConfigError
from ..tools import MCPToolset
from ._runtime import deprecated, takes_options_of

__all__ = ["MCPServers"]


class MCPServers:
    """``app.mcp``: declaring MCP servers whose tools agents may use
    (``tools=[app.mcp.add("fs", command=[...])]``) and closing this process's
    connections to them."""

    def __init__(self) -> None:
        self._servers: dict[str, MCPToolset] = {}

    @takes_options_of(MCPToolset)
    def add(self, *args: Any, **options: Any) -> MCPToolset:
        """Declare an MCP server whose tools agents may use:
        ``tools=[app.mcp.add("fs", command=["mcp-server-filesystem", "."])]``.

        Takes the arguments of :class:`~mainspring.tools.MCPToolset` (a stdio
        ``command`` or an HTTP ``url``, ``prefix``, ``allow``, ``effects``, timeouts,
        ``trust_annotations``...). Nothing is started here: each worker process
        connects on first use (a stdio server is started as a child process of the
        worker) and keeps the connection for every run; each session of a run lists
        the tools once, journaled (see ``docs/tools.md``). Needs the ``mcp`` extra.

        Raises:
            ConfigError: a bad argument, or another server already has the name.
        """
        made = MCPToolset(*args, **options)
        if made.name in self._servers:
            raise ConfigError(f"an MCP server named {made.name!r} is already declared in this App")
        self._servers[made.name] = made
        return made

    def __call__(self, *args: Any, **options: Any) -> MCPToolset:
        """Deprecated: ``app.mcp(...)`` is ``app.mcp.add(...)``."""
        deprecated("app.mcp(...) is deprecated: use app.mcp.add(...)")
        return self.add(*args, **options)

    @property
    def servers(self) -> dict[str, MCPToolset]:
        """The MCP servers declared with :meth:`add`, by name."""
        return dict(self._servers)

    async def close(self) -> None:
        """Close this process's MCP connections (stdio servers are stopped); the next
        call opens them again."""
        for server in self._servers.values():
            await server.aclose()
