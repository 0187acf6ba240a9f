"""The step being executed, as its function sees it (``current_step()``)."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

from ..storage import JournalRole

__all__ = ["StepInfo", "current", "current_step"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepInfo:
    """The step being executed, as seen from inside its function.

    Attributes:
        idempotency_key: ``"{run_id}:{session}:{seq}"``, the same on every attempt
            and after every crash. Pass it to the outside world so that a repeated
            call is recognised as the same one.
        role: what the step is, as ``ctx.step(..., role=...)`` declared it
            (``"model"``, ``"tool"``, ``"rate"``, ``"wait"`` or ``"step"``): what an
            interceptor asks to tell model and tool calls from other steps.
        turn: the seq (in this session) of the last model call that returned before
            this step, replayed or not: an agent's tool calls carry the turn that
            asked for them (``None`` before any model call).
    """

    run_id: str
    session: int
    seq: int
    name: str
    attempt: int
    role: JournalRole = "step"
    turn: int | None = None

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}:{self.session}:{self.seq}"


current: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar(
    "mainspring_step", default=None
)


def current_step() -> StepInfo:
    """The step whose function is running now (its idempotency key, attempt, ...).

    Raises:
        RuntimeError: called outside a step function.
    """
    info = current.get()
    if info is None:
        raise RuntimeError(
            "mainspring.current_step() was called outside a step: call it from a "
            "function run by ctx.step(...)"
        )
    return info
