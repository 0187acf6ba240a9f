"""Tasks that workflow code creates must not be able to stop the event loop.

asyncio re-raises a ``SystemExit`` or ``KeyboardInterrupt`` that ends a task out of
the event loop itself, which would stop every run of a worker because of one
workflow's ``sys.exit()`` in a ``gather`` child. A task factory wraps the coroutine
of every task created *by workflow code* (a context variable marks it) so that
those two arrive as an ordinary exception, :class:`TaskExit`, at whoever awaits the
task; the run then fails with the original error. Tasks created elsewhere in the
process are left exactly as they are.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any

__all__ = ["TaskExit", "guard_workflow_tasks", "in_workflow"]

in_workflow: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "mainspring_in_workflow", default=False
)


class TaskExit(Exception):
    """A ``SystemExit`` or ``KeyboardInterrupt`` that ended a task of workflow code,
    carried as an ordinary exception (``error`` is the original)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


async def _guarded(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise TaskExit(exc) from exc


class _Factory:
    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Future[Any]:
        if in_workflow.get() and asyncio.iscoroutine(coro):
            coro = _guarded(coro)
        if self.previous is not None:
            task: asyncio.Future[Any] = self.previous(loop, coro, **kwargs)
            return task
        return asyncio.Task(coro, loop=loop, **kwargs)


def guard_workflow_tasks() -> None:
    """Install the task factory on the running loop (once; an existing factory is
    kept and called by it)."""
    loop = asyncio.get_running_loop()
    current = loop.get_task_factory()
    if not isinstance(current, _Factory):
        loop.set_task_factory(_Factory(current))
