"""MCP tool servers as a :class:`Toolset` (``app.mcp.add(...)``), on the ``mcp`` SDK.

What the agent gets, and the choices behind it:

* **Listing.** Each session of a run lists the server's tools once, as a journaled
  step (``mcp:<server>:tools``): a replay sees the same tools, schemas and effect
  classes whatever the server says now.
* **Effects.** Annotations are the server's claims, and a server can claim anything
  (a tool that moves money can say ``readOnlyHint``). So they count only for a server
  the app trusts (``trust_annotations=True``); an untrusted server's tools (the
  default) are all ``irreversible``: a person approves each call, unless ``effects=``
  says otherwise per tool. A trusted server's hints are read as MCP defines them,
  absent ones with MCP's defaults: ``readOnlyHint`` → ``read``; otherwise
  ``destructiveHint`` (true unless the server says ``false``) → ``irreversible``,
  ``false`` → ``write``. Contradictory hints (read-only *and* destructive) and values
  that are not booleans take the most dangerous reading.
* **Modes.** ``read`` tools and ``write`` tools marked ``idempotentHint`` by a trusted
  server (or listed in ``idempotent=``) run ``at_least_once``: a call whose answer was
  lost (the server died, a timeout) is sent again with the same idempotency key, in
  the call's ``_meta`` as ``mainspring/idempotency_key``. Other ``write`` tools and
  ``irreversible`` ones run ``at_most_once``: a call whose answer was lost is an
  unknown outcome (:class:`StepInterrupted`, told to the model), never sent again.
  A call that was never sent (the server could not start) is retried in every mode.
* **Connections.** Opened lazily, once per worker process and event loop, never
  journaled, shared by every call; a server that died is started again on the next
  call. Before an ``at_most_once`` call the server is pinged, so that one that died
  between calls is restarted while nothing is sent.
* **Drift.** A call checks the live server still has the tool with the input schema
  the run listed; if not, the call fails with a :class:`ConfigError` naming server
  and tool (the model is told; nothing is sent).
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, create_model

from .._errors import ConfigError, MainspringError, StepInterrupted, ToolInputError, TransientError
from ..journal import RetryPolicy, StepMode
from ._context import DEFAULT_TIMEOUT_S, EFFECTS, Effect
from ._schema import ArgumentSchema, clean_schema
from ._tool import _TOOL_OF_STEP, NAME_PATTERN, Tool
from ._toolset import ToolList, Toolset

if TYPE_CHECKING:
    from ..journal import RunContext
    from ._mcp_client import Connection

__all__ = ["IDEMPOTENCY_META_KEY", "MCPTool", "MCPToolError", "MCPToolset", "effect_of"]

IDEMPOTENCY_META_KEY = "mainspring/idempotency_key"
"""The key of the idempotency key in a tool call's ``_meta``."""

_SERVER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ANY_ARGUMENTS: type[BaseModel] = create_model(
    "mcp_arguments", __config__=ConfigDict(extra="allow")
)
# Only calls that were never sent are retried in at_most_once mode: the other
# failures are either not retryable or an unknown outcome.
_UNSENT_RETRY = RetryPolicy(max_attempts=3)


class MCPToolError(MainspringError):
    """An MCP server answered a tool call with an error (``isError``, or a protocol
    error such as invalid arguments). The tool ran and failed: not retried; the
    model is told."""


def effect_of(annotations: Mapping[str, Any] | None, *, trusted: bool = False) -> Effect:
    """The effect class of a tool with these MCP annotations (see the module):
    ``irreversible`` for a server that is not ``trusted``, whatever it claims."""
    if not trusted:
        return "irreversible"
    hints = annotations or {}
    # MCP's defaults: not read-only, and (when not read-only) destructive.
    read_only = hints.get("readOnlyHint") is True
    destructive = hints.get("destructiveHint", not read_only) is not False
    if destructive:  # a read-only tool that says it destroys: believe the worse claim
        return "irreversible"
    return "read" if read_only else "write"


def _check_transport(
    owner: str,
    *,
    command: Sequence[str] | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    url: str | None,
    headers: Mapping[str, str] | None,
) -> None:
    """One way to reach the server, with only the arguments that way uses."""
    if (command is None) == (url is None):
        raise ConfigError(f"{owner}: give command=[...] (stdio) or url=... (HTTP), not both")
    if command is not None:
        if (
            isinstance(command, str)
            or not command
            or not all(isinstance(c, str) and c for c in command)
        ):
            raise ConfigError(
                f"{owner}: command must be a non-empty list of strings, got {command!r}"
            )
        if headers is not None:
            raise ConfigError(f"{owner}: headers= is for url=, not for a stdio command")
    else:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"{owner}: url must be an http:// or https:// URL, got {url!r}")
        if env is not None or cwd is not None:
            raise ConfigError(f"{owner}: env= and cwd= are for a stdio command, not url=")


def _check_options(
    owner: str,
    *,
    prefix: str,
    allow: Sequence[str] | None,
    effects: Mapping[str, Effect] | None,
    idempotent: Sequence[str],
    timeout_s: float | None,
    trust_annotations: bool,
) -> None:
    """The options that shape the tools, checked when declared rather than at first use."""
    if prefix and not NAME_PATTERN.match(prefix):
        raise ConfigError(f"{owner}: prefix {prefix!r} is not allowed in a tool name")
    for tool, effect in (effects or {}).items():
        if effect not in EFFECTS:
            raise ConfigError(
                f"{owner}: effects[{tool!r}] must be one of {EFFECTS}, got {effect!r}"
            )
    if timeout_s is not None and not (
        isinstance(timeout_s, int | float) and 0 < timeout_s < math.inf
    ):
        raise ConfigError(f"{owner}: timeout_s must be a finite number > 0, got {timeout_s!r}")
    if isinstance(allow, str) or isinstance(idempotent, str):
        raise ConfigError(f"{owner}: allow= and idempotent= take lists of tool names")
    if not isinstance(trust_annotations, bool):
        raise ConfigError(
            f"{owner}: trust_annotations must be True or False, got {trust_annotations!r}"
        )


class MCPToolset(Toolset):
    """The tools of one MCP server, for ``app.agent(..., tools=[...])``: declare it
    with ``app.mcp.add(...)``, which takes these arguments (and closes the connections
    with ``app.mcp.close()``).

    Args:
        name: the server's name in the App (journal step ``mcp:<name>:tools``).
        command: a stdio server: the program and its arguments.
        env / cwd: the stdio server's extra environment and working directory.
        url: a streamable HTTP server's endpoint (``http://host:port/mcp``).
        headers: HTTP headers for every request (an ``Authorization``, say).
        prefix: put before each tool's name (``"fs_"``: ``fs_read_file``).
        allow: the server's tool names the agents may call (default: all).
        effects: effect class per tool name, over anything else
            (``{"read_file": "read", "delete_file": "irreversible"}``).
        idempotent: tools to treat as ``idempotentHint`` (safe to send again with the
            same idempotency key).
        timeout_s: seconds per call (by effect 30, 60 or 120 by default).
        connect_timeout_s: seconds to start or reach the server and list its tools.
        max_result_chars: longest text of a result shown to the model.
        trust_annotations: believe the server's annotations (``readOnlyHint``,
            ``destructiveHint``, ``idempotentHint``) when choosing effect classes. Off
            by default: an untrusted server's tools are ``irreversible``, so a person
            approves each call, unless ``effects=`` says otherwise. Trust a server you
            wrote or vetted, never one that could lie.

    Raises:
        ConfigError: a bad argument.
    """

    def __init__(
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
    ) -> None:
        owner = f"MCP server {name!r}"
        if not isinstance(name, str) or not _SERVER_NAME.match(name):
            raise ConfigError(f"{owner}: a name is 1 to 64 letters, digits, '_' or '-'")
        _check_transport(owner, command=command, env=env, cwd=cwd, url=url, headers=headers)
        _check_options(
            owner,
            prefix=prefix,
            allow=allow,
            effects=effects,
            idempotent=idempotent,
            timeout_s=timeout_s,
            trust_annotations=trust_annotations,
        )
        self.name = name
        self.command = tuple(command) if command is not None else None
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.url = url
        self.headers = dict(headers) if headers is not None else None
        self.prefix = prefix
        self.allow = tuple(allow) if allow is not None else None
        self.effects = dict(effects or {})
        self.idempotent = frozenset(idempotent)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_result_chars = max_result_chars
        self.trust_annotations = trust_annotations
        self._connection: Connection | None = None
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}

    def __repr__(self) -> str:
        where = " ".join(self.command) if self.command is not None else self.url
        return f"MCPToolset({self.name!r}, {where!r})"

    @property
    def transport(self) -> str:
        """``"stdio"`` or ``"http"``."""
        return "stdio" if self.command is not None else "http"

    # -- listing ---------------------------------------------------------------------

    async def list_tools(self, ctx: RunContext) -> ToolList:
        """The server's tools, listed once per session as a journaled step, with this
        toolset's prefix, allowlist and effect overrides applied."""
        listing: list[dict[str, Any]] = await ctx.step(
            self._list_step, name=f"mcp:{self.name}:tools", timeout=self.connect_timeout_s * 2
        )
        return self.tools_from(listing)

    def tools_from(self, listing: Sequence[Mapping[str, Any]]) -> ToolList:
        """Build the tools from a listing (what :meth:`list_tools` journaled).

        Raises:
            ConfigError: ``allow=``, ``effects=`` or ``idempotent=`` name a tool the
                server does not have, or an allowed tool's name cannot be a tool name.
        """
        names = [str(entry.get("name")) for entry in listing]
        known = set(names)
        for what, given in (
            ("allow", self.allow or ()),
            ("effects", self.effects),
            ("idempotent", self.idempotent),
        ):
            missing = sorted(set(given) - known)
            if missing:
                raise ConfigError(
                    f"MCP server {self.name!r}: {what}= names tools it does not have: "
                    f"{missing} (it has: {sorted(known)})"
                )
        tools: list[Tool[..., Any]] = []
        allowed: list[str] = []
        for entry in listing:
            server_name = str(entry["name"])
            is_allowed = self.allow is None or server_name in self.allow
            full = f"{self.prefix}{server_name}"
            if not NAME_PATTERN.match(full):
                if is_allowed:
                    raise ConfigError(
                        f"MCP server {self.name!r}: its tool {server_name!r} becomes "
                        f"{full!r}, which is not a valid tool name (1 to 64 letters, digits, "
                        "'_' or '-'); leave it out with allow=[...] or change prefix="
                    )
                continue
            tools.append(MCPTool.from_listing(self, entry, full))
            if is_allowed:
                allowed.append(full)
        return ToolList(tools=tuple(tools), allowed=tuple(allowed))

    async def _list_step(self) -> list[dict[str, Any]]:
        connection = await self.connect()
        return [
            {
                key: entry[key]
                for key in ("name", "description", "inputSchema", "annotations")
                if key in entry
            }
            for entry in connection.tools
        ]

    # -- the connection -----------------------------------------------------------------

    async def connect(self) -> Connection:
        """This process's live connection in the running event loop, opened (or
        opened again, after the server died) if need be.

        Raises:
            TransientError: the server could not be started or reached (retryable).
            MissingExtra: the ``mcp`` SDK is not installed.
        """
        from ._mcp_client import Connection, Unreachable  # the mcp SDK: extra [mcp]

        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            self._locks = {loop: asyncio.Lock()}  # an older loop's lock is of no use now
            lock = self._locks[loop]
        async with lock:
            current = self._connection
            if current is not None and current.alive and current.loop is loop:
                return current
            if current is not None and current.loop is loop:
                await current.close()
            self._connection = None
            connection = Connection(self)
            try:
                await connection.open(self.connect_timeout_s)
            except Unreachable as exc:
                raise TransientError(
                    f"MCP server {self.name!r} ({self.transport}) could not be reached: {exc}"
                ) from None
            self._connection = connection
            return connection

    async def aclose(self) -> None:
        """Close this process's connection (a stdio server is stopped). The next call
        opens a new one."""
        current, self._connection = self._connection, None
        if current is not None and current.loop is asyncio.get_running_loop():
            await current.close()

    async def call(self, tool: MCPTool, arguments: dict[str, Any]) -> Any:
        """Send one call of ``tool`` (from inside its step); its result as JSON."""
        from ._mcp_client import ServerGone  # the mcp SDK: extra [mcp]

        ctx = tool.context()
        connection = await self.connect()
        if tool.mode == "at_most_once" and not await connection.ping(self.connect_timeout_s):
            # The server died since the last call (between calls nothing notices):
            # find out now, while nothing is sent, rather than lose this call's answer.
            connection = await self.connect()
        self._check_drift(tool, connection.tools)
        meta = {IDEMPOTENCY_META_KEY: ctx.idempotency_key, "mainspring/attempt": ctx.attempt}
        try:
            result = await connection.call(tool.server_name, arguments, meta)
        except RuntimeError as exc:  # the server refused the call
            raise MCPToolError(f"{tool.name}: {exc}") from None
        except (ServerGone, Exception) as exc:
            lost = (
                f"MCP server {self.name!r} stopped answering during the call of "
                f"{tool.server_name!r} ({exc})"
            )
            if tool.mode == "at_most_once":
                raise StepInterrupted(
                    f"{lost}; it may or may not have taken effect, so it is not sent again",
                    run_id=ctx.run_id,
                ) from None
            raise TransientError(f"{lost}; the call is sent again") from None
        return _value(tool, result)

    def _check_drift(self, tool: MCPTool, live: list[dict[str, Any]]) -> None:
        found = next((t for t in live if t.get("name") == tool.server_name), None)
        if found is None:
            raise ConfigError(
                f"MCP server {self.name!r} no longer has the tool {tool.server_name!r} "
                f"that this run listed (it has: {sorted(str(t.get('name')) for t in live)}): "
                "the server changed under a running run; see 'MCP servers that change' in "
                "docs/tools.md"
            )
        if found.get("inputSchema") != tool.input_schema:
            raise ConfigError(
                f"MCP server {self.name!r} changed the input schema of its tool "
                f"{tool.server_name!r} since this run listed it: the call is not sent; see "
                "'MCP servers that change' in docs/tools.md"
            )


def _value(tool: MCPTool, result: Mapping[str, Any]) -> Any:
    """What a call returns (and the journal keeps): the text, the structured content
    when there is no text, or the content blocks (binary data left out)."""
    content = [c for c in result.get("content", []) if isinstance(c, dict)]
    texts = [str(c.get("text", "")) for c in content if c.get("type") == "text"]
    if result.get("isError"):
        raise MCPToolError(f"{tool.name}: {' '.join(texts) or 'the server reported an error'}")
    if content and len(texts) == len(content):
        return "\n".join(texts)
    if "structuredContent" in result:
        return result["structuredContent"]
    return [
        {k: v for k, v in c.items() if k not in ("data", "blob")}
        | ({"omitted": "binary data"} if "data" in c or "blob" in c else {})
        for c in content
    ]


@dataclass(frozen=True, eq=False, kw_only=True)
class MCPTool(Tool[..., Any]):
    """A tool of an MCP server, as one session of a run listed it.

    Attributes:
        toolset: the server it belongs to.
        server_name: its name on the server (``name`` adds the toolset's prefix).
        input_schema: the input schema the server listed (checked before each call).
        annotations: the server's annotations (``readOnlyHint``, ...).
        idempotent: ``idempotentHint`` of a trusted server, or named in ``idempotent=``.
    """

    toolset: MCPToolset = field(repr=False)
    server_name: str
    input_schema: dict[str, Any] = field(repr=False)
    annotations: dict[str, Any] = field(repr=False)
    idempotent: bool = False

    @classmethod
    def from_listing(cls, toolset: MCPToolset, entry: Mapping[str, Any], name: str) -> MCPTool:
        """The tool ``entry`` (one of a listing) describes, called ``name``."""
        server_name = str(entry["name"])
        annotations = dict(entry.get("annotations") or {})
        trusted = toolset.trust_annotations
        effect = toolset.effects.get(server_name) or effect_of(annotations, trusted=trusted)
        raw_schema = entry.get("inputSchema")
        input_schema = dict(raw_schema) if isinstance(raw_schema, dict) else {"type": "object"}
        description = str(entry.get("description") or f"The {server_name} tool of {toolset.name}.")

        def not_callable(**_: Any) -> Any:
            raise ConfigError(
                f"tool {name!r} is a tool of the MCP server {toolset.name!r}: an agent calls "
                "it, or `await tool.run(ctx, arguments)` in a workflow"
            )

        return cls(
            name=name,
            description=description.strip(),
            fn=not_callable,
            effect=effect,
            timeout_s=toolset.timeout_s or DEFAULT_TIMEOUT_S[effect],
            retry=None,
            requires_approval=effect == "irreversible",
            validators=(),
            max_result_chars=toolset.max_result_chars,
            schema=ArgumentSchema(
                model=_ANY_ARGUMENTS,
                fields=(),
                context_param=None,
                json_schema=clean_schema(input_schema),
                description=description,
                return_type=Any,
            ),
            toolset=toolset,
            server_name=server_name,
            input_schema=input_schema,
            annotations=annotations,
            idempotent=(trusted and annotations.get("idempotentHint") is True)
            or server_name in toolset.idempotent,
        )

    @property
    def mode(self) -> StepMode:
        """``at_least_once`` for reads and idempotent writes, else ``at_most_once``."""
        if self.effect == "read" or (self.effect == "write" and self.idempotent):
            return "at_least_once"
        return "at_most_once"

    def validate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Check ``args`` against the server's input schema (JSON Schema).

        Raises:
            ToolInputError: every problem, then the expected call.
        """
        from ._mcp_client import schema_problems  # jsonschema comes with the mcp SDK

        if not isinstance(args, Mapping):
            raise ToolInputError(
                f"{self.name}: arguments must be a JSON object\nExpected: {self.signature}"
            )
        problems = schema_problems(self.input_schema, dict(args))
        if problems:
            raise ToolInputError(f"{self.name}: {'; '.join(problems)}\nExpected: {self.signature}")
        return dict(args)

    async def run(self, ctx: RunContext, arguments: Mapping[str, Any]) -> Any:
        """Call the tool on its server as a journaled step (role ``tool``)."""
        return await ctx.step(
            self.step_function,
            dict(arguments),
            name=self.step_name,
            mode=self.mode,
            retry=self.retry or (_UNSENT_RETRY if self.mode == "at_most_once" else None),
            timeout=self.timeout_s,
            role="tool",
        )

    def _make_step_function(self) -> Callable[..., Any]:
        async def run_mcp(arguments: Mapping[str, Any] | None = None, /, **kw: Any) -> Any:
            return await self.toolset.call(self, {**(arguments or {}), **kw})

        run_mcp.__name__ = run_mcp.__qualname__ = self.step_name
        run_mcp.__doc__ = f"Call {self.server_name!r} on the MCP server {self.toolset.name!r}."
        run_mcp.__annotations__ = {"return": Any}
        _TOOL_OF_STEP[run_mcp] = self
        return run_mcp
