"""The agent's structured state: kept outside the model, shown to it every turn."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Literal

from typing_extensions import TypeVar

__all__ = ["AgentResult", "AgentState", "PlanItem"]

OutputT = TypeVar("OutputT", default=Any)

PlanStatus = Literal["todo", "doing", "done", "dropped"]


@dataclass(slots=True, kw_only=True)
class PlanItem:
    text: str
    status: PlanStatus = "todo"


@dataclass(slots=True, kw_only=True)
class AgentState:
    """Goal, plan, facts, progress notes, counters and the last error.

    Rebuilt on replay from journaled model replies and tool results, carried across
    sessions in the hand-off, and rendered as a compact block in every request.
    """

    goal: str
    plan: list[PlanItem] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    last_error: str | None = None
    turns: int = 0
    tool_calls: int = 0
    repairs: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    summary: str = ""  # of turns no longer shown verbatim (and of earlier sessions)
    # The cost checkpoints a human has passed (in USD and in tokens).
    checkpoint_usd: float = 0.0
    checkpoint_tokens: int = 0

    def block(self) -> str:
        """The state as the model sees it: short, structured, current."""
        lines = [f"Goal: {self.goal}"]
        if self.plan:
            lines.append("Plan:")
            mark = {"todo": " ", "doing": "~", "done": "x", "dropped": "-"}
            lines += [f"  [{mark[p.status]}] {i}. {p.text}" for i, p in enumerate(self.plan, 1)]
        if self.facts:
            lines.append("Facts:")
            lines += [f"  - {f}" for f in self.facts[-20:]]
        if self.notes:
            lines.append("Progress notes:")
            lines += [f"  - {n}" for n in self.notes[-10:]]
        if self.last_error:
            lines.append(f"Last error: {self.last_error}")
        lines.append(f"Turns so far: {self.turns}; tool calls: {self.tool_calls}")
        return "\n".join(lines)

    def apply_update(self, update: dict[str, Any]) -> None:
        """Apply an ``update_state`` call (already validated)."""
        if update.get("plan") is not None:
            self.plan = [
                PlanItem(text=p["text"], status=p.get("status", "todo")) for p in update["plan"]
            ]
        for fact in update.get("facts") or ():
            if fact not in self.facts:
                self.facts.append(fact)
        if update.get("note"):
            self.notes.append(str(update["note"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentResult(Generic[OutputT]):
    """What an agent run returns.

    Attributes:
        status: ``"done"`` (it finished and its answer passed the validators),
            ``"partial"`` (a cap or a human stopped it; ``answer`` is ``None`` and
            ``state`` holds what was achieved).
        answer: the final answer; for an agent with an ``output_type``, the validated
            value of that type (stored as its JSON, rebuilt on reading). Also
            :attr:`output`.
        reason: why it stopped when not ``"done"``.
    """

    status: Literal["done", "partial"]
    answer: OutputT | None
    reason: str | None
    state: dict[str, Any]
    turns: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    sessions: int

    @property
    def output(self) -> OutputT | None:
        """The final answer, typed: an instance of the agent's ``output_type`` (the
        same value as :attr:`answer`; ``None`` when the run stopped ``"partial"``)."""
        return self.answer
