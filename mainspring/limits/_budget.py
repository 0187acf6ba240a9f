"""Budgets of an agent run: steps, tool calls, tokens, cost and wall time."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from ..models import Usage

__all__ = ["PRICES", "Limits", "Price", "cost_usd", "price_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Caps of one agent run. ``None``: no cap.

    Args:
        max_steps: model turns.
        max_tool_calls: tool calls in all.
        max_tokens: input plus output tokens in all.
        max_cost_usd: spend, from the price table.
        max_wall_s: seconds since the run started (journaled time).
        on_exceeded: ``"ask"`` pauses the run for a human decision (continue with a
            raised limit, or stop) before stopping it; ``"stop"`` ends it at once with
            its partial result.
        checkpoint_usd / checkpoint_tokens: pause for a human's go-ahead each time
            this much more is spent (USD) or used (input plus output tokens).
        max_rate_wait_s: how long one model call may be held back by the provider's
            refusals (429s, overloads) before the run pauses and asks a human
            (``budget:max_rate_wait_s``: approve to keep waiting, reject to stop with
            the partial result). ``None``: wait as long as the provider asks.
    """

    max_steps: int | None = 50
    max_tool_calls: int | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_wall_s: float | None = None
    on_exceeded: Literal["ask", "stop"] = "ask"
    checkpoint_usd: float | None = None
    checkpoint_tokens: int | None = None
    max_rate_wait_s: float | None = None

    def raised(self, which: str, value: float) -> Limits:
        """A copy with one limit changed (a human's "continue, up to ...")."""
        if which in ("max_steps", "max_tool_calls", "max_tokens"):
            return replace(self, **{which: int(value)})  # type: ignore[arg-type]
        if which in ("max_cost_usd", "max_wall_s", "max_rate_wait_s"):
            return replace(self, **{which: float(value)})  # type: ignore[arg-type]
        raise ValueError(f"no limit named {which!r}")


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cached_input: float | None = None


# Public list prices per million tokens (2026); override with Agent(prices=...).
PRICES: dict[str, Price] = {
    "gpt-4.1": Price(2.00, 8.00, 0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
    "gpt-4o": Price(2.50, 10.00, 1.25),
    "gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "o4-mini": Price(1.10, 4.40, 0.275),
    "claude-opus-4": Price(15.00, 75.00, 1.50),
    "claude-sonnet-4": Price(3.00, 15.00, 0.30),
    "claude-sonnet-4-5": Price(3.00, 15.00, 0.30),
    "claude-haiku-4-5": Price(1.00, 5.00, 0.10),
}


def price_of(model_id: str, prices: dict[str, Price] | None = None) -> Price | None:
    """The model's price: by exact id, else the longest known prefix
    ("gpt-4.1-mini-2025-04-14" → "gpt-4.1-mini"); None when the table has neither."""
    table = PRICES if prices is None else prices
    price = table.get(model_id)
    if price is None:
        known = [k for k in table if model_id.startswith(k)]
        price = table[max(known, key=len)] if known else None
    return price


def cost_usd(model_id: str, usage: Usage, prices: dict[str, Price] | None = None) -> float:
    """The cost of one request; 0 for a model the table does not know."""
    price = price_of(model_id, prices)
    if price is None:
        return 0.0
    cached = min(usage.cache_read_tokens, usage.input_tokens)
    cached_rate = price.cached_input if price.cached_input is not None else price.input
    return (
        (usage.input_tokens - cached) * price.input
        + cached * cached_rate
        + usage.output_tokens * price.output
    ) / 1_000_000
