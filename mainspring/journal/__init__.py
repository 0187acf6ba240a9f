"""The durable engine: run contexts, replay, step modes, sessions."""

from ._batch import BatchCommitter as BatchCommitter
from ._children import ChildHandle
from ._context import RunContext, current_step
from ._context import SimulatedCrash as SimulatedCrash
from ._context import StepInfo as StepInfo
from ._context import StepMode as StepMode
from ._engine import Committer as Committer
from ._engine import Engine as Engine
from ._engine import RunControl as RunControl
from ._executor import Outcome as Outcome
from ._executor import execute as execute
from ._intercept import StepCall, StepInterceptor
from ._live import TokenWriter as TokenWriter
from ._replay import Replayed as Replayed
from ._replay import replay_engine as replay_engine
from ._replay import replay_journal as replay_journal
from ._retry import RetryPolicy
from ._sticky import Execution as Execution
from ._threads import InlineExecutor as InlineExecutor
from ._workflow import Workflow

__all__ = [
    "ChildHandle",
    "RetryPolicy",
    "RunContext",
    "StepCall",
    "StepInterceptor",
    "Workflow",
    "current_step",
]

# For the floors above (see docs/architecture.md, "Layers"), never for users:
__internal__ = (
    "BatchCommitter",
    "Committer",
    "Engine",
    "Execution",
    "InlineExecutor",
    "Outcome",
    "Replayed",
    "RunControl",
    "SimulatedCrash",
    "StepInfo",
    "StepMode",
    "TokenWriter",
    "execute",
    "replay_engine",
    "replay_journal",
)
