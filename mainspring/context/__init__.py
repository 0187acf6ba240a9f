"""Context management: what each model request carries."""

from ._policy import ContextPolicy
from ._policy import History as History
from ._policy import Turn as Turn
from ._tokens import TokenCounter as TokenCounter
from ._tokens import counter_for as counter_for

__all__ = [
    "ContextPolicy",
]

# For the floors above (see docs/architecture.md, "Layers"), never for users:
__internal__ = (
    "History",
    "TokenCounter",
    "Turn",
    "counter_for",
)
