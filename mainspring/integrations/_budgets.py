"""The budgets (``Limits``' caps) of a run of another framework's agent: which cap a
run has reached, and the human who may let it go past.

Each integration counts its run's use its own way (model requests, graph nodes,
journaled replies), and all three judge it by the same rule, so it lives here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mainspring import Approval, BudgetExceeded, Limits, RunContext
from mainspring.models import ModelResponse

__all__ = ["Spent", "ask_past_cap", "reached"]


@dataclass(slots=True)
class Spent:
    """What an agent run has spent in this execution (rebuilt by replay: the counts
    come from journaled replies), counted as its budgets count it."""

    turns: int = 0  # model requests
    tool_calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0

    def reply(self, reply: ModelResponse, cost_usd: float) -> None:
        """Count one model reply: a turn, its tokens (prompt and reply) and its cost."""
        self.turns += 1
        self.tokens += reply.usage.input_tokens + reply.usage.output_tokens
        self.cost_usd += cost_usd

    def used(self) -> dict[str, float]:
        """Each budget's cap (its name in ``Limits``) and what was used of it, for
        :func:`reached`."""
        return {
            "max_steps": self.turns,
            "max_tool_calls": self.tool_calls,
            "max_tokens": self.tokens,
            "max_cost_usd": self.cost_usd,
        }


def reached(limits: Limits, used: Mapping[str, float]) -> tuple[str, float, float] | None:
    """``(name, cap, used)`` of the first budget of ``used`` (a cap's name in
    ``limits``, such as ``"max_steps"``, and what the run has used of it, in the order
    given) whose cap is set and reached; ``None`` while the run is within them all."""
    for which, value in used.items():
        cap = getattr(limits, which)
        if cap is not None and value >= cap:
            return which, cap, value
    return None


async def ask_past_cap(
    ctx: RunContext, limits: Limits, which: str, cap: float, used: float, text: str
) -> Approval:
    """What to do at a reached cap, before the next model request: with
    ``on_exceeded="stop"`` the run ends; otherwise it pauses for a human on the approval
    ``budget:<which>`` (``text`` says what was reached), and a rejection ends it.

    Returns:
        The approval: its ``arguments`` may name the new cap (``{"limit": N}``).

    Raises:
        BudgetExceeded: ``on_exceeded="stop"``, or the human said stop.
    """
    if limits.on_exceeded == "stop":
        raise BudgetExceeded(text, run_id=ctx.run_id)
    decision = await ctx.request(
        f"budget:{which}",
        kind="approval",
        title=f"{text}: continue?",
        preview={"limit": which, "cap": cap, "used": used},
    )
    if not decision.approved:
        raise BudgetExceeded(f"{text}; stopped by a human", run_id=ctx.run_id)
    return decision
