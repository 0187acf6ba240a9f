"""mainspring: a runtime that makes long-horizon AI agents reliable in production.

The public names are all here; everything else is private and may change.
"""

from . import (
    agent,
    context,
    hitl,
    journal,
    limits,
    models,
    observability,
    serde,
    storage,
    tools,
    worker,
)
from ._app import App, Queue, RunHandle, Schedule, TokenEvent, TokenFollower
from ._clock import Clock, FakeClock, SystemClock
from ._errors import (
    ApprovalRejected,
    BudgetExceeded,
    Cancelled,
    ChildCancelled,
    ChildFailed,
    ConfigError,
    ContextOverflow,
    InvalidAnswer,
    LeaseLost,
    LoopDetected,
    MainspringError,
    MissingExtra,
    ModelOutputError,
    NondeterminismError,
    Overloaded,
    PermissionDenied,
    QuotaExhausted,
    RateLimited,
    RequestNotFound,
    ReservedSignal,
    RunConflict,
    RunFailed,
    RunNotFound,
    RunWaiting,
    ScheduleNotFound,
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
from ._home import publish
from .agent import Agent, AgentResult, AgentState, call_model
from .context import ContextPolicy
from .hitl import Approval, Request
from .journal import (
    ChildHandle,
    RetryPolicy,
    RunContext,
    StepCall,
    StepInfo,
    StepInterceptor,
    StepMode,
    Workflow,
    current_step,
)
from .limits import Limits
from .observability import Redactor, RunTrace, TraceEntry
from .storage import (
    SCOPES,
    ApiKey,
    Delivery,
    RunRecord,
    Scope,
    StepRecord,
    Store,
    Webhook,
    WebhookEvent,
)
from .tools import Effect, Tool, ToolContext, tool
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "SCOPES",
    "Agent",
    "AgentResult",
    "AgentState",
    "ApiKey",
    "App",
    "Approval",
    "ApprovalRejected",
    "BudgetExceeded",
    "Cancelled",
    "ChildCancelled",
    "ChildFailed",
    "ChildHandle",
    "Clock",
    "ConfigError",
    "ContextOverflow",
    "ContextPolicy",
    "Delivery",
    "Effect",
    "FakeClock",
    "InvalidAnswer",
    "LeaseLost",
    "Limits",
    "LoopDetected",
    "MainspringError",
    "MissingExtra",
    "ModelOutputError",
    "NondeterminismError",
    "Overloaded",
    "PermissionDenied",
    "Queue",
    "QuotaExhausted",
    "RateLimited",
    "Redactor",
    "Request",
    "RequestNotFound",
    "ReservedSignal",
    "RetryPolicy",
    "RunConflict",
    "RunContext",
    "RunFailed",
    "RunHandle",
    "RunNotFound",
    "RunRecord",
    "RunTrace",
    "RunWaiting",
    "Schedule",
    "ScheduleNotFound",
    "SchemaVersionError",
    "Scope",
    "SerializationError",
    "StepCall",
    "StepFailed",
    "StepInfo",
    "StepInterceptor",
    "StepInterrupted",
    "StepMode",
    "StepRecord",
    "StepTimeout",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "SystemClock",
    "TokenEvent",
    "TokenFollower",
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
    "Webhook",
    "WebhookEvent",
    "Worker",
    "Workflow",
    "__version__",
    "call_model",
    "current_step",
    "tool",
]

# Users see mainspring.App, not mainspring._app._core.App (see _home.py); then the
# floors' own public names, which users import from their subpackage.
publish(__name__, __all__)
for _floor in (agent, context, hitl, journal, limits, models, observability, storage, tools):
    publish(_floor.__name__, _floor.__all__)
publish(serde.__name__, serde.__all__)
publish(worker.__name__, worker.__all__)
del _floor
