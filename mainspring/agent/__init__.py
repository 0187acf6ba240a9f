"""Agents: the decision–execution loop on top of the durable journal."""

from ._call import call_model
from ._guard import LoopGuard
from ._loop import Agent, CompletionValidator
from ._state import AgentResult, AgentState, PlanItem

__all__ = [
    "Agent",
    "AgentResult",
    "AgentState",
    "CompletionValidator",
    "LoopGuard",
    "PlanItem",
    "call_model",
]
