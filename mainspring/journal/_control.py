"""How one execution of a run ends: the control flow that passes through user code.

These are ``BaseException`` subclasses raised by the engine inside the workflow's
task. A step never takes one for its function's failure (:data:`CONTROL`), and the
executor reads the first one decided to write the run's transition.
"""

from __future__ import annotations

from typing import Any

from .._describe import safe_str, safe_traceback
from .._errors import Cancelled, MainspringError
from .._serde import dumps
from ..storage import RunTransition

__all__ = [
    "CONTROL",
    "SimulatedCrash",
    "_Closed",
    "_ContinueAsNew",
    "_EngineFailure",
    "_Release",
    "_Suspend",
    "error_json",
]


class _Suspend(BaseException):
    """Control flow: the run leaves its worker until a time or a signal."""

    def __init__(self, transition: RunTransition) -> None:
        self.transition = transition


class _ContinueAsNew(BaseException):
    """Control flow: end this session and start the next from a hand-off."""

    def __init__(self, handoff: str) -> None:
        self.handoff = handoff


class _Release(BaseException):
    """Control flow: the worker is shutting down; give the run back."""


class _EngineFailure(BaseException):
    """Control flow: the engine failed under the workflow (the store stayed down, the
    lease was lost, replay met a different step).

    A ``BaseException`` carrying the public error, so that ``except Exception`` in
    workflow code cannot take it for a failed step and go on: the run waits for the
    store (it is abandoned to recovery), stops (lease lost) or fails with the error
    (nondeterminism), whatever the workflow does with it.
    """

    def __init__(self, error: MainspringError) -> None:
        super().__init__(error)
        self.error = error

    def __str__(self) -> str:
        return safe_str(self.error)


class _Closed(BaseException):
    """Control flow: the run's outcome is decided; a task still using the context
    (a sibling of ``gather``) must stop, and nothing more is journaled."""


class SimulatedCrash(BaseException):
    """Raise it in a test, from a step or a workflow, to stand for the process dying
    at that point: nothing after it is journaled, the run keeps its lease until it
    expires, and then a worker recovers it as after a real crash.

    Every other exception from user code, ``SystemExit`` included, is a failed step
    or a failed run; this one is the test's way of pulling the plug.
    """


# Mainspring's own control flow: passes through a step untouched, never a step failure.
CONTROL = (
    _Suspend,
    _ContinueAsNew,
    _Release,
    _EngineFailure,
    _Closed,
    Cancelled,
    SimulatedCrash,
    GeneratorExit,
)


def error_json(exc: BaseException, **extra: Any) -> str:
    """An exception as the journal holds it: type, message, step, retryable, traceback."""
    tb = safe_traceback(exc, limit=8)  # user exceptions may fail to render: never raise
    payload = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        # A mainspring error's bare message: the run and step have fields of their own.
        "message": safe_str(exc.message) if isinstance(exc, MainspringError) else safe_str(exc),
        **({"step": exc.step} if isinstance(exc, MainspringError) and exc.step else {}),
        "retryable": bool(getattr(exc, "retryable", True)),
        "traceback": tb[-4000:],
        **extra,
    }
    return dumps(payload, what="error")
