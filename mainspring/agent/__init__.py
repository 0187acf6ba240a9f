"""Agents: the decision–execution loop on top of the durable journal, and the
policies that wrap its tool and model calls."""

from ._agent import Agent
from ._agent import CompletionValidator as CompletionValidator
from ._agent import split_tools as split_tools
from ._builtin import Allowlist, ApprovalRequired, ProviderRefusal, ToolCallBudget, ValidArguments
from ._call import call_model
from ._delegate import AgentTool
from ._delegate import AgentWorkflow as AgentWorkflow
from ._guard import LoopGuard
from ._loop import AgentLoop as AgentLoop
from ._policy import ModelCall, ModelNext, Policy, ToolAdmitNext, ToolNext, ToolOutcome, ToolUse
from ._state import AgentResult, PlanItem
from ._state import AgentState as AgentState

__all__ = [
    "Agent",
    "AgentResult",
    "AgentTool",
    "Allowlist",
    "ApprovalRequired",
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

# For the floors above (see docs/architecture.md, "Layers"), never for users:
__internal__ = (
    "AgentLoop",
    "AgentState",
    "AgentWorkflow",
    "CompletionValidator",
    "split_tools",
)
