"""Agent policies: wrappers around an agent's tool calls and model calls.

A policy is a :class:`Policy` with up to three hooks. Each receives the call and
``call_next``, the rest of the chain, and may change the call before passing it on,
answer it without passing it on, or change what comes back::

    admit_tool(use, call_next)     before any tool of the turn runs, one call after the
                                   other: pass it on (maybe with other arguments), or
                                   refuse it with a ToolOutcome the model reads
    around_tool(use, call_next)    around running one admitted tool (the turn's calls run
                                   concurrently)
    around_model(call, call_next)  around one model call: rate limiting and the
                                   journaled step are inside ``call_next``

Policies run in a fixed order, the first outermost. Admitting a tool call:
``Allowlist`` (an unknown or forbidden tool stops the run) → ``ValidArguments``
(invalid arguments go back to the model to repair) → ``ToolCallBudget``
(``max_tool_calls``) → your policies → ``ApprovalRequired`` (a human approves each
call of a tool that ``requires_approval``, with the arguments your policies passed).
Running a tool: your policies, around the tool's journaled step. A model call:
``ProviderRefusal`` (a refused account pauses for a human) → your policies → the rate
limiter and the journaled step (:func:`call_model`).

Whatever a policy decides must be as deterministic as the workflow (a replay takes the
same path): decide from the call, the agent's state and journaled values, and put
anything else (a clock, a lookup) in a ``ctx.step``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..journal import RunContext
from ..models import Message, Model, ModelResponse, ModelSettings, ToolCall, ToolSpec
from ..tools import Tool
from ._state import AgentState

__all__ = [
    "ModelCall",
    "ModelNext",
    "Policy",
    "ToolAdmitNext",
    "ToolNext",
    "ToolOutcome",
    "ToolUse",
    "compose",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolUse:
    """One tool call the model asked for, on its way to being run.

    Attributes:
        ctx: the run's context.
        call: the call as the model wrote it (``id``, ``name``, raw ``arguments``).
        state: the agent's state (read it; the loop updates it).
        tool: the tool, once the allowlist resolved it (always set for your policies).
        arguments: the validated arguments (always set for your policies); pass
            other ones on with ``dataclasses.replace(use, arguments=...)``.
    """

    ctx: RunContext
    call: ToolCall
    state: AgentState
    tool: Tool[Any, Any] | None = None
    arguments: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        """The tool's name."""
        return self.call.name


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What the model is told about a tool call: the tool's rendered result, or why
    it was not run (``is_error``)."""

    content: str
    is_error: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCall:
    """One request to the model, about to be sent.

    Attributes:
        ctx: the run's context.
        model: the model.
        messages: the request, oldest first.
        tools: the tools the model may call.
        settings: sampling settings.
        state: the agent's state.
    """

    ctx: RunContext
    model: Model
    messages: Sequence[Message]
    tools: Sequence[ToolSpec]
    settings: ModelSettings | None
    state: AgentState


ToolAdmitNext = Callable[[ToolUse], Awaitable[ToolUse | ToolOutcome]]
"""The rest of the admission chain: the use as admitted, or the outcome that refused it."""
ToolNext = Callable[[ToolUse], Awaitable[ToolOutcome]]
"""The rest of the chain that runs a tool."""
ModelNext = Callable[[ModelCall], Awaitable[ModelResponse]]
"""The rest of the chain that calls the model."""


class Policy:
    """A wrapper around an agent's tool calls and model calls; override any hook.

    Pass instances with ``app.agent(..., policies=[...])``. Each hook passes the call
    through unchanged unless overridden. A policy counting model calls::

        class CountCalls(Policy):
            def __init__(self) -> None:
                self.calls = 0

            async def around_model(self, call: ModelCall, call_next: ModelNext) -> ModelResponse:
                self.calls += 1
                return await call_next(call)

    A hook runs again when the run replays (a journaled model reply or tool result is
    returned without calling out again): count in the run's journal, not in memory,
    if the count must survive a crash.
    """

    async def admit_tool(self, use: ToolUse, call_next: ToolAdmitNext) -> ToolUse | ToolOutcome:
        """Decide whether a tool call runs: ``await call_next(use)`` (with other
        arguments if need be) to go on, or return a :class:`ToolOutcome` to refuse it
        (the model reads it). Raise :class:`~mainspring.ToolInputError` to ask the
        model to repair the call (counted against ``max_repairs``)."""
        return await call_next(use)

    async def around_tool(self, use: ToolUse, call_next: ToolNext) -> ToolOutcome:
        """Wrap running an admitted tool call (its journaled step)."""
        return await call_next(use)

    async def around_model(self, call: ModelCall, call_next: ModelNext) -> ModelResponse:
        """Wrap a model call (the rate limiter and its journaled step)."""
        return await call_next(call)


C = TypeVar("C")
R = TypeVar("R")


def compose(
    hooks: Sequence[Callable[[C, Callable[[C], Awaitable[R]]], Awaitable[R]]],
    last: Callable[[C], Awaitable[R]],
) -> Callable[[C], Awaitable[R]]:
    """One handler: ``hooks[0]`` outermost, ``last`` innermost."""
    handler = last
    for hook in reversed(hooks):
        handler = functools.partial(_step, hook, handler)
    return handler


async def _step(
    hook: Callable[[C, Callable[[C], Awaitable[R]]], Awaitable[R]],
    call_next: Callable[[C], Awaitable[R]],
    value: C,
) -> R:
    return await hook(value, call_next)
