"""The horizon suite's tasks, policies and world, as plain data and functions.

The interface a runner (mainspring's, or a peer's: a plain SDK loop, LangGraph, the
OpenAI Agents SDK) uses, none of it tied to mainspring's agent machinery:

* :data:`TASKS` maps a task name to a :class:`TaskSpec`: its tools (name, JSON
  schema of the arguments, whether a reviewer must approve the call), its
  instructions, and how many items a run of ``steps`` steps handles
  (:meth:`TaskSpec.items`: about one tool call per step on the clean path).
* :class:`SuiteWorld` is the outside world of every run of a cell, one SQLite file shared
  by processes: the items' states and the effect ledger
  (:class:`~mainspring.testing.EffectLedger`, whose tables live in the same file).
  :meth:`SuiteWorld.call` runs one tool call ``(label, tool, arguments, key)``;
  ``key`` is the call's idempotency key (the same on every re-execution of one
  call). It returns a JSON-ready dict that always carries ``next``: what the world
  says is to do next. :meth:`SuiteWorld.check` audits a run's end state,
  :meth:`SuiteWorld.duplicate_effects` counts effects that happened twice.
* :func:`decide` is the stochastic scripted policy that plays the model: from the
  messages it sees (the last tool result's ``next``) it picks the next tool call,
  and with the rates of :class:`PolicyRates` makes the errors models make —
  malformed arguments, the wrong tool, repeating its last call, forgetting progress
  (acting on an item already done). Each injected error is recorded in the world
  (:meth:`SuiteWorld.injected`) with each model call and its tokens
  (:meth:`SuiteWorld.model_calls`), crashes' re-paid calls included.

A run's task text is ``"<task> batch <label>"``; the label names the run's items.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
from dataclasses import dataclass
from typing import Any

from ..testing import EffectLedger
from ._suite_faults import SuiteFaults

__all__ = ["TASKS", "PolicyRates", "SuiteWorld", "TaskSpec", "ToolDef", "decide", "label_of"]


@dataclass(frozen=True, slots=True)
class ToolDef:
    """A tool of a task: its name, its arguments' JSON schema, and whether a reviewer
    approves each call (irreversible effects)."""

    name: str
    description: str
    parameters: dict[str, Any]
    approval: bool = False
    irreversible: bool = False


def _int_arg(name: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "integer"}},
        "required": [name],
        "additionalProperties": False,
    }


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task: its tools, instructions, and items per step count.

    Attributes:
        gate_every: migrate: a reviewer approves a checkpoint after this many writes.
        calls_per_item: tool calls per item on the clean path (sizes ``items``).
    """

    name: str
    instructions: str
    tools: tuple[ToolDef, ...]
    calls_per_item: float
    gate_every: int = 0

    def items(self, steps: int) -> int:
        """How many records or tickets a run of ``steps`` steps handles."""
        return max(1, round(steps / self.calls_per_item))

    def tool(self, name: str) -> ToolDef:
        return next(t for t in self.tools if t.name == name)


_PROGRESS = ToolDef(
    "progress",
    "What is left to do: the next action and its item.",
    {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
)

TASKS: dict[str, TaskSpec] = {
    "migrate": TaskSpec(
        "migrate",
        "Migrate every record of the batch: validate it, then write it; after every "
        "few writes ask a reviewer to approve a checkpoint. Call finish when done.",
        (
            _PROGRESS,
            ToolDef("validate", "Validate one record.", _int_arg("record")),
            ToolDef("write", "Write one validated record to the new store.", _int_arg("record")),
            ToolDef(
                "checkpoint", "Ask a reviewer to approve the writes so far.", _int_arg("upto"), True
            ),
        ),
        calls_per_item=2.2,
        gate_every=5,
    ),
    "support": TaskSpec(
        "support",
        "Work the ticket queue in order: open each ticket, refund it if it needs a "
        "refund (a reviewer approves each refund), then close it. Call finish when done.",
        (
            _PROGRESS,
            ToolDef("open_ticket", "Open a ticket and read it.", _int_arg("ticket")),
            ToolDef("refund", "Refund a ticket (irreversible).", _int_arg("ticket"), True, True),
            ToolDef("close_ticket", "Close a ticket.", _int_arg("ticket")),
        ),
        calls_per_item=2.2,
    ),
}


def label_of(task_text: str) -> str:
    """The run's label from its task text ``"<task> batch <label>"``."""
    return task_text.rsplit(" ", 1)[-1]


def _needs_refund(ticket: int) -> bool:
    return ticket % 5 == 2


class SuiteWorld:
    """The world of one cell's runs: items, effects and the model's calls, in one file.

    Args:
        path: the SQLite file (every process opening it shares it).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.ledger = EffectLedger(self.path)
        self.faults = SuiteFaults(self.path)
        self._local = threading.local()
        self._conn().executescript(
            """
            CREATE TABLE IF NOT EXISTS items (
                label TEXT NOT NULL, idx INTEGER NOT NULL, state TEXT NOT NULL,
                PRIMARY KEY (label, idx));
            CREATE TABLE IF NOT EXISTS runs (
                label TEXT PRIMARY KEY, task TEXT NOT NULL, n INTEGER NOT NULL,
                checkpoints INTEGER NOT NULL DEFAULT 0, run_id TEXT UNIQUE);
            CREATE TABLE IF NOT EXISTS model_calls (
                id INTEGER PRIMARY KEY AUTOINCREMENT, label TEXT NOT NULL,
                tokens INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS injected (
                id INTEGER PRIMARY KEY AUTOINCREMENT, label TEXT NOT NULL, kind TEXT NOT NULL);
            """
        )

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self._local.conn = conn
        return conn

    def close(self) -> None:
        self.ledger.close()
        self.faults.close()
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- setting up and auditing ---------------------------------------------------------

    def add_run(self, task: str, label: str, items: int) -> None:
        """Create a run's items (all ``new``)."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO runs (label, task, n) VALUES (?, ?, ?)", (label, task, items))
        conn.executemany(
            "INSERT INTO items (label, idx, state) VALUES (?, ?, 'new')",
            [(label, i) for i in range(items)],
        )
        conn.execute("COMMIT")

    def bind(self, label: str, run_id: str) -> None:
        """Record which run works on ``label`` (tools know their run id, not the label)."""
        self._conn().execute("UPDATE runs SET run_id = ? WHERE label = ?", (run_id, label))

    def label_for(self, run_id: str) -> str:
        row = self._conn().execute("SELECT label FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"no batch is bound to run {run_id!r}")
        return str(row[0])

    def check(self, label: str) -> list[str]:
        """What is wrong with a run's end state (empty: the task is done, exactly)."""
        conn = self._conn()
        task, n, checkpoints = conn.execute(
            "SELECT task, n, checkpoints FROM runs WHERE label = ?", (label,)
        ).fetchone()
        states = [s for (s,) in conn.execute("SELECT state FROM items WHERE label = ?", (label,))]
        done = "written" if task == "migrate" else "closed"
        problems = [f"{label}: {len(states) - states.count(done)} of {n} items not {done}"]
        if states.count(done) == n:
            problems = []
        effect = "write" if task == "migrate" else "refund"
        applied = self._effects(label, effect)
        want = n if task == "migrate" else sum(_needs_refund(i) for i in range(n))
        if sum(applied.values()) != want:
            problems.append(f"{label}: {sum(applied.values())} {effect} effects, expected {want}")
        if task == "migrate" and checkpoints < n // TASKS["migrate"].gate_every:
            problems.append(f"{label}: {checkpoints} checkpoints approved, expected {n // 5}")
        return problems

    def _effects(self, label: str, effect: str) -> dict[int, int]:
        """How many times each item's ``effect`` took place (by payload, any key)."""
        counts: dict[int, int] = {}
        for payload, applied in self._conn().execute(
            "SELECT payload, applied FROM effects WHERE effect = ?", (effect,)
        ):
            item = json.loads(payload)
            if item["label"] == label:
                counts[item["item"]] = counts.get(item["item"], 0) + int(applied)
        return counts

    def duplicate_effects(self, label: str | None = None) -> int:
        """Effects that happened more than once: a key applied twice, or one item's
        write or refund applied under two keys."""
        labels = (
            [label] if label else [r for (r,) in self._conn().execute("SELECT label FROM runs")]
        )
        extra = 0
        for one in labels:
            for effect in ("write", "refund"):
                extra += sum(c - 1 for c in self._effects(one, effect).values() if c > 1)
        return extra

    def model_calls(self, label: str | None = None) -> tuple[int, int]:
        """``(calls, tokens)`` the model was paid for, re-paid calls after crashes included."""
        sql, args = "SELECT COUNT(*), COALESCE(SUM(tokens), 0) FROM model_calls", tuple[str, ...]()
        if label:
            sql, args = sql + " WHERE label = ?", (label,)
        calls, tokens = self._conn().execute(sql, args).fetchone()
        return int(calls), int(tokens)

    def injected(self, label: str | None = None) -> dict[str, int]:
        """How many errors of each kind the policy made."""
        sql, args = "SELECT kind, COUNT(*) FROM injected", tuple[str, ...]()
        if label:
            sql, args = sql + " WHERE label = ?", (label,)
        return {k: int(n) for k, n in self._conn().execute(sql + " GROUP BY kind", args)}

    def record_model_call(self, label: str, tokens: int) -> None:
        """Count one model call that was paid for (a reply came back)."""
        self._conn().execute(
            "INSERT INTO model_calls (label, tokens) VALUES (?, ?)", (label, tokens)
        )

    def record_injected(self, label: str, kind: str) -> None:
        """Count one error the policy made on purpose."""
        self._conn().execute("INSERT INTO injected (label, kind) VALUES (?, ?)", (label, kind))

    # -- the tools -----------------------------------------------------------------------

    def next(self, label: str) -> dict[str, Any]:
        """What is to do next in a run: ``{"action": tool, <arg>: n}`` or ``finish``."""
        conn = self._conn()
        task, checkpoints = conn.execute(
            "SELECT task, checkpoints FROM runs WHERE label = ?", (label,)
        ).fetchone()
        rows = conn.execute(
            "SELECT idx, state FROM items WHERE label = ? ORDER BY idx", (label,)
        ).fetchall()
        if task == "migrate":
            written = sum(s == "written" for _, s in rows)
            gate = TASKS["migrate"].gate_every
            if written // gate > checkpoints:
                return {"action": "checkpoint", "upto": written}
            for idx, state in rows:
                if state == "new":
                    return {"action": "validate", "record": idx}
                if state == "validated":
                    return {"action": "write", "record": idx}
            return {"action": "finish"}
        for idx, state in rows:
            if state == "new":
                return {"action": "open_ticket", "ticket": idx}
            if state == "opened" and _needs_refund(idx):
                return {"action": "refund", "ticket": idx}
            if state in ("opened", "refunded"):
                return {"action": "close_ticket", "ticket": idx}
        return {"action": "finish"}

    def call(self, label: str, tool: str, arguments: dict[str, Any], key: str) -> dict[str, Any]:
        """Run one tool call of a run; the result always says what is ``next``.

        Arguments that do not fit the tool's schema get an error result (a runner
        with no validation of its own passes them through)."""
        task = self._conn().execute("SELECT task FROM runs WHERE label = ?", (label,)).fetchone()
        names = [t.name for t in TASKS[task[0]].tools] if task else []
        if tool not in names:
            done: dict[str, Any] = {"ok": False, "error": f"no tool {tool!r} in this task"}
        else:
            wanted = TASKS[task[0]].tool(tool).parameters["required"]
            if sorted(arguments) != sorted(wanted) or not all(
                isinstance(arguments[k], int) for k in wanted
            ):
                done = {"ok": False, "error": f"{tool} takes integer {wanted}, got {arguments!r}"}
            else:
                done = self._apply(label, tool, arguments, key)
        result = {**done, "next": self.next(label)}
        self.faults.kill_point(label, "tool")  # the effect is done, its result not yet back
        return result

    def _state(self, label: str, idx: int) -> str | None:
        row = (
            self._conn()
            .execute("SELECT state FROM items WHERE label = ? AND idx = ?", (label, idx))
            .fetchone()
        )
        return None if row is None else str(row[0])

    def _set(self, label: str, idx: int, state: str) -> None:
        self._conn().execute(
            "UPDATE items SET state = ? WHERE label = ? AND idx = ?", (state, label, idx)
        )

    def _apply(self, label: str, tool: str, args: dict[str, Any], key: str) -> dict[str, Any]:
        if tool == "progress":
            return {"ok": True}
        if tool == "checkpoint":
            self._conn().execute(
                "UPDATE runs SET checkpoints = MAX(checkpoints, ? / ?) WHERE label = ?",
                (int(args["upto"]), TASKS["migrate"].gate_every, label),
            )
            return {"ok": True, "approved_upto": args["upto"]}
        idx = int(args.get("record", args.get("ticket", -1)))
        state = self._state(label, idx)
        if state is None:
            return {"ok": False, "error": f"no item {idx}"}
        want = {
            "validate": ("new",),
            "write": ("validated",),
            "open_ticket": ("new",),
            "refund": ("opened",),
            "close_ticket": ("opened", "refunded"),
        }[tool]
        if state not in want:
            return {"ok": False, "error": f"{tool} {idx}: item is {state}"}
        if tool == "refund" and not _needs_refund(idx):
            return {"ok": False, "error": f"ticket {idx} needs no refund"}
        if tool == "close_ticket" and state == "opened" and _needs_refund(idx):
            return {"ok": False, "error": f"ticket {idx} needs its refund before closing"}
        if tool == "write" and self._needs_checkpoint(label):
            return {"ok": False, "error": "a checkpoint is due before more writes"}
        payload = {"label": label, "item": idx}
        after = {
            "validate": "validated",
            "write": "written",
            "open_ticket": "opened",
            "refund": "refunded",
            "close_ticket": "closed",
        }[tool]
        if tool == "write":  # an idempotent API: once per key, atomically with the state
            self.ledger.apply(
                key,
                "write",
                payload,
                on_apply=lambda c: c.execute(
                    "UPDATE items SET state = 'written' WHERE label = ? AND idx = ?", (label, idx)
                ),
            )
        elif tool == "refund":  # no deduplication: a second refund is a second refund
            self.ledger.apply_unsafe(f"refund:{label}:{idx}", "refund", payload)
            self._set(label, idx, after)
        else:
            self._set(label, idx, after)
        return {"ok": True, tool: idx, "needs_refund": _needs_refund(idx)}

    def _needs_checkpoint(self, label: str) -> bool:
        return bool(self.next(label)["action"] == "checkpoint")


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyRates:
    """How often the policy errs, per model call (probabilities)."""

    malformed: float = 0.03
    wrong_tool: float = 0.02
    repeat: float = 0.02
    forget: float = 0.02

    def items(self) -> list[tuple[str, float]]:
        return [
            ("malformed", self.malformed),
            ("wrong_tool", self.wrong_tool),
            ("repeat", self.repeat),
            ("forget", self.forget),
        ]


def decide(
    spec: TaskSpec,
    last_result: str | None,
    last_call: tuple[str, str] | None,
    rng: random.Random,
    rates: PolicyRates,
) -> tuple[str, str, str | None]:
    """The policy's next call ``(tool, arguments JSON, error kind or None)``.

    Args:
        last_result: the content of the last message when it is a tool result.
        last_call: the last call the model made ``(tool, arguments)``, if any.
    """
    nxt: dict[str, Any] | None = None
    if last_result is not None:
        try:
            parsed = json.loads(last_result)
            nxt = parsed.get("next") if isinstance(parsed, dict) else None
        except ValueError:
            nxt = None
    if not isinstance(nxt, dict) or "action" not in nxt:
        return "progress", "{}", None  # lost track: ask the world
    action = str(nxt["action"])
    if action == "finish":
        return "finish", json.dumps({"answer": "done"}), None
    arg = next(k for k in nxt if k != "action")
    value = int(nxt[arg])
    draw, edge = rng.random(), 0.0
    for kind, rate in rates.items():
        edge += rate
        if draw >= edge:
            continue
        if kind == "malformed":
            bad = rng.choice([f'{{"{arg}": ', json.dumps({arg: f"item {value}"})])
            return action, bad, kind
        if kind == "wrong_tool":
            others = [t.name for t in spec.tools if t.name not in (action, "progress")]
            return rng.choice(others), json.dumps({"upto" if arg == "upto" else arg: value}), kind
        if kind == "repeat" and last_call is not None:
            return last_call[0], last_call[1], kind
        if kind == "forget" and value > 0 and arg != "upto":
            return action, json.dumps({arg: rng.randrange(value)}), kind
        break
    return action, json.dumps({arg: value}), None
