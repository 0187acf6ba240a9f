"""Context management: what each model request carries."""

from ._policy import ContextPolicy, History, Turn
from ._tokens import TokenCounter, counter_for

__all__ = ["ContextPolicy", "History", "TokenCounter", "Turn", "counter_for"]
