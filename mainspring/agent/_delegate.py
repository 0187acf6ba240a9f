"""Agents composed as child runs: an agent's workflow (what ``app.agent`` returns) can
be given to another agent as a tool (:meth:`AgentWorkflow.as_tool`). Each call of
that tool runs the agent as a child run of the caller (``ctx.child``), with its own
journal, budget, rate-limit bookings, approvals and trace; its answer is the tool's
result, and its usage counts in the caller's budget. A *handoff* (``app.agent(...,
handoffs=[other])``) moves the whole task to another agent, run as a child run whose
result becomes the handing agent's."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic

from .._errors import ChildFailed, ConfigError, StepFailed
from ..journal import RunContext, Workflow
from ..models import ToolSpec
from ..tools import Tool
from ._state import AgentResult, AgentState, OutputT

__all__ = ["AgentTool", "AgentWorkflow", "Handoff", "handoff_spec", "handoff_task"]


@dataclass(frozen=True, eq=False)
class AgentWorkflow(Workflow[[str], AgentResult[OutputT]], Generic[OutputT]):
    """The workflow that runs an agent, as ``app.agent(...)`` returns it: run it like
    any workflow (``app.submit(agent, task)``, ``ctx.child(agent, task)``), or give it
    to another agent with :meth:`as_tool`."""

    @classmethod
    def for_agent(cls, fn: Any, name: str) -> AgentWorkflow[Any]:
        """The workflow of the agent ``name`` whose run is ``fn(ctx, task)``."""
        made = cls.create(fn, name)
        assert isinstance(made, AgentWorkflow)
        return made

    def as_tool(self, name: str | None = None, description: str | None = None) -> AgentTool:
        """This agent as a tool of another agent (``tools=[researcher.as_tool()]``).

        The model calls it with ``{"task": "..."}``; the agent runs as a child run of
        the calling agent's run, and its answer is the result the model sees. An agent
        that stops short (a cap, a budget) or fails is an error result the model is
        told about.

        Args:
            name: what the model calls the tool (default: the agent's name).
            description: what the model is told it does.
        """
        agent = self.name

        def delegate(task: str) -> str:
            raise ConfigError(
                f"tool {tool_name!r} runs agent {agent!r} as a child run: only an agent "
                "can call it (tools=[...]), not Python code directly; use ctx.child"
            )

        tool_name = name if name is not None else agent
        delegate.__doc__ = (
            f"Delegate a task to the {agent!r} agent and get its answer.\n\n"
            "Args:\n    task: the task, in full: the agent sees nothing else.\n"
        )
        base = Tool.from_function(
            delegate,
            name=tool_name,
            description=description
            if description is not None
            else f"Delegate a task to the {agent} agent; it answers with its result.",
            effect="write",
            requires_approval=False,
        )
        # The tool built above as an AgentTool: every field of it (one that Tool gains
        # comes along), and the agent.
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(Tool) if f.init}
        return AgentTool(**fields, agent=self)


@dataclass(frozen=True, eq=False, kw_only=True)
class AgentTool(Tool[[str], str]):
    """A tool that runs an agent as a child run (see :meth:`AgentWorkflow.as_tool`).

    Attributes:
        agent: the agent's workflow.
    """

    agent: AgentWorkflow = field(repr=False)

    async def run(
        self, ctx: RunContext, arguments: Mapping[str, Any], *, state: AgentState | None = None
    ) -> Any:
        """Run the agent as a child run of ``ctx``'s run and return its answer.

        ``state``: the calling agent's state, which the sub-agent's usage (tokens and
        cost) is added to, so that the caller's budget counts what its sub-agents spent
        (the calling agent's loop passes it).

        Raises:
            StepFailed: the agent failed, was cancelled or stopped without an answer
                (the model is told so, like any tool's failure).
        """
        task = str(arguments.get("task", ""))
        try:
            result = await ctx.child(self.agent, task)
        except ChildFailed as exc:
            error = exc.error if isinstance(exc.error, dict) else {}
            raise StepFailed(
                f"agent {self.agent.name!r} {exc.status}: {error.get('message', '')}",
                error_type=str(error.get("type", "ChildFailed")),
                attempts=1,
                run_id=ctx.run_id,
            ) from None
        if state is not None:
            state.input_tokens += result.input_tokens
            state.output_tokens += result.output_tokens
            state.cost_usd += result.cost_usd
        if result.status != "done":
            raise StepFailed(
                f"agent {self.agent.name!r} stopped without an answer: {result.reason}",
                error_type="AgentStopped",
                attempts=1,
                run_id=ctx.run_id,
            )
        return result.answer


# -- handoffs ------------------------------------------------------------------------

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def handoff_spec(target: AgentWorkflow) -> ToolSpec:
    """The ``transfer_to_<name>`` tool the model calls to hand the task over to
    ``target``.

    Raises:
        ConfigError: the agent's name cannot be part of a tool name.
    """
    name = f"transfer_to_{target.name}"
    if not _TOOL_NAME.match(name):
        raise ConfigError(
            f"cannot hand off to agent {target.name!r}: {name!r} is not a valid tool name "
            "(letters, digits, '_' or '-', up to 64 in all)"
        )
    return ToolSpec(
        name=name,
        description=f"Hand the task over to the {target.name} agent: it continues from "
        "what you know, and its answer is the final answer. Call it alone, when that "
        "agent is better placed to finish the task.",
        parameters={
            "type": "object",
            "properties": {
                "note": {
                    "type": "string",
                    "description": "What the next agent must know to continue.",
                }
            },
            "required": ["note"],
        },
    )


def handoff_task(source: str, arguments: str, state: AgentState) -> str:
    """The task the receiving agent starts from: the original task (the handing agent's
    goal), the model's note (from the call's ``arguments``) and the state (plan, facts,
    progress notes) the handing agent had."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = arguments  # not JSON: the text is the note
    note = parsed.get("note", "") if isinstance(parsed, dict) else parsed
    return (
        f"{state.goal}\n\nHanded over by the {source!r} agent: {note}\n\n"
        f"What it knew:\n{state.block()}"
    )


@dataclass(frozen=True, slots=True)
class Handoff:
    """The answer of an agent that handed its task over: the receiver's result."""

    result: AgentResult

    def merged(self, state: AgentState, sessions: int) -> AgentResult:
        """The receiver's result as the handing agent's own: its answer, status and
        state, with both agents' turns, tool calls, tokens and cost."""
        r = self.result
        return dataclasses.replace(
            r,
            turns=state.turns + r.turns,
            tool_calls=state.tool_calls + r.tool_calls,
            input_tokens=state.input_tokens + r.input_tokens,
            output_tokens=state.output_tokens + r.output_tokens,
            cost_usd=round(state.cost_usd + r.cost_usd, 6),
            sessions=sessions + r.sessions,
        )
