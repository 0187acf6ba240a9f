"""The durable engine: run contexts, replay, step modes, sessions."""

from ._batch import BatchCommitter
from ._children import ChildHandle
from ._context import RunContext, SimulatedCrash, StepInfo, StepMode, current_step
from ._engine import ChildStarter, Committer, Engine, RunControl
from ._executor import Outcome, execute
from ._intercept import StepCall, StepInterceptor
from ._live import TokenWriter
from ._retry import RetryPolicy
from ._sticky import Execution
from ._workflow import Workflow

__all__ = [
    "BatchCommitter",
    "ChildHandle",
    "ChildStarter",
    "Committer",
    "Engine",
    "Execution",
    "Outcome",
    "RetryPolicy",
    "RunContext",
    "RunControl",
    "SimulatedCrash",
    "StepCall",
    "StepInfo",
    "StepInterceptor",
    "StepMode",
    "TokenWriter",
    "Workflow",
    "current_step",
    "execute",
]
