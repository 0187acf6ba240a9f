"""What the model sees each turn: instructions, task and state, a summary of older
turns, and only the last few turns verbatim.

Resending the whole history costs O(n²) prompt tokens over n turns; this policy keeps
each request roughly constant, so the total grows O(n).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..models import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
    estimate_input_tokens,
)

__all__ = ["ContextPolicy", "History", "Turn"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextPolicy:
    """How much of the past each request carries.

    Args:
        recent_turns: turns shown verbatim (the model's calls and the tools' results).
        summary_line_chars: each older turn is summarised in one line of about this size.
        summary_chars: the summary keeps its newest lines within this size.
        max_input_tokens: a per-request budget (estimated); fewer verbatim turns are
            shown until the request fits. ``None``: no budget.
    """

    recent_turns: int = 4
    summary_line_chars: int = 240
    summary_chars: int = 4000
    max_input_tokens: int | None = None


@dataclass(slots=True, kw_only=True)
class Turn:
    """One model reply and what came back: tool results, or a runtime note."""

    assistant: AssistantMessage
    results: list[ToolResultMessage] = field(default_factory=list)
    note: str | None = None  # a repair request or nudge from the runtime

    def summary(self, width: int) -> str:
        parts = []
        for call in self.assistant.tool_calls:
            result = next((r for r in self.results if r.tool_call_id == call.id), None)
            outcome = "no result" if result is None else result.content.replace("\n", " ")
            flag = "error: " if result is not None and result.is_error else ""
            parts.append(f"{call.name}({_clip(call.arguments, width // 3)}) -> {flag}{outcome}")
        if not parts and self.assistant.text:
            parts.append(f"said: {self.assistant.text}")
        if self.note:
            parts.append(f"[runtime: {self.note}]")
        return _clip("; ".join(parts) or "(empty reply)", width)


@dataclass(slots=True)
class History:
    """The turns of the current session, with older ones folded into a summary."""

    turns: list[Turn] = field(default_factory=list)
    summary_lines: list[str] = field(default_factory=list)
    folded: int = 0  # turns already summarised

    def add(self, turn: Turn) -> None:
        self.turns.append(turn)

    def messages(
        self,
        *,
        instructions: str,
        task: str,
        state_block: str,
        earlier: str,
        policy: ContextPolicy,
        tools: list[ToolSpec],
        recent: int | None = None,
        count: Callable[[list[Message], list[ToolSpec]], int] = estimate_input_tokens,
    ) -> list[Message]:
        """The request for the next turn under ``policy``; ``count`` measures a request
        against ``policy.max_input_tokens``."""
        keep = policy.recent_turns if recent is None else recent
        while True:
            # Never show again what was already folded into the summary (a compaction).
            cut = max(self.folded, len(self.turns) - keep)
            self.fold(cut, policy)
            summary = "\n".join(self.summary_lines)
            if len(summary) > policy.summary_chars:
                summary = "(older turns omitted)\n" + summary[-policy.summary_chars :]
            context = [f"Task: {task}", "", "Current state:", state_block]
            if earlier:
                context += ["", "Earlier sessions:", earlier]
            if summary:
                context += ["", "Earlier turns (summary):", summary]
            messages: list[Message] = [
                SystemMessage(content=instructions),
                UserMessage(content="\n".join(context)),
            ]
            for turn in self.turns[cut:]:
                messages.append(turn.assistant)
                messages.extend(turn.results)
                if turn.note:
                    messages.append(UserMessage(content=turn.note))
            budget = policy.max_input_tokens
            if budget is None or keep == 0 or count(messages, tools) <= budget:
                return messages
            keep -= 1

    def fold(self, upto: int, policy: ContextPolicy) -> None:
        """Summarise the turns before ``upto`` (those not summarised yet)."""
        while self.folded < upto:
            turn = self.turns[self.folded]
            self.summary_lines.append(
                f"turn {self.folded + 1}: {turn.summary(policy.summary_line_chars)}"
            )
            self.folded += 1

    def full_messages(self, *, instructions: str, task: str) -> list[Message]:
        """Every turn verbatim: the naive policy, for comparison."""
        messages: list[Message] = [
            SystemMessage(content=instructions),
            UserMessage(content=f"Task: {task}"),
        ]
        for turn in self.turns:
            messages.append(turn.assistant)
            messages.extend(turn.results)
            if turn.note:
                messages.append(UserMessage(content=turn.note))
        return messages


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
