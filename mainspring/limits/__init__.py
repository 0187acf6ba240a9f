"""Limits of agent runs: budgets and prices (the shared rate limiter comes next)."""

from ._budget import PRICES, Limits, Price, cost_usd, price_of

__all__ = ["PRICES", "Limits", "Price", "cost_usd", "price_of"]
