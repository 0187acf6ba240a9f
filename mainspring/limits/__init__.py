"""Limits of agent runs: budgets, prices, and rate limits shared by every worker."""

from ._budget import PRICES, Limits, Price, cost_usd, price_of
from ._rate import Booking, Cost, RateLimit, RateLimiter
from ._shared import BoundRateLimits, RateLimits, StoreRateLimiter, load_rate_limits

__all__ = [
    "PRICES",
    "Booking",
    "BoundRateLimits",
    "Cost",
    "Limits",
    "Price",
    "RateLimit",
    "RateLimiter",
    "RateLimits",
    "StoreRateLimiter",
    "cost_usd",
    "load_rate_limits",
    "price_of",
]
