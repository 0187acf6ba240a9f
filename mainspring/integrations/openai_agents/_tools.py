"""The SDK's function tools and MCP calls as mainspring tool steps.

A function tool keeps its name, schema, guardrails, timeout and error handling; only
its ``on_invoke_tool`` is wrapped: inside a durable run the call is a step of role
``tool`` named ``tool:<name>``, so a completed call is never made again on replay, and
the tool sees the step's idempotency key (``mainspring.current_step()``) to pass to
the outside world. Its effect class picks the step's mode: ``read`` and ``write`` run
at least once (again, under the same key, after a crash in the middle), while
``irreversible`` runs at most once and asks a human first (the SDK's own
``needs_approval``, which the durable run turns into a mainspring approval).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from agents import FunctionTool
from agents.mcp import MCPServer
from agents.tool import ToolOriginType, default_tool_error_function, get_function_tool_origin
from mcp.types import CallToolResult, Tool

from mainspring import ConfigError, StepFailed, StepInterrupted
from mainspring.tools import mark_step_effect

from ._active import _ACTIVE, Active, Effect

__all__ = [
    "DEFAULT_EFFECT",
    "EFFECTS",
    "JournaledMCPServer",
    "effect",
    "effect_of",
    "journal_tools",
]

_WRAPPED = "_mainspring_original"
EFFECTS: tuple[Effect, ...] = ("read", "write", "irreversible")
#: A tool nobody declared: it may change the world, so it runs under an idempotency
#: key, at least once; it does not ask (``irreversible`` does).
DEFAULT_EFFECT: Effect = "write"
_MARK = "_mainspring_effect"

T = TypeVar("T")


def effect(kind: Effect) -> Callable[[T], T]:
    """Declare a tool's effect class, above the SDK's ``@function_tool``::

        @effect("irreversible")
        @function_tool
        def issue_refund(order: int) -> str: ...

    Also for an MCP server (every tool it lists). ``durable(..., effects={...})``
    says the same by name and wins over this mark.
    """
    if kind not in EFFECTS:
        raise ConfigError(f"effect must be one of {EFFECTS}, got {kind!r}")

    def mark(tool: T) -> T:
        if not isinstance(tool, FunctionTool | MCPServer):
            raise ConfigError(
                f"@effect({kind!r}) goes on an agents.FunctionTool (above @function_tool) "
                f"or an MCP server, got {type(tool).__name__}"
            )
        setattr(tool, _MARK, kind)
        return tool

    return mark


def effect_of(obj: object, name: str, effects: Mapping[str, Effect]) -> Effect:
    """The effect class of a tool (or MCP server) named ``name``."""
    found = effects.get(name)
    if found is not None:
        return found
    marked = getattr(obj, _MARK, None)
    return marked if marked in EFFECTS else DEFAULT_EFFECT


def journal_tools(tools: list[Any]) -> None:
    """Make every function tool a model is offered a journaled tool step inside
    durable runs (in place, once: outside a durable run the tool behaves as before).
    An agent used as a tool is left alone: its nested run's own model and tool
    calls are journaled one by one, in this run."""
    for tool in tools:
        if not isinstance(tool, FunctionTool) or hasattr(tool, _WRAPPED):
            continue
        invoker = tool.on_invoke_tool
        if isinstance(invoker, functools.partial) and invoker.func is _invoke:
            continue  # a copy the SDK made of a tool wrapped already
        origin = get_function_tool_origin(tool)
        if origin is not None and origin.type == ToolOriginType.AGENT_AS_TOOL:
            continue
        original = tool.on_invoke_tool
        # The function @function_tool wrapped (gone once the invoker is replaced).
        source = getattr(tool, "__wrapped__", original)
        tool.on_invoke_tool = functools.partial(_invoke, tool.name, original, tool, source)
        setattr(tool, _WRAPPED, original)


async def _invoke(
    name: str, original: Any, tool: FunctionTool, source: Any, tool_ctx: Any, args: str
) -> Any:
    run = _ACTIVE.get()
    if run is None:
        return await original(tool_ctx, args)
    # The name the model called it by (a copy the SDK made may carry another).
    name = str(getattr(tool_ctx, "tool_name", None) or name)
    origin = get_function_tool_origin(tool)
    server = origin.mcp_server_name if origin is not None else None
    kind = effect_of(tool, name, run.effects)
    if server is not None and name not in run.effects:
        kind = run.effects.get(server, kind)
    call_id = str(getattr(tool_ctx, "tool_call_id", "") or "")
    if kind == "irreversible" and call_id not in run.approved:
        decision = await run.ctx.approval(
            call_id or name,
            title=f"run the irreversible tool {name!r}?",
            preview={"tool": name, "arguments": parsed(args), "effect": kind},
        )
        if not decision.approved:
            why = f": {decision.reason}" if decision.reason else ""
            return f"Tool call {name!r} was rejected by a human{why}."
        if decision.arguments is not None:
            args = json.dumps(decision.arguments)
    run.before_tool(name)

    async def call(arguments: str) -> Any:
        return await original(tool_ctx, arguments)

    # The tool's own function (the SDK exposes it on @function_tool tools), for
    # whoever reads what a step runs: the lab asks whether it uses its idempotency key.
    call.__wrapped__ = source  # type: ignore[attr-defined]
    mark_step_effect(call, kind)  # and what effect class it has
    try:
        return await run.ctx.step(
            call,
            args,
            name=f"tool:{name}",
            role="tool",
            mode="at_most_once" if kind == "irreversible" else "at_least_once",
        )
    except StepFailed as exc:
        # Its retries spent (a tool that raises is the SDK's business: its error
        # function answers inside the step): the model hears of it, as the SDK's
        # default error function would tell it, instead of the run failing.
        return default_tool_error_function(tool_ctx, exc)
    except StepInterrupted:
        # An irreversible call a crash cut short: it may have taken effect. Never
        # again blindly (a new call would carry a new key): say so to the model.
        return (
            f"The call of {name!r} was interrupted and may or may not have taken "
            "effect; check before calling it again."
        )


def parsed(args: str) -> Any:
    try:
        return json.loads(args)
    except ValueError:
        return args


class JournaledMCPServer(MCPServer):
    """An MCP server whose tool calls are journaled tool steps, and whose tool list is
    journaled once per turn (a replay sees the tools the run saw, even if the server
    changed meanwhile)."""

    def __init__(self, inner: MCPServer, kind: Effect, active: Callable[[], Active | None]):
        super().__init__(
            use_structured_content=inner.use_structured_content,
            require_approval="always" if kind == "irreversible" else None,
            tool_meta_resolver=inner.tool_meta_resolver,
            custom_data_extractor=inner.custom_data_extractor,
            tool_input_guardrails=inner.tool_input_guardrails,
            tool_output_guardrails=inner.tool_output_guardrails,
        )
        self.inner = inner
        self.kind = kind
        self._active = active

    @property
    def name(self) -> str:
        return self.inner.name

    async def connect(self) -> None:
        await self.inner.connect()  # type: ignore[no-untyped-call]

    async def cleanup(self) -> None:
        await self.inner.cleanup()  # type: ignore[no-untyped-call]

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> list[Any]:
        run = self._active()
        listed = functools.partial(self.inner.list_tools, run_context, agent)
        if run is None:
            return await listed()

        async def dump() -> list[dict[str, Any]]:
            return [t.model_dump(mode="json") for t in await listed()]

        raw = await run.ctx.step(dump, name=f"mcp:list:{self.name}")
        return [Tool.model_validate(t) for t in raw]

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None = None
    ) -> CallToolResult:
        # Journaled one level up: the SDK calls this from a function tool, which a
        # durable run makes a tool step (journal_tools), as any other.
        return await self.inner.call_tool(tool_name, arguments, meta)

    async def list_prompts(self) -> Any:
        return await self.inner.list_prompts()

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        return await self.inner.get_prompt(name, arguments)
