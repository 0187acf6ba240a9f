"""One live connection to an MCP server, on the official ``mcp`` SDK (extra ``[mcp]``).

The SDK's transports and sessions are async context managers whose task groups must
be entered and left by one task, so each connection lives in a task of its own that
opens the transport and the session, lists the tools, and then waits until it is
told to close (or its transport ends: the server exited). Calls are sent from any
task of the same event loop through the one session, concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import TYPE_CHECKING, Any, cast

from .._errors import MissingExtra

if TYPE_CHECKING:
    from ._mcp import MCPToolset

try:
    import httpx2
    import jsonschema  # type: ignore[import-untyped]
    import mcp
    import mcp_types
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("app.mcp", "mcp", exc.name) from exc

__all__ = ["Connection", "ServerGone", "Unreachable", "schema_problems"]

# Errors of the connection, not of the request: the answer is lost with it.
_LOST_CODES = frozenset({mcp_types.CONNECTION_CLOSED, mcp_types.REQUEST_TIMEOUT})


class Unreachable(Exception):
    """The server could not be started or reached: no call was sent."""


class ServerGone(Exception):
    """The connection ended while a call was in flight: its outcome is unknown."""


class Connection:
    """A session with one MCP server, opened by :meth:`open` in the running loop."""

    def __init__(self, server: MCPToolset) -> None:
        self._server = server  # how to reach it: its command, or its URL and headers
        self._session: mcp.ClientSession | None = None
        self._closing = asyncio.Event()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._broken = False
        self.tools: list[dict[str, Any]] = []
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def alive(self) -> bool:
        """Open and not ended (a stdio server that exited ends its connection)."""
        return (
            not self._broken
            and self._session is not None
            and self._task is not None
            and not self._task.done()
        )

    async def open(self, timeout_s: float) -> None:
        """Start the server (stdio) or connect (HTTP), initialize, list the tools.

        Raises:
            Unreachable: any of that failed; says why.
        """
        self.loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._hold(), name="mainspring-mcp")
        ready = asyncio.create_task(self._ready.wait())
        try:
            await asyncio.wait(
                {ready, self._task}, timeout=timeout_s, return_when="FIRST_COMPLETED"
            )
        finally:
            ready.cancel()
        if not self._ready.is_set() or self._session is None:
            error = self._error
            await self.close()
            why = f"{type(error).__name__}: {error}" if error else f"no answer in {timeout_s}s"
            raise Unreachable(why)

    async def _hold(self) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                server = self._server
                if server.command is not None:
                    params = mcp.StdioServerParameters(
                        command=server.command[0],
                        args=list(server.command[1:]),
                        env=dict(server.env) if server.env is not None else None,
                        cwd=server.cwd,
                    )
                    streams = await stack.enter_async_context(mcp.stdio_client(params, sys.stderr))
                else:
                    assert server.url is not None
                    client = await stack.enter_async_context(
                        httpx2.AsyncClient(
                            headers=dict(server.headers or {}),
                            timeout=httpx2.Timeout(30.0, read=300.0),
                        )
                    )
                    streams = await stack.enter_async_context(
                        streamable_http_client(server.url, http_client=client)
                    )
                read, write = streams
                session = await stack.enter_async_context(mcp.ClientSession(read, write))
                await session.initialize()
                self.tools = await _list_all(session)
                self._session = session
                self._ready.set()
                await self._closing.wait()
        except Exception as exc:  # the transport failed or ended: calls see it as lost
            self._error = exc
        finally:
            self._session = None

    async def call(
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any]
    ) -> dict[str, Any]:
        """Call tool ``name``; its result as JSON (``content``, ``structuredContent``,
        ``isError``).

        Raises:
            ServerGone: the connection ended before the answer came.
            RuntimeError: the server answered with a protocol error (bad arguments,
                no such tool): not retryable.
        """
        try:
            return await self._call(name, arguments, meta)
        except ServerGone:
            # Never reuse a connection that lost an answer: the next call opens anew.
            self._broken = True
            self._closing.set()
            raise

    async def _call(
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any]
    ) -> dict[str, Any]:
        session = self._session
        if session is None:
            raise ServerGone(f"the connection is closed ({self._error})")
        call = asyncio.ensure_future(
            session.call_tool(name, arguments, meta=cast(mcp_types.RequestParamsMeta, meta))
        )
        assert self._task is not None
        # A stdio server that exits ends the holder task: don't wait for an answer
        # that cannot come.
        try:
            await asyncio.wait({call, self._task}, return_when="FIRST_COMPLETED")
        except asyncio.CancelledError:  # the step's timeout, or the run ending
            call.cancel()
            self._broken = True  # an answer may still come: never read it as another's
            self._closing.set()
            raise
        if not call.done():
            call.cancel()
            with contextlib.suppress(BaseException):
                await call
            raise ServerGone(f"the connection ended ({self._error})")
        try:
            result = call.result()
        except MCPError as exc:
            if exc.code in _LOST_CODES:
                raise ServerGone(f"{exc.message} (code {exc.code})") from None
            raise RuntimeError(f"{exc.message} (MCP error {exc.code})") from None
        except (OSError, httpx2.HTTPError) as exc:
            raise ServerGone(f"{type(exc).__name__}: {exc}") from None
        dumped: dict[str, Any] = result.model_dump(by_alias=True, exclude_none=True, mode="json")
        return dumped

    async def ping(self, timeout_s: float) -> bool:
        """Whether the server still answers (nothing else is sent). A connection that
        does not is closed, so that the next :meth:`open` starts afresh."""
        session = self._session
        if session is not None and self.alive:
            try:
                await asyncio.wait_for(session.send_ping(), timeout_s)
                return True
            except Exception:
                pass
        self._broken = True
        self._closing.set()
        return False

    async def close(self) -> None:
        """End the session (a stdio server is stopped)."""
        self._closing.set()
        task = self._task
        if task is not None and not task.done():
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(task), 10.0)


async def _list_all(session: mcp.ClientSession) -> list[dict[str, Any]]:
    """Every tool, page after page, as JSON (``name``, ``inputSchema``, ``annotations``)."""
    found: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(1000):
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        found.extend(
            t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in page.tools
        )
        cursor = page.next_cursor
        if not cursor:
            break
    return found


def schema_problems(schema: dict[str, Any], arguments: dict[str, Any]) -> list[str]:
    """What is wrong with ``arguments`` under the JSON ``schema``, phrased for a model
    (``argument 'path' ...``); empty when they are valid. A schema that is itself
    invalid checks nothing: the server judges."""
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
    except jsonschema.SchemaError:
        return []
    problems = []
    for error in sorted(validator_class(schema).iter_errors(arguments), key=lambda e: e.path):
        where = ".".join(str(p) for p in error.path)
        problems.append(f"argument {where!r}: {error.message}" if where else error.message)
    return problems[:10]
