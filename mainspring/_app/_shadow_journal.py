"""What a shadow reads from a run's journal: its decisions (one per model reply), the
results of its tool calls keyed by the call that asked for them, and its tokens and
cost. Pure functions over :class:`~mainspring.storage.StepRecord` s, shared by the
recorded run and its shadow."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import SerializationError
from .._serde import decode, dumps, loads
from ..limits import Price, cost_usd
from ..models import ModelResponse
from ..storage import RunRecord, StepRecord

__all__ = [
    "Decision",
    "RecordedResults",
    "RecordedRun",
    "Usage",
    "argument_changes",
    "canonical",
    "decisions",
    "outcome",
    "position",
    "usage",
]


@dataclass(frozen=True, slots=True)
class RecordedRun:
    """A run as it was recorded: its row and its whole journal (every session). What
    :meth:`App.shadow <mainspring.App.shadow>` re-runs, read from a database or from a
    regression suite's file."""

    run: RunRecord
    steps: tuple[StepRecord, ...]


def position(session: int, seq: int) -> str:
    """``"session:seq"``, as ``fork`` and the dashboard name a journal position."""
    return f"{session}:{seq}"


def canonical(value: Any) -> str:
    """One text per value whatever its key order or type (a pydantic model and the dict
    it dumps to agree): how tool arguments are compared."""
    try:
        plain = loads(dumps(value))
    except SerializationError:
        plain = repr(value)
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return raw  # malformed arguments are a decision too: kept verbatim


def _response(row: StepRecord) -> ModelResponse | None:
    if row.role != "model" or row.status != "completed" or row.output is None:
        return None
    try:
        reply: ModelResponse = decode(row.output, ModelResponse)
    except SerializationError:
        return None  # an integration's own reply type: no decision to read
    return reply


@dataclass(frozen=True, slots=True)
class Decision:
    """One model reply: the tool calls it made (name and arguments), or its text.

    Attributes:
        position: its journal position, ``"session:seq"``.
        calls: ``(tool, arguments)`` in the order the model made them.
        text: the reply's text (the final answer when it made no call).
    """

    position: str
    calls: tuple[tuple[str, Any], ...]
    text: str | None

    @property
    def key(self) -> str:
        """What two decisions must share to be the same: the calls, else the text."""
        if self.calls:
            return canonical([[n, a] for n, a in self.calls])
        return canonical((self.text or "").strip())

    def summary(self, limit: int = 300) -> str:
        """``refund({"order": 7, "amount": 10}); finish(...)`` or the text, short."""
        if not self.calls:
            return f"text: {(self.text or '').strip()!r}"[:limit]
        shown = "; ".join(
            f"{n}({json.dumps(a, sort_keys=True, ensure_ascii=False, default=str)})"
            for n, a in self.calls
        )
        return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def decisions(steps: Sequence[StepRecord]) -> list[Decision]:
    """Every model reply of the journal, in order."""
    out = []
    for row in steps:
        reply = _response(row)
        if reply is not None:
            calls = tuple((c.name, _arguments(c.arguments)) for c in reply.tool_calls)
            out.append(Decision(position(row.session, row.seq), calls, reply.text))
    return out


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens and dollars of a journal's model replies."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    models: tuple[str, ...] = ()


def usage(steps: Sequence[StepRecord], prices: dict[str, Price] | None = None) -> Usage:
    """The model replies' usage: the cost each reply was journaled with, else priced
    from ``prices`` (default: ``limits.PRICES``) by the model that answered."""
    tokens_in = tokens_out = 0
    cost = 0.0
    models: dict[str, None] = {}
    for row in steps:
        reply = _response(row)
        if reply is None:
            continue
        tokens_in += reply.usage.input_tokens
        tokens_out += reply.usage.output_tokens
        model = reply.model or row.name.rsplit(":", 1)[-1]
        models[model] = None
        if reply.cost_usd is not None and prices is None:
            cost += reply.cost_usd
        else:
            cost += cost_usd(model, reply.usage, prices)
    return Usage(tokens_in, tokens_out, round(cost, 6), tuple(models))


@dataclass(slots=True)
class _Result:
    row: StepRecord
    key: str | None
    used: bool = False


@dataclass(slots=True)
class RecordedResults:
    """The journaled results of a run's tool calls (and plain steps), to answer a
    shadow's calls with.

    A tool's row is paired with the call of the model reply before it that asked for it
    (the n-th row of ``tool:X`` after a reply with the n-th call of ``X`` in it), so each
    result is known by tool name and arguments. :meth:`take` matches by name and
    arguments first, else by name and order (the first result of that name not given
    yet); each result is given once.
    """

    results: dict[str, list[_Result]] = field(default_factory=dict)

    @classmethod
    def of(
        cls, steps: Sequence[StepRecord], prepare: Callable[[str, Any], Any] | None = None
    ) -> RecordedResults:
        """``prepare(tool, arguments)``: the arguments as the tool's step received them
        (validated, defaults filled), so that they compare with a shadow's."""
        made = cls()
        asked: dict[str, list[Any]] = {}
        for row in steps:
            reply = _response(row)
            if reply is not None:
                asked = {}
                for c in reply.tool_calls:
                    asked.setdefault(c.name, []).append(_arguments(c.arguments))
                continue
            if row.kind != "step" or row.role in ("model", "rate", "wait", "child"):
                continue
            if row.status not in ("completed", "failed"):
                continue  # started and never ended: no result to give
            name = row.name.removeprefix("tool:") if row.role == "tool" else row.name
            key = None
            pending = asked.get(name) if row.role == "tool" else None
            if pending:
                arguments = pending.pop(0)
                if prepare is not None:
                    arguments = prepare(name, arguments)
                key = canonical(arguments)
            made.results.setdefault(name, []).append(_Result(row, key))
        return made

    def take(self, name: str, arguments: Any) -> tuple[StepRecord, str] | None:
        """The recorded result for a call of ``name`` with ``arguments`` (``None``: a
        plain step, matched by order only), and how it matched."""
        found = [r for r in self.results.get(name, ()) if not r.used]
        if arguments is not None:
            key = canonical(arguments)
            exact = next((r for r in found if r.key == key), None)
            if exact is not None:
                exact.used = True
                return exact.row, "journal: name and arguments"
        if not found:
            return None
        found[0].used = True
        return found[0].row, "journal: name and order"


def argument_changes(before: Any, after: Any, path: str = "") -> list[str]:
    """A readable diff of two calls' arguments, one line per change:
    ``amount: 10 → 25``, ``+ note: "rush"``, ``- cc: "a@b.c"``."""
    if isinstance(before, dict) and isinstance(after, dict):
        lines: list[str] = []
        for k in sorted(before.keys() | after.keys(), key=str):
            at = f"{path}.{k}" if path else str(k)
            if k not in after:
                lines.append(f"- {at}: {_shown(before[k])}")
            elif k not in before:
                lines.append(f"+ {at}: {_shown(after[k])}")
            else:
                lines += argument_changes(before[k], after[k], at)
        return lines
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        lines = []
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            lines += argument_changes(b, a, f"{path}[{i}]")
        return lines
    if canonical(before) == canonical(after):
        return []
    return [f"{path or '(arguments)'}: {_shown(before)} → {_shown(after)}"]


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 120 else text[:119] + "…"


def outcome(run: RunRecord) -> tuple[str | None, Any, str | None]:
    """``(result status, answer, error)`` of a run: an agent's ``AgentResult`` status
    (``"done"``, ``"partial"``) and answer, or a workflow's output; the error message
    of a failed run."""
    error = None
    if run.error:
        found = loads(run.error)
        error = str(found.get("message", found)) if isinstance(found, dict) else str(found)
    if run.output is None:
        return None, None, error
    value = loads(run.output)
    if isinstance(value, dict) and "status" in value and "answer" in value:
        return str(value["status"]), value["answer"], error
    return None, value, error
