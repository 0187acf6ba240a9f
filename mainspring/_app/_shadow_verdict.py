"""What a shadow reports: per run, the first reply whose decisions differ, the calls
whose arguments changed, and each side's outcome, tokens and cost (see
:mod:`._shadow`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from ..limits import Price
from ..storage import RunRecord
from ._shadow_journal import (
    Decision,
    RecordedRun,
    argument_changes,
    decisions,
    outcome,
    usage,
)

__all__ = [
    "ArgumentChange",
    "ShadowReport",
    "ShadowRun",
    "ShadowSide",
    "StubAnswer",
    "compare",
    "side",
]

Verdict = Literal["same", "diverged", "error"]


@dataclass(frozen=True, slots=True)
class StubAnswer:
    """How one step of a shadow was answered.

    ``source``: ``"journal: position"`` (before ``from_step``), ``"journal: name and
    arguments"``, ``"journal: name and order"``, ``"stub"`` (the user's), ``"live"`` (a
    read run for real) or ``"missing"`` (a :class:`ShadowStubMissing` error)."""

    position: str
    step: str
    effect: str
    source: str


@dataclass(frozen=True, slots=True)
class ArgumentChange:
    """A tool call whose arguments differ between the recorded run and its shadow, in
    the same reply (``turn``, 1 for the first) and the same place among that tool's
    calls. ``changes``: one readable line per difference (``amount: 10 → 25``)."""

    turn: int
    tool: str
    before: Any
    after: Any
    changes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ShadowSide:
    """One side of the comparison: the recorded run or its shadow.

    ``status``: the run's; ``result``: an agent's result status (``"done"``,
    ``"partial"``), ``answer`` its answer (a workflow's output otherwise), ``error``
    the message of a failed run."""

    status: str
    result: str | None
    answer: Any
    error: str | None
    turns: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    models: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ShadowRun:
    """One recorded run and its shadow.

    Attributes:
        verdict: ``"same"`` (every reply and the outcome alike), ``"diverged"`` or
            ``"error"`` (the shadow could not run: ``message`` says why).
        turn: the first reply (1 for the first) whose tool calls or final answer
            differ; ``at``: its journal position in the recorded run (``None`` when the
            shadow made more replies than the recorded run had).
        before / after: that reply, recorded and shadowed (``None``: there was none).
        arguments: calls whose arguments differ, reply by reply.
        recorded / shadow: outcome, replies, tokens and cost of each.
        stubbed: how each step with an effect (and each journaled read) was answered.
    """

    run_id: str
    workflow: str
    from_step: str
    verdict: Verdict
    turn: int | None = None
    at: str | None = None
    before: str | None = None
    after: str | None = None
    arguments: tuple[ArgumentChange, ...] = ()
    recorded: ShadowSide | None = None
    shadow: ShadowSide | None = None
    stubbed: tuple[StubAnswer, ...] = ()
    effects_stubbed: int = 0
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ShadowReport:
    """Every run shadowed. ``diverged``: the runs whose decisions or outcome changed.

    ``decisions`` holds each shadow's replies (by run id), what a regression suite
    expects of the candidate; ``recordings`` the recorded runs it re-ran."""

    runs: list[ShadowRun]
    seconds: float
    candidate: dict[str, Any]
    scratch: str
    recordings: dict[str, RecordedRun] = field(default_factory=dict, repr=False)
    decisions: dict[str, list[Decision]] = field(default_factory=dict, repr=False)

    @property
    def diverged(self) -> list[ShadowRun]:
        return [r for r in self.runs if r.verdict != "same"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "shadowed": len(self.runs),
            "diverged": len(self.diverged),
            "seconds": round(self.seconds, 3),
            "candidate": self.candidate,
            "scratch": self.scratch,
            "runs": [r.to_dict() for r in self.runs],
        }


def side(run: RunRecord, steps: Sequence[Any], prices: dict[str, Price] | None) -> ShadowSide:
    result, answer, error = outcome(run)
    spent = usage(steps, prices)
    made = decisions(steps)
    return ShadowSide(
        status=run.status,
        result=result,
        answer=answer,
        error=error,
        turns=len(made),
        tool_calls=sum(
            1 for r in steps if r.role == "tool" and r.status in ("completed", "failed")
        ),
        input_tokens=spent.input_tokens,
        output_tokens=spent.output_tokens,
        cost_usd=spent.cost_usd,
        models=spent.models,
    )


def _changes(before: list[Decision], after: list[Decision]) -> tuple[ArgumentChange, ...]:
    """Calls of one tool at the same place of the same reply whose arguments differ."""
    out = []
    for turn, (b, a) in enumerate(zip(before, after, strict=False), start=1):
        seen: dict[str, int] = {}
        others: dict[str, list[Any]] = {}
        for name, args in a.calls:
            others.setdefault(name, []).append(args)
        for name, args in b.calls:
            n = seen[name] = seen.get(name, -1) + 1
            theirs = others.get(name, [])
            if n < len(theirs):
                lines = argument_changes(args, theirs[n])
                if lines:
                    out.append(ArgumentChange(turn, name, args, theirs[n], tuple(lines)))
    return tuple(out)


def compare(
    head: ShadowRun, before: list[Decision], after: list[Decision], recorded: ShadowSide,
    shadowed: ShadowSide,
) -> ShadowRun:  # fmt: skip
    """The verdict: the first reply whose calls or answer differ, and every changed
    call's arguments."""
    first = next(
        (
            i
            for i in range(max(len(before), len(after)))
            if i >= len(before) or i >= len(after) or before[i].key != after[i].key
        ),
        None,
    )
    same_end = (recorded.status, recorded.result, recorded.answer) == (
        shadowed.status,
        shadowed.result,
        shadowed.answer,
    )
    fields: dict[str, Any] = {
        "recorded": recorded,
        "shadow": shadowed,
        "arguments": _changes(before, after),
    }
    if first is None:
        verdict: Verdict = "same" if same_end else "diverged"
        message = "every reply alike" + ("" if same_end else "; the outcome differs")
        return replace(head, verdict=verdict, message=message, **fields)
    b = before[first] if first < len(before) else None
    a = after[first] if first < len(after) else None
    return replace(
        head,
        verdict="diverged",
        turn=first + 1,
        at=b.position if b is not None else None,
        before=b.summary() if b is not None else None,
        after=a.summary() if a is not None else None,
        message=f"the decisions part at reply {first + 1}"
        + (f" (recorded position {b.position})" if b is not None else ""),
        **fields,
    )
