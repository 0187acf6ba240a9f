"""MCP tool servers as an App declares them (``app.mcp``), and how ``app.agent``
tells toolsets from tools. A part of :class:`~mainspring.App`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import ConfigError
from ..tools import Effect, MCPToolset, Tool, Toolset

__all__ = ["MCPServers"]


class MCPServers:
    """Declaring MCP servers and giving their tools to agents."""

    def __init__(self) -> None:
        self._servers: dict[str, MCPToolset] = {}

    def mcp(
        self,
        name: str,
        *,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        prefix: str = "",
        allow: Sequence[str] | None = None,
        effects: Mapping[str, Effect] | None = None,
        idempotent: Sequence[str] = (),
        timeout_s: float | None = None,
        connect_timeout_s: float = 30.0,
        max_result_chars: int = 4000,
        trust_annotations: bool = False,
    ) -> MCPToolset:
        """Declare an MCP server whose tools agents may use: ``tools=[app.mcp(...)]``.

        Nothing is started here: each worker process connects on first use (a stdio
        server is started as a child process of the worker) and keeps the connection
        for every run; each session of a run lists the tools once, journaled (see
        ``docs/tools.md``). Needs the ``mcp`` extra.

        Args:
            name: the server's name in this App (journal step ``mcp:<name>:tools``).
            command: a stdio server: the program and its arguments.
            env / cwd: the stdio server's extra environment and working directory.
            url: a streamable HTTP server's endpoint (``http://host:port/mcp``).
            headers: HTTP headers for every request (an ``Authorization``, say).
            prefix: put before each tool's name (``"fs_"``: ``fs_read_file``).
            allow: the server's tool names the agents may call (default: all).
            effects: effect class per tool name, over anything else
                (``{"read_file": "read", "delete_file": "irreversible"}``).
            idempotent: tools to treat as ``idempotentHint`` (safe to send again
                with the same idempotency key).
            trust_annotations: believe the server's annotations (``readOnlyHint``,
                ``destructiveHint``, ``idempotentHint``) when choosing effect classes.
                Off by default: an untrusted server's tools are ``irreversible``, so
                a person approves each call, unless ``effects=`` says otherwise.
                Trust a server you wrote or vetted, never one that could lie.
            timeout_s: seconds per call (by effect 30, 60 or 120 by default).
            connect_timeout_s: seconds to start or reach the server and list its tools.
            max_result_chars: longest text of a result shown to the model.

        Raises:
            ConfigError: a bad argument, or another server already has ``name``.
        """
        if name in self._servers:
            raise ConfigError(f"an MCP server named {name!r} is already declared in this App")
        made = MCPToolset(
            name,
            command=command,
            env=env,
            cwd=cwd,
            url=url,
            headers=headers,
            prefix=prefix,
            allow=allow,
            effects=effects,
            idempotent=idempotent,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            max_result_chars=max_result_chars,
            trust_annotations=trust_annotations,
        )
        self._servers[name] = made
        return made

    @property
    def mcp_servers(self) -> dict[str, MCPToolset]:
        """The MCP servers declared with :meth:`mcp`, by name."""
        return dict(self._servers)

    async def close_mcp(self) -> None:
        """Close this process's MCP connections (stdio servers are stopped); the next
        call opens them again."""
        for server in self._servers.values():
            await server.aclose()

    def split_tools(
        self, agent: str, tools: Sequence[Tool[Any, Any] | Toolset]
    ) -> tuple[list[Tool[Any, Any]], tuple[Toolset, ...]]:
        """An agent's ``tools=``: its plain tools, and its toolsets.

        Raises:
            ConfigError: something that is neither, or one toolset twice.
        """
        plain = [t for t in tools if isinstance(t, Tool)]
        toolsets = tuple(t for t in tools if isinstance(t, Toolset))
        for other in tools:
            if not isinstance(other, Tool | Toolset):
                raise ConfigError(
                    f"agent {agent!r}: tools= takes tools (@app.tool) and toolsets "
                    f"(app.mcp(...)), got {other!r}"
                )
        names = [t.name for t in toolsets]
        if len(set(names)) != len(names):
            raise ConfigError(f"agent {agent!r}: a toolset is given twice in tools={names}")
        return plain, toolsets
