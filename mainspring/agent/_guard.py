"""Loop detection: the same call and result, the same error, or A-B-A-B alternation."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from ..context import Turn

__all__ = ["LoopGuard"]

Verdict = Literal["ok", "nudge", "stop"]


def _canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except (ValueError, RecursionError):
        return arguments


@dataclass(slots=True)
class LoopGuard:
    """Watches turns; nudges the model the first time it loops, stops it if it loops
    again before it has made ``recover_after`` turns in a row without looping.

    A long run meets an unrelated repetition now and then (a bad call repeated across a
    status check, hundreds of turns after the last one): after ``recover_after`` clean
    turns the guard nudges again rather than stopping a run that had recovered.
    Every input is journaled data, so the verdicts are the same on replay.
    """

    repeats: int = 3
    recover_after: int = 20
    _signatures: list[tuple[str, ...]] = field(default_factory=list)
    _errors: list[str] = field(default_factory=list)
    _nudged: bool = False
    _clean: int = 0  # turns in a row without a loop since the nudge

    def observe(self, turn: Turn) -> tuple[Verdict, str]:
        """The verdict on the newest turn, and what the model is doing wrong."""
        results = {r.tool_call_id: r for r in turn.results}
        signature = tuple(
            f"{c.name}:{_canonical(c.arguments)}=>{results[c.id].content if c.id in results else ''}"  # noqa: E501
            for c in turn.assistant.tool_calls
        ) or (f"text:{turn.assistant.text}",)
        self._signatures.append(signature)
        errors = [r.content for r in turn.results if r.is_error]
        self._errors.append(
            " | ".join(errors) if errors and len(errors) == len(turn.results) else ""
        )
        why = self._looping()
        if why is None:
            self._clean += 1
            if self._nudged and self._clean >= self.recover_after:
                self._nudged = False  # it recovered: the next loop is nudged afresh
            return "ok", ""
        self._clean = 0
        if self._nudged:
            return "stop", why
        self._nudged = True
        self._signatures.clear()  # after a nudge, it must loop afresh to be stopped
        self._errors.clear()
        return "nudge", why

    def _looping(self) -> str | None:
        s, n = self._signatures, self.repeats
        if len(s) >= n and all(x == s[-1] for x in s[-n:]):
            return f"repeating the same action and result {n} times in a row"
        e = self._errors
        if len(e) >= n and e[-1] and all(x == e[-1] for x in e[-n:]):
            return f"hitting the same error {n} times in a row: {e[-1][:200]}"
        if len(s) >= 4 and s[-1] == s[-3] and s[-2] == s[-4] and s[-1] != s[-2]:
            return "alternating between the same two actions (A-B-A-B)"
        return None
