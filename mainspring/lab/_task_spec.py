"""What a horizon suite task is: its tools, its instructions, and the rules of its world.

A :class:`TaskSpec` is plain data a runner reads (tool names, argument schemas, which
calls a reviewer approves). A :class:`TaskWorld` is one task's rules inside the
shared :class:`~mainspring.lab.SuiteWorld` file: what is next, what a call does, what
the end state must be. One module per task holds its spec and its world
(``_task_migrate``, ``_task_support``, ``_task_reconcile``, ``_task_research``).
"""

from __future__ import annotations

import json
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..testing import EffectLedger

__all__ = ["PROGRESS", "TaskSpec", "TaskWorld", "ToolDef", "int_args", "str_args"]


@dataclass(frozen=True, slots=True)
class ToolDef:
    """A tool of a task: its name, its arguments' JSON schema, and whether a reviewer
    approves each call (irreversible effects).

    Attributes:
        keyed: the world deduplicates the call's effect only by its idempotency key (a
            second call with a new key is a second effect). The policy never repeats
            such a call on purpose: a model that posts twice is wrong in a way no
            runtime can undo, and the suite measures the runtime's duplicates.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    approval: bool = False
    irreversible: bool = False
    keyed: bool = False


def _args(kind: str, names: tuple[str, ...]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name in names},
        "required": list(names),
        "additionalProperties": False,
    }


def int_args(*names: str) -> dict[str, Any]:
    """The JSON schema of a tool taking these integer arguments."""
    return _args("integer", names)


def str_args(*names: str) -> dict[str, Any]:
    """The JSON schema of a tool taking these string arguments."""
    return _args("string", names)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task: its tools, instructions, and items per step count.

    Attributes:
        gate_every: migrate: a reviewer approves a checkpoint after this many writes.
        calls_per_item: tool calls per item on the clean path (sizes ``items``).
        session_calls: research: the context limit, in tool calls per session.
    """

    name: str
    instructions: str
    tools: tuple[ToolDef, ...]
    calls_per_item: float
    gate_every: int = 0
    session_calls: int = 0

    def items(self, steps: int) -> int:
        """How many records, tickets, entries or facts a run of ``steps`` steps handles."""
        return max(1, round(steps / self.calls_per_item))

    def tool(self, name: str) -> ToolDef:
        return next(t for t in self.tools if t.name == name)

    def misfit(self, tool: str, arguments: dict[str, Any]) -> str | None:
        """Why ``arguments`` do not fit ``tool``'s schema (None: they fit)."""
        schema = self.tool(tool).parameters
        wanted: list[str] = schema["required"]
        kinds = {k: v["type"] for k, v in schema["properties"].items()}
        fits = sorted(arguments) == sorted(wanted) and all(
            _is(kinds[k], arguments[k]) for k in wanted
        )
        if fits:
            return None
        shape = ", ".join(f"{k}: {kinds[k]}" for k in wanted) or "no arguments"
        return f"{tool} takes ({shape}), got {arguments!r}"


def _is(kind: str, value: object) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, str)


PROGRESS = ToolDef(
    "progress",
    "What is left to do: the next action and its item.",
    {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
)


class TaskWorld(ABC):
    """One task's rules over the world's SQLite file.

    Subclasses set :attr:`spec` and :attr:`tables` (their own ``CREATE TABLE IF NOT
    EXISTS`` statements) and implement the three rules. Every method gets the run's
    label; the world has already checked that the arguments fit the tool's schema.

    Args:
        conn: the world's connection (one per thread, autocommit).
        ledger: the effect ledger in the same file.
    """

    spec: ClassVar[TaskSpec]
    tables: ClassVar[str] = ""

    def __init__(self, conn: Callable[[], sqlite3.Connection], ledger: EffectLedger) -> None:
        self.conn = conn
        self.ledger = ledger

    def create(self, label: str, items: int) -> None:
        """Set up a run's items (inside the world's transaction): all ``new``."""
        self.conn().executemany(
            "INSERT INTO items (label, idx, state) VALUES (?, ?, 'new')",
            [(label, i) for i in range(items)],
        )

    @abstractmethod
    def next(self, label: str) -> dict[str, Any]:
        """What is to do next: ``{"action": tool, **arguments}`` or ``{"action": "finish"}``."""

    @abstractmethod
    def apply(self, label: str, tool: str, args: dict[str, Any], key: str) -> dict[str, Any]:
        """Run one call whose arguments fit the tool's schema."""

    @abstractmethod
    def check(self, label: str, items: int) -> list[str]:
        """What is wrong with a run's end state (empty: the task is done, exactly)."""

    def duplicates(self, label: str) -> int:
        """Effects of the run that happened more than once."""
        return 0

    # -- helpers for item state machines -----------------------------------------------

    def effects(self, label: str, effect: str) -> dict[int, int]:
        """How many times each item's ``effect`` took place (by payload, any key)."""
        counts: dict[int, int] = {}
        for payload, applied in self.conn().execute(
            "SELECT payload, applied FROM effects WHERE effect = ?", (effect,)
        ):
            item = json.loads(payload)
            if item["label"] == label:
                counts[item["item"]] = counts.get(item["item"], 0) + int(applied)
        return counts

    def states(self, label: str) -> list[tuple[int, str]]:
        return [
            (int(i), str(s))
            for i, s in self.conn().execute(
                "SELECT idx, state FROM items WHERE label = ? ORDER BY idx", (label,)
            )
        ]

    def state(self, label: str, idx: int) -> str | None:
        row = (
            self.conn()
            .execute("SELECT state FROM items WHERE label = ? AND idx = ?", (label, idx))
            .fetchone()
        )
        return None if row is None else str(row[0])

    def set_state(self, label: str, idx: int, state: str) -> None:
        self.conn().execute(
            "UPDATE items SET state = ? WHERE label = ? AND idx = ?", (state, label, idx)
        )

    def unfinished(self, label: str, items: int, done: str, effect: str, want: int) -> list[str]:
        """The audit every item state machine starts with: each of the run's ``items``
        reached ``done``, and ``effect`` took place ``want`` times in all (by payload,
        whatever the key)."""
        problems = []
        finished = [s for _, s in self.states(label)].count(done)
        if finished != items:
            problems.append(f"{label}: {items - finished} of {items} items not {done}")
        applied = sum(self.effects(label, effect).values())
        if applied != want:
            problems.append(f"{label}: {applied} {effect} effects, expected {want}")
        return problems

    def repeated(self, label: str, effect: str) -> int:
        """How many of the run's ``effect`` effects repeated one already made."""
        return sum(c - 1 for c in self.effects(label, effect).values() if c > 1)
