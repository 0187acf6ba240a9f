"""The agent's built-in policies, written with the same protocol as a user's (see
:mod:`._policy` for the order they run in)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from .._errors import StepFailed, ToolInputError
from ..hitl import approval
from ..models import ModelResponse
from ..tools import Tool, ToolRegistry
from ._policy import ModelCall, ModelNext, Policy, ToolAdmitNext, ToolOutcome, ToolUse

__all__ = [
    "Allowlist",
    "ApprovalRequired",
    "ProviderRefusal",
    "RetryTurn",
    "ToolCallBudget",
    "ValidArguments",
]

# Errors of the account, not of the request: a human fixes them, then the run resumes.
_STOP_FOR_HUMAN = frozenset({"PermissionDenied", "QuotaExhausted"})


class RetryTurn(Exception):  # a control-flow signal, not an error
    """The turn is asked again (a human resumed after a provider's refusal)."""


class Allowlist(Policy):
    """Only the agent's tools: any other name stops the run at once
    (:class:`~mainspring.UnknownTool` / :class:`~mainspring.ToolNotAllowed`)."""

    def __init__(self, tools: ToolRegistry, allowed: Collection[str]) -> None:
        self.tools = tools
        self.allowed = allowed

    async def admit_tool(self, use: ToolUse, call_next: ToolAdmitNext) -> ToolUse | ToolOutcome:
        tool = self.tools.resolve(use.call.name, self.allowed)
        return await call_next(dataclasses.replace(use, tool=tool))


class ValidArguments(Policy):
    """Validate the arguments against the tool's schema; a
    :class:`~mainspring.ToolInputError` goes back to the model to repair."""

    async def admit_tool(self, use: ToolUse, call_next: ToolAdmitNext) -> ToolUse | ToolOutcome:
        assert use.tool is not None  # the allowlist resolved it
        arguments = use.tool.prepare(use.call.arguments)
        return await call_next(dataclasses.replace(use, arguments=arguments))


class ToolCallBudget(Policy):
    """``max_tool_calls``: calls past the cap are not run (made for one turn: ``used``
    is the count before it, and it counts the calls admitted since)."""

    def __init__(self, cap: int | None, used: int) -> None:
        self.cap = cap
        self.used = used

    async def admit_tool(self, use: ToolUse, call_next: ToolAdmitNext) -> ToolUse | ToolOutcome:
        if self.cap is not None and self.used >= self.cap:
            return ToolOutcome(f"not run: the budget of {self.cap} tool calls is used up", True)
        admitted = await call_next(use)
        if isinstance(admitted, ToolUse):
            self.used += 1
        return admitted


class ApprovalRequired(Policy):
    """A human approves each call of a tool that ``requires_approval`` (irreversible
    effects by default): a durable wait on ``approval:<call id>``. A rejection is
    told to the model with the reviewer's reason; an edit replaces the arguments."""

    async def admit_tool(self, use: ToolUse, call_next: ToolAdmitNext) -> ToolUse | ToolOutcome:
        tool, args = use.tool, use.arguments
        assert tool is not None and args is not None  # resolved and validated
        if not tool.requires_approval:
            return await call_next(use)
        verdict = await _approve(use, tool, args)
        if isinstance(verdict, str):
            return ToolOutcome(verdict, True)
        return await call_next(dataclasses.replace(use, arguments=verdict))


async def _approve(
    use: ToolUse, tool: Tool[Any, Any], args: dict[str, Any]
) -> dict[str, Any] | str:
    """Wait durably for a reviewer; the approved (maybe edited) arguments, or why not."""
    decision = await approval(
        use.ctx,
        f"approval:{use.call.id}",
        title=f"run the {tool.effect} tool {tool.name!r}",
        preview={"tool": tool.name, "arguments": args, "effect": tool.effect},
    )
    if not decision.approved:
        by = f" ({decision.by})" if decision.by else ""
        why = f": {decision.reason}" if decision.reason else ""
        return f"{tool.name}: rejected by the reviewer{by}{why}"
    if decision.arguments is None:
        return args
    try:
        return tool.prepare(decision.arguments)
    except ToolInputError as exc:
        return f"{tool.name}: the reviewer's edited arguments are invalid: {exc.message}"


class ProviderRefusal(Policy):
    """A provider that refuses the account (``PermissionDenied``, ``QuotaExhausted``)
    pauses the run for a human (request ``resume``): approved, the turn is asked
    again; rejected, the run fails with the refusal."""

    async def around_model(self, call: ModelCall, call_next: ModelNext) -> ModelResponse:
        try:
            return await call_next(call)
        except StepFailed as exc:
            kind = exc.error_type.rsplit(".", 1)[-1]
            if kind not in _STOP_FOR_HUMAN:
                raise
            call.state.last_error = f"{kind}: {exc.message}"
            decision = await approval(  # a human fixes the account, then resumes
                call.ctx,
                "resume",
                title=f"the provider refused: {kind}; fix it, then approve to retry",
                preview={"error": f"{kind}: {exc.message}"},
            )
            if not decision.approved:
                raise
            raise RetryTurn from None
