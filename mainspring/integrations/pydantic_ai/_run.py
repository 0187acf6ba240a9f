"""One execution of a durable Pydantic AI agent run: the capability that journals it.

:class:`Durability` is a Pydantic AI capability passed to ``agent.run(capabilities=
[...])`` by the workflow ``durable()`` registers. Through Pydantic AI's public
extension points it puts a :class:`~._model.JournaledModel` around the model of every
request (``get_wrapper_model``) and a :class:`~._tools.JournaledToolset` around the
run's assembled toolset (``get_wrapper_toolset``: the agent's tools, toolsets passed to
the run, MCP servers), asks a human before an ``irreversible`` tool runs
(``before_tool_execute``), and answers deferred tool calls (``requires_approval``,
``ApprovalRequired``, ``CallDeferred``) with mainspring requests, durable waits that
``mainspring approve``, the API and the dashboard answer (``handle_deferred_tool_calls``).

Everything it decides comes from journaled values, so a replay takes the same path:
the budget counters below are rebuilt from the journaled replies as the run replays.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ApprovalRequired
from pydantic_ai.messages import ModelMessage, ModelResponseStreamEvent, ToolCallPart
from pydantic_ai.messages import ModelResponse as PaiResponse
from pydantic_ai.models import Model as PaiModel
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.settings import ModelSettings as PaiSettings
from pydantic_ai.tools import (
    DeferredToolRequests,
    DeferredToolResults,
    ToolApproved,
    ToolDefinition,
    ToolDenied,
)
from pydantic_ai.tools import RunContext as PaiContext
from pydantic_ai.toolsets import AbstractToolset

from mainspring import Approval, Limits, RetryPolicy, RunContext
from mainspring.agent import call_model
from mainspring.limits import BoundRateLimits, Price, cost_usd
from mainspring.models import ModelSettings

from .._budgets import Spent, ask_past_cap, reached
from ._model import JournaledModel, PydanticAIReply, Sender, rendering, to_response, tool_specs
from ._tools import JournaledToolset, ToolRules

__all__ = ["Durability", "RunSettings"]


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What ``durable()`` was given that each execution needs."""

    agent: str
    rules: ToolRules
    limits: Limits | None
    stream: bool
    rate_account: str
    model_retry: RetryPolicy | None
    prices: dict[str, Price] | None
    clock: Any  # the App's
    rng: Any
    inline_wait_s: float
    rate_limits: Callable[[], BoundRateLimits | None]


@dataclass(eq=False, kw_only=True)
class Durability(AbstractCapability[Any]):
    """The capability of one execution of a durable run (see the module)."""

    ctx: RunContext
    settings: RunSettings
    spent: Spent = field(default_factory=Spent)
    started: float | None = None  # journaled start, when max_wall_s asks for it
    limits: Limits | None = None
    request_ids: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.limits = self.settings.limits
        if self.limits is not None and self.limits.max_wall_s is not None:
            self.started = self.ctx.now().timestamp()

    # -- Pydantic AI's extension points ----------------------------------------------------

    def get_default_run_id(self) -> str | None:
        return f"mainspring-{self.ctx.run_id}-{self.ctx.session}"

    def get_wrapper_model(self, model: PaiModel) -> PaiModel | None:
        if isinstance(model, JournaledModel):
            return None
        return JournaledModel(model, self.request, stream=self.settings.stream)

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any] | None:
        return JournaledToolset(
            toolset, ctx=self.ctx, rules=self.settings.rules, on_call=self._count_call
        )

    async def before_tool_execute(
        self,
        ctx: PaiContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
    ) -> Any:
        rules = self.settings.rules
        if (
            tool_def.name not in rules.delegates
            and rules.effect(tool_def) == "irreversible"
            and not ctx.tool_call_approved
        ):
            raise ApprovalRequired(metadata={"effect": "irreversible"})
        return args

    async def handle_deferred_tool_calls(
        self, ctx: PaiContext[Any], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        approvals, calls = requests.approvals, requests.calls
        asked = [self._ask("approval", c, requests) for c in approvals]
        asked += [self._ask("question", c, requests) for c in calls]
        # All at once: the run lists every request of the turn and waits for them together.
        answers = await asyncio.gather(*asked)
        results = DeferredToolResults()
        for c, decision in zip(approvals, answers[: len(approvals)], strict=True):
            assert isinstance(decision, Approval)
            results.approvals[c.tool_call_id] = _approval(decision)
            if decision.by:
                results.answered_by[c.tool_call_id] = decision.by
        for c, answer in zip(calls, answers[len(approvals) :], strict=True):
            results.calls[c.tool_call_id] = _value(str(answer))
        return results

    def _ask(
        self,
        kind: Literal["approval", "question"],
        call: ToolCallPart,
        requests: DeferredToolRequests,
    ) -> Awaitable[Approval | str]:
        """The request a deferred call waits on: a human approves the call, or gives
        its result (a question); the title names the call and its arguments."""
        what = "approve" if kind == "approval" else "the result of"
        return self.ctx.request(
            self._request_id(kind, call),
            kind=kind,
            title=f"{what} {call.tool_name}({call.args_as_json_str():.200})",
            preview=_preview(call, requests),
        )

    # -- a model request -------------------------------------------------------------------

    async def request(
        self,
        wrapped: PaiModel,
        messages: list[ModelMessage],
        model_settings: PaiSettings | None,
        params: ModelRequestParameters,
        run_context: PaiContext[Any] | None,
        stream: bool,
    ) -> tuple[PaiResponse, list[ModelResponseStreamEvent], bool]:
        """One model request: budgets, then the rate limiter and the journaled step."""
        await self._check_limits()
        s = self.settings
        sender = Sender(wrapped, messages, model_settings, params, run_context, stream=stream)
        max_tokens = (model_settings or {}).get("max_tokens")
        reply = await call_model(
            self.ctx,
            sender,
            rendering(messages),
            tools=tool_specs(params),
            settings=ModelSettings(max_tokens=max_tokens) if max_tokens else None,
            rate_limits=s.rate_limits(),
            account=s.rate_account,
            retry=s.model_retry,
            max_rate_wait_s=self.limits.max_rate_wait_s if self.limits else None,
            prices=s.prices,
            clock=s.clock,
            rng=s.rng,
            inline_wait_s=s.inline_wait_s,
            reply_type=PydanticAIReply,
        )
        assert isinstance(reply, PydanticAIReply)
        cost = reply.cost_usd
        self.spent.reply(
            reply, cost if cost is not None else cost_usd(sender.model_id, reply.usage, s.prices)
        )
        return to_response(reply), sender.events, sender.sent

    # -- budgets ---------------------------------------------------------------------------

    def _count_call(self, name: str) -> None:
        self.spent.tool_calls += 1

    async def _check_limits(self) -> None:
        """Before each model request: a cap reached asks a human (``budget:<limit>``:
        approve, with ``{"limit": N}`` to set the new cap) or, with
        ``on_exceeded="stop"`` or a rejection, ends the run with :class:`BudgetExceeded`."""
        while self.limits is not None:
            lim = self.limits
            counts = self.spent.used()
            if self.started is not None:
                counts["max_wall_s"] = self.ctx.now().timestamp() - self.started
            hit = reached(lim, counts)
            if hit is None:
                return
            which, cap, used = hit
            text = f"agent {self.settings.agent!r}: {which} reached ({used:g} of {cap:g})"
            decision = await ask_past_cap(self.ctx, lim, which, cap, used, text)
            self.limits = lim.raised(which, (decision.arguments or {}).get("limit", cap * 2))

    def _request_id(self, kind: str, call: ToolCallPart) -> str:
        """``approval:<call id>`` (``question:`` for a result), unique in the run: a
        model may reuse a call id, and the second call is asked anew."""
        base = f"{kind}:{call.tool_call_id}"
        rid, n = base, 1
        while rid in self.request_ids:
            n += 1
            rid = f"{base}.{n}"
        self.request_ids.add(rid)
        return rid


def _preview(call: ToolCallPart, requests: DeferredToolRequests) -> dict[str, Any]:
    preview: dict[str, Any] = {
        "tool": call.tool_name,
        "arguments": requests.validated_args.get(call.tool_call_id, call.args_as_dict()),
    }
    meta = requests.metadata.get(call.tool_call_id)
    if meta:
        preview["metadata"] = meta
    return preview


def _approval(decision: Approval) -> ToolApproved | ToolDenied:
    if not decision.approved:
        return ToolDenied(decision.reason or "The tool call was denied.")
    return ToolApproved(override_args=decision.arguments or None)


def _value(answer: str) -> Any:
    """An answer given as JSON is that value; any other text is the text."""
    try:
        return json.loads(answer)
    except ValueError:
        return answer
