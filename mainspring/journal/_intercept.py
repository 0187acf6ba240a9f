"""Step interceptors: cross-cutting code around every attempt of every step function."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._stepinfo import StepInfo

__all__ = ["StepCall", "StepInterceptor", "intercept"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCall:
    """One attempt of a step function, as an interceptor sees it.

    Attributes:
        info: the step (run, position, name, role, attempt and idempotency key):
            ``info.role`` tells a model call (``"model"``) or a tool call (``"tool"``)
            from rate-limit bookkeeping and other steps.
        fn: the step function.
        args / kwargs: what it is called with.
    """

    info: StepInfo
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


class StepInterceptor(ABC):
    """Wraps every *executed* attempt of every ``ctx.step`` (a replay of a journaled
    step runs nothing and so is not intercepted).

    Pass interceptors to ``App(interceptors=[...])``; the first one is the outermost.
    What :meth:`execute_step` returns is the step's result, and what it raises is the
    attempt's error (retried by the step's policy like any other), so an interceptor
    can observe, time, rewrite or fail an attempt without touching the workflow.
    """

    @abstractmethod
    async def execute_step(self, call: StepCall, proceed: Callable[[], Awaitable[Any]]) -> Any:
        """Run the attempt: ``await proceed()`` calls the next interceptor, and the
        step function after the last one."""


async def intercept(
    interceptors: Sequence[StepInterceptor],
    call: StepCall,
    proceed: Callable[[], Awaitable[Any]],
) -> Any:
    """Run ``proceed`` inside ``interceptors`` (the first is the outermost)."""
    if not interceptors:
        return await proceed()
    if len(interceptors) == 1:  # the common case (telemetry alone): no extra frame
        return await interceptors[0].execute_step(call, proceed)
    first, rest = interceptors[0], interceptors[1:]
    return await first.execute_step(call, lambda: intercept(rest, call, proceed))
