"""Context management: what each model request carries."""

from ._policy import ContextPolicy, History, Turn

__all__ = ["ContextPolicy", "History", "Turn"]
