"""mainspring: a runtime that makes long-horizon AI agents reliable in production.

The public names are all here; everything else is private and may change.
"""

from ._app import App, RunHandle
from ._clock import Clock, FakeClock, SystemClock
from ._errors import (
    ApprovalRejected,
    BudgetExceeded,
    Cancelled,
    ConfigError,
    ContextOverflow,
    InvalidAnswer,
    LeaseLost,
    LoopDetected,
    MainspringError,
    ModelOutputError,
    NondeterminismError,
    PermissionDenied,
    QuotaExhausted,
    RateLimited,
    RequestNotFound,
    RunConflict,
    RunFailed,
    RunNotFound,
    SchemaVersionError,
    SerializationError,
    StepFailed,
    StepInterrupted,
    StepTimeout,
    StoreError,
    StoreUnavailable,
    ToolInputError,
    ToolNotAllowed,
    TransientError,
    UnknownTool,
    UnknownWorkflow,
    ValidationFailed,
    WaitTimeout,
)
from .agent import Agent, AgentResult, AgentState
from .context import ContextPolicy
from .hitl import Approval, Request
from .journal import RetryPolicy, RunContext, StepInfo, StepMode, Workflow, current_step
from .limits import Limits
from .observability import Redactor, RunTrace, TraceEntry
from .storage import RunRecord, StepRecord, Store
from .tools import Effect, Tool, ToolContext, tool
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentResult",
    "AgentState",
    "App",
    "Approval",
    "ApprovalRejected",
    "BudgetExceeded",
    "Cancelled",
    "Clock",
    "ConfigError",
    "ContextOverflow",
    "ContextPolicy",
    "Effect",
    "FakeClock",
    "InvalidAnswer",
    "LeaseLost",
    "Limits",
    "LoopDetected",
    "MainspringError",
    "ModelOutputError",
    "NondeterminismError",
    "PermissionDenied",
    "QuotaExhausted",
    "RateLimited",
    "Redactor",
    "Request",
    "RequestNotFound",
    "RetryPolicy",
    "RunConflict",
    "RunContext",
    "RunFailed",
    "RunHandle",
    "RunNotFound",
    "RunRecord",
    "RunTrace",
    "SchemaVersionError",
    "SerializationError",
    "StepFailed",
    "StepInfo",
    "StepInterrupted",
    "StepMode",
    "StepRecord",
    "StepTimeout",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "SystemClock",
    "Tool",
    "ToolContext",
    "ToolInputError",
    "ToolNotAllowed",
    "TraceEntry",
    "TransientError",
    "UnknownTool",
    "UnknownWorkflow",
    "ValidationFailed",
    "WaitTimeout",
    "Worker",
    "Workflow",
    "__version__",
    "current_step",
    "tool",
]
