"""Tool calls of a Pydantic AI agent as journaled steps.

:class:`JournaledToolset` is a Pydantic AI ``WrapperToolset`` that the run's capability
puts around the agent's assembled toolset for each run: the agent's own tools, the
toolsets passed to the run and MCP servers alike. Each call is one ``tool:<name>``
step (role ``tool``) in the mode of its effect class, so a completed call is never
made again, and a call a crash interrupted is made again under the same idempotency
key (``ms.current_step().idempotency_key`` inside the tool), or, for an
``irreversible`` tool, not at all (``StepInterrupted``).

What a tool *does* to the agent is journaled with its value: a ``ModelRetry``, a
``ToolFailed`` or a deferral the tool raised is an outcome of the step, raised again on
replay, so the agent takes the same path either way. Any other exception fails the
step (retried by the App's policy unless the tool is ``irreversible``); it reaches the
agent as :class:`~mainspring.StepFailed` on the first execution and on every replay.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from pydantic import TypeAdapter
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry, ToolFailed
from pydantic_ai.messages import ToolReturn
from pydantic_ai.tools import RunContext as PaiContext
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import ToolsetTool, WrapperToolset

from mainspring import ConfigError, Effect, RunContext
from mainspring.tools import effect_of, mark_step_effect

__all__ = ["DELEGATING", "EFFECTS", "JournaledToolset", "ToolRules"]

EFFECTS: tuple[str, ...] = get_args(Effect)

_TOOL_RETURN = TypeAdapter(ToolReturn)

# Set while a tool named in ``delegates`` runs (outside any step): the durable
# sub-agents it runs become child runs of this run.
DELEGATING: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "mainspring_pydantic_ai_delegating", default=None
)


@dataclass(frozen=True, kw_only=True)
class ToolRules:
    """How an agent's tool calls are journaled.

    Attributes:
        effects: effect class by tool name (the name the model calls).
        delegates: tools that run other durable agents: not steps themselves; each
            agent they run is a child run.
        default: the effect of a tool named nowhere: an MCP tool's from its
            annotations (as mainspring's own MCP tools), else this.
    """

    effects: Mapping[str, Effect] = field(default_factory=dict)
    delegates: frozenset[str] = frozenset()
    default: Effect = "write"

    @classmethod
    def build(
        cls, agent: str, effects: Mapping[str, str] | None, delegates: Collection[str]
    ) -> ToolRules:
        """Checked rules (``agent`` names the agent in errors).

        Raises:
            ConfigError: an unknown effect class, or a tool both delegating and effectful.
        """
        checked: dict[str, Effect] = {}
        for name, effect in (effects or {}).items():
            if effect not in EFFECTS:
                raise ConfigError(
                    f"durable agent {agent!r}: tool {name!r} has effect {effect!r}; an effect "
                    f"is one of {', '.join(map(repr, EFFECTS))}"
                )
            checked[name] = effect  # type: ignore[assignment]
        if isinstance(delegates, str):
            raise ConfigError(
                f"durable agent {agent!r}: delegates is a collection of tool names, got "
                f"the string {delegates!r} (write delegates=[{delegates!r}])"
            )
        both = set(checked) & set(delegates)
        if both:
            raise ConfigError(
                f"durable agent {agent!r}: {sorted(both)} both delegate (delegates=) and have "
                "an effect (effects=): a delegating tool is not a step, its child runs are"
            )
        return cls(effects=checked, delegates=frozenset(delegates))

    def effect(self, tool_def: ToolDefinition) -> Effect:
        """The effect class of a call of this tool."""
        given = self.effects.get(tool_def.name)
        if given is not None:
            return given
        annotations = (tool_def.metadata or {}).get("annotations")
        if isinstance(annotations, Mapping):  # an MCP server's claims (a trust decision)
            return effect_of(annotations)
        return self.default


def _encode(value: Any) -> dict[str, Any]:
    if isinstance(value, ToolReturn):
        return {"kind": "tool_return", "value": _TOOL_RETURN.dump_python(value, mode="json")}
    return {"kind": "value", "value": value}


def _decode(outcome: dict[str, Any]) -> Any:
    kind = outcome.get("kind")
    if kind == "value":
        return outcome.get("value")
    if kind == "tool_return":
        return _TOOL_RETURN.validate_python(outcome["value"])
    if kind == "retry":
        raise ModelRetry(str(outcome.get("message", "")))
    if kind == "failed":
        raise ToolFailed(str(outcome.get("message", "")))
    if kind == "approval":
        raise ApprovalRequired(metadata=outcome.get("metadata"))
    if kind == "deferred":
        if outcome.get("call_kind") == "question":
            raise CallDeferred(metadata=outcome.get("metadata"), kind="question")
        raise CallDeferred(metadata=outcome.get("metadata"))
    raise ConfigError(f"a journaled tool outcome of unknown kind {kind!r}: {outcome!r:.200}")


@dataclass
class JournaledToolset(WrapperToolset[Any]):
    """A toolset whose calls are journaled steps of the mainspring run ``ctx``."""

    ctx: RunContext = field(kw_only=True, repr=False)
    rules: ToolRules = field(kw_only=True, repr=False)
    # Called with each tool call's (name, effect) as it starts: the run's budget.
    on_call: Callable[[str], None] = field(kw_only=True, repr=False)

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: PaiContext[Any],
        tool: ToolsetTool[Any],
    ) -> Any:
        if name in self.rules.delegates:
            token = DELEGATING.set(self.ctx)
            try:
                return await self.wrapped.call_tool(name, tool_args, ctx, tool)
            finally:
                DELEGATING.reset(token)
        effect = self.rules.effect(tool.tool_def)
        self.on_call(name)
        wrapped = self.wrapped

        async def call() -> dict[str, Any]:
            try:
                return _encode(await wrapped.call_tool(name, tool_args, ctx, tool))
            except ModelRetry as exc:
                return {"kind": "retry", "message": exc.message}
            except ToolFailed as exc:
                return {"kind": "failed", "message": exc.message}
            except ApprovalRequired as exc:
                return {"kind": "approval", "metadata": exc.metadata}
            except CallDeferred as exc:
                return {"kind": "deferred", "metadata": exc.metadata, "call_kind": exc.kind}

        mark_step_effect(call, effect)  # for interceptors that ask (the lab)
        outcome: dict[str, Any] = await self.ctx.step(
            call,
            name=f"tool:{name}",
            mode="at_most_once" if effect == "irreversible" else "at_least_once",
            role="tool",
        )
        return _decode(outcome)
