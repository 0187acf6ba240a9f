"""Durable waits for a human, as functions of a run's context.

Kept for code written against them; each is one call of the public
:meth:`RunContext.request` (``ctx.approval``, ``ctx.gate`` and ``ctx.ask`` are the
methods to use).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from .._requests import Approval
from ..journal import RunContext

__all__ = ["approval", "ask", "gate"]


async def approval(
    ctx: RunContext,
    signal: str,
    *,
    title: str | None = None,
    preview: Any = None,
    timeout: float | None = None,
    default: Literal["approve", "reject"] = "reject",
) -> Approval:
    """Wait for a decision on the request ``signal``; after ``timeout`` the ``default``
    applies (see :meth:`RunContext.request`)."""
    return await ctx.request(signal, title=title, preview=preview, timeout=timeout, default=default)


async def gate(
    ctx: RunContext, name: str, *, preview: Any = None, timeout: float | None = None
) -> Approval:
    """A stage gate ``approval:<name>``: a rejection raises ``ApprovalRejected``."""
    return await ctx.gate(name, preview=preview, timeout=timeout)


async def ask(
    ctx: RunContext,
    signal: str,
    question: str,
    *,
    choices: Sequence[str] | None = None,
    timeout: float | None = None,
    default: str | None = None,
) -> str:
    """Ask ``question`` as the request ``signal``; the answer (see
    :meth:`RunContext.request`), or ``default`` after ``timeout`` (``WaitTimeout``
    without one)."""
    if default is None:
        return await ctx.request(
            signal, kind="question", title=question, choices=choices, timeout=timeout
        )
    return await ctx.request(
        signal, kind="question", title=question, choices=choices, timeout=timeout, default=default
    )
