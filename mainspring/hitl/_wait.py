"""Durable waits for a human: approvals, stage gates and questions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from .._errors import ApprovalRejected, WaitTimeout
from .._requests import Approval, approval_from, request_meta
from .._serde import dumps
from ..journal._context import _MISSING

if TYPE_CHECKING:
    from ..journal._context import RunContext

__all__ = ["approval", "ask", "gate"]

_TIMED_OUT: Any = object()


async def approval(
    ctx: RunContext,
    signal: str,
    *,
    title: str | None = None,
    preview: Any = None,
    timeout: float | None = None,
    default: Literal["approve", "reject"] = "reject",
) -> Approval:
    """Wait for a decision on ``signal``; after ``timeout`` the ``default`` applies."""
    meta = dumps(request_meta("approval", title or f"approve {signal}", preview))
    payload = await ctx._wait(signal, timeout=timeout, default=_TIMED_OUT, request=meta)
    if payload is _TIMED_OUT:
        return Approval(
            approved=default == "approve",
            reason=f"no decision within {timeout:g} s; the default is {default!r}",
            timed_out=True,
        )
    return approval_from(payload)


async def gate(
    ctx: RunContext, name: str, *, preview: Any = None, timeout: float | None = None
) -> Approval:
    decision = await approval(
        ctx, f"approval:{name}", title=f"stage gate {name!r}", preview=preview, timeout=timeout
    )
    if not decision.approved:
        why = f": {decision.reason}" if decision.reason else ""
        who = f" by {decision.by}" if decision.by else ""
        raise ApprovalRejected(f"stage gate {name!r} rejected{who}{why}", run_id=ctx.run_id)
    return decision


async def ask(
    ctx: RunContext,
    signal: str,
    question: str,
    *,
    choices: Sequence[str] | None = None,
    timeout: float | None = None,
    default: Any = _MISSING,
) -> str:
    options = tuple(choices) if choices is not None else None
    meta = dumps(request_meta("question", question, None, options))
    payload = await ctx._wait(signal, timeout=timeout, default=_TIMED_OUT, request=meta)
    if payload is _TIMED_OUT:
        if default is _MISSING:
            raise WaitTimeout(f"no answer to {question!r} within {timeout:g} s", run_id=ctx.run_id)
        return str(default)
    if isinstance(payload, dict):
        return str(payload.get("answer", ""))
    return str(payload)
