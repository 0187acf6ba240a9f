"""The durable run a task is executing: its context and what it has spent, for the
journaled model and tools to find (a context variable: the SDK's tasks inherit it)."""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import mainspring as ms
from mainspring.limits import Limits, Price
from mainspring.models import ModelResponse

from .._budgets import Spent, ask_past_cap, reached

__all__ = ["Active", "Effect", "active"]

Effect = Literal["read", "write", "irreversible"]

_ACTIVE: contextvars.ContextVar[Active | None] = contextvars.ContextVar(
    "mainspring_oa_active", default=None
)


def active() -> Active | None:
    """The durable run this task is executing, if any."""
    return _ACTIVE.get()


@dataclass(kw_only=True, eq=False)
class Active:
    """One execution of a durable agent run: its context and what it has spent
    (rebuilt by replay: the counts come from journaled replies)."""

    ctx: ms.RunContext
    app: ms.App
    effects: Mapping[str, Effect]
    limits: Limits | None
    stream: bool
    account: str
    prices: dict[str, Price] | None
    rate_limits: Any
    spent: Spent = field(default_factory=Spent)
    approved: set[str] = field(default_factory=set)

    async def before_model(self) -> None:
        """Check the budgets before a model call: a cap reached pauses the run for a
        human (``budget:<limit>``: approve, with ``{"limit": N}`` to raise it) or,
        with ``on_exceeded="stop"``, ends it with :class:`BudgetExceeded`."""
        while (limits := self.limits) is not None:
            hit = reached(limits, self.spent.used())
            if hit is None:
                return
            which, cap, value = hit
            text = f"{which} reached: {value:g} of {cap:g}"
            decision = await ask_past_cap(self.ctx, limits, which, cap, value, text)
            raised = (decision.arguments or {}).get("limit")
            bumped = float(raised) if isinstance(raised, int | float) else value + max(cap, 1)
            self.limits = limits.raised(which, max(bumped, value + 1))

    def after_model(self, reply: ModelResponse) -> None:
        self.spent.reply(reply, reply.cost_usd or 0.0)

    def before_tool(self, name: str) -> None:
        self.spent.tool_calls += 1
