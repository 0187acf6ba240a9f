"""Agents: the decision–execution loop on top of the durable journal, and the
policies that wrap its tool and model calls."""

from ._builtin import Allowlist, ApprovalRequired, ProviderRefusal, ToolCallBudget, ValidArguments
from ._call import call_model
from ._delegate import AgentTool, AgentWorkflow
from ._guard import LoopGuard
from ._loop import Agent, CompletionValidator
from ._policy import ModelCall, ModelNext, Policy, ToolAdmitNext, ToolNext, ToolOutcome, ToolUse
from ._state import AgentResult, AgentState, PlanItem

__all__ = [
    "Agent",
    "AgentResult",
    "AgentState",
    "AgentTool",
    "AgentWorkflow",
    "Allowlist",
    "ApprovalRequired",
    "CompletionValidator",
    "LoopGuard",
    "ModelCall",
    "ModelNext",
    "PlanItem",
    "Policy",
    "ProviderRefusal",
    "ToolAdmitNext",
    "ToolCallBudget",
    "ToolNext",
    "ToolOutcome",
    "ToolUse",
    "ValidArguments",
    "call_model",
]
