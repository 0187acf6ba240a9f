"""The budgets of an agent run, checked before each turn: ``Limits``' caps (steps,
tool calls, tokens, cost, wall time), with a human who may raise one, and the cost
checkpoints. ``max_tool_calls`` also bounds the calls inside a turn
(:class:`~._builtin.ToolCallBudget`); ``max_rate_wait_s`` bounds rate-limit waits
(:func:`~._call.call_model`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..context import History
from ..hitl import approval
from ..journal import RunContext
from ..limits import Limits
from ..tools import ToolRegistry
from ._guard import LoopGuard
from ._state import AgentState

__all__ = ["Progress", "check_limits", "checkpoint"]


@dataclass(slots=True)
class Progress:
    """The mutable part of one session of an agent run (rebuilt by replay)."""

    state: AgentState
    limits: Limits
    started: float
    earlier: str
    sessions: int
    history: History = field(default_factory=History)
    guard: LoopGuard = field(default_factory=LoopGuard)
    failed_turns: int = 0
    session_turns: int = 0
    session_tokens: int = 0
    session_bytes: int = 0  # model replies and tool results journaled this session
    session_started: float = 0.0
    recent: int | None = None  # fewer verbatim turns after a context overflow
    # Reported prompt tokens / our count, smoothed: corrects the estimate for the model.
    calibration: float = 1.0
    # This session's tools (the agent's, plus what its toolsets listed) and allowlist.
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    allowed: tuple[str, ...] = ()


async def check_limits(ctx: RunContext, run: Progress) -> str | None:
    """Why the run stops (a cap reached, and ``on_exceeded="stop"`` or a human said
    stop), or ``None`` to go on (maybe with a cap a human raised)."""
    while True:
        exceeded = _exceeded(ctx, run)
        if exceeded is None:
            return None
        which, text, used = exceeded
        if run.limits.on_exceeded == "stop":
            return text
        # Pause and ask: approve (edit {"limit": 80} to set the new cap) or reject.
        # "used": an edit must set the cap above it (see hitl.answer_payload).
        current = getattr(run.limits, which)
        decision = await approval(
            ctx,
            f"budget:{which}",
            title=f"{text}: continue?",
            preview={
                "limit": which,
                "cap": current,
                "used": used,
                "state": run.state.block(),
            },
        )
        if not decision.approved:
            return f"{text}; stopped by a human"
        raised = (decision.arguments or {}).get("limit", current * 2)
        run.limits = run.limits.raised(which, raised)


async def checkpoint(ctx: RunContext, run: Progress) -> str | None:
    """Pause at each ``checkpoint_usd`` spent and ``checkpoint_tokens`` used."""
    s, lim = run.state, run.limits
    tokens = s.input_tokens + s.output_tokens
    for unit, every, used, passed in (
        ("usd", lim.checkpoint_usd, s.cost_usd, s.checkpoint_usd),
        ("tokens", lim.checkpoint_tokens, tokens, s.checkpoint_tokens),
    ):
        if not every or used < passed + every:
            continue
        mark = (used // every) * every
        decision = await approval(
            ctx,
            f"checkpoint:{unit}:{mark:g}",
            title=f"cost checkpoint: {used:g} {unit} used so far; continue?",
            preview={"unit": unit, "used": used, "every": every, "state": s.block()},
        )
        if not decision.approved:
            return f"stopped by a human at the {mark:g} {unit} checkpoint"
        if unit == "usd":
            s.checkpoint_usd = float(mark)
        else:
            s.checkpoint_tokens = int(mark)
    return None


def _exceeded(ctx: RunContext, run: Progress) -> tuple[str, str, float] | None:
    s, lim = run.state, run.limits
    checks: list[tuple[str, float | None, float]] = [
        ("max_steps", lim.max_steps, s.turns),
        ("max_tool_calls", lim.max_tool_calls, s.tool_calls),
        ("max_tokens", lim.max_tokens, s.input_tokens + s.output_tokens),
        ("max_cost_usd", lim.max_cost_usd, s.cost_usd),
    ]
    if lim.max_wall_s is not None:
        checks.append(("max_wall_s", lim.max_wall_s, ctx.now().timestamp() - run.started))
    for which, cap, used in checks:
        if cap is not None and used >= cap:
            return which, f"{which} reached ({used:g} of {cap:g})", used
    return None
