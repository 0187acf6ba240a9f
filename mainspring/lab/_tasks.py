"""The horizon suite's tasks, policies and world, as plain data and functions.

The interface a runner (mainspring's, or a peer's: a plain SDK loop, LangGraph, the
OpenAI Agents SDK) uses, none of it tied to mainspring's agent machinery:

* :data:`TASKS` maps a task name (``migrate``, ``support``, ``reconcile``,
  ``research``) to a :class:`TaskSpec`: its tools (name, JSON schema of the
  arguments, whether a reviewer must approve the call), its instructions, and how
  many items a run of ``steps`` steps handles (:meth:`TaskSpec.items`: about one
  tool call per step on the clean path). Each task's rules live in its own module
  (``_task_<name>.py``), a :class:`~._task_spec.TaskWorld` the world dispatches to.
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
  (acting on an item already done; in ``research``, acting as if a handoff's notes
  were missing). It never repeats a call whose tool is ``keyed`` (an effect the
  world deduplicates by idempotency key only). Each injected error is recorded in the world
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
from ._task_migrate import MigrateWorld
from ._task_reconcile import ReconcileWorld
from ._task_research import ResearchWorld
from ._task_spec import TaskSpec, TaskWorld, ToolDef
from ._task_support import SupportWorld

__all__ = ["TASKS", "PolicyRates", "SuiteWorld", "TaskSpec", "ToolDef", "decide", "label_of"]

_WORLDS: tuple[type[TaskWorld], ...] = (MigrateWorld, SupportWorld, ReconcileWorld, ResearchWorld)

TASKS: dict[str, TaskSpec] = {world.spec.name: world.spec for world in _WORLDS}


def label_of(task_text: str) -> str:
    """The run's label from its task text ``"<task> batch <label>"``."""
    return task_text.rsplit(" ", 1)[-1]


class SuiteWorld:
    """The world of one cell's runs: items, effects and the model's calls, in one file.

    Each task's rules live in its :class:`~._task_spec.TaskWorld`; this class keeps
    what every task shares (the runs, the effect ledger, the model's calls, the
    policy's errors) and hands each call to the run's task.

    Args:
        path: the SQLite file (every process opening it shares it).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.ledger = EffectLedger(self.path)
        self.faults = SuiteFaults(self.path)
        self._local = threading.local()
        self._tasks = {w.spec.name: w(self._conn, self.ledger) for w in _WORLDS}
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
            + "".join(w.tables for w in _WORLDS)
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

    def _task(self, label: str) -> tuple[TaskWorld, int] | None:
        """The run's task rules and item count (None: no such run)."""
        row = self._conn().execute("SELECT task, n FROM runs WHERE label = ?", (label,))
        found = row.fetchone()
        return None if found is None else (self._tasks[found[0]], int(found[1]))

    # -- setting up and auditing ---------------------------------------------------------

    def add_run(self, task: str, label: str, items: int) -> None:
        """Create a run's items (all ``new``).

        Raises:
            KeyError: ``task`` is not one of :data:`TASKS`.
        """
        if task not in self._tasks:
            raise KeyError(f"unknown task {task!r}; the suite has {sorted(self._tasks)}")
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("INSERT INTO runs (label, task, n) VALUES (?, ?, ?)", (label, task, items))
            self._tasks[task].create(label, items)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

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
        found = self._task(label)
        if found is None:
            return [f"{label}: no such run"]
        task, items = found
        return task.check(label, items)

    def duplicate_effects(self, label: str | None = None) -> int:
        """Effects that happened more than once: a key applied twice, or one item's
        effect (a write, a refund, an adjusting post, a fact's note) applied under two
        keys."""
        labels = (
            [label] if label else [r for (r,) in self._conn().execute("SELECT label FROM runs")]
        )
        extra = 0
        for one in labels:
            found = self._task(one)
            if found is not None:
                extra += found[0].duplicates(one)
        return extra

    def asked_again(self) -> int:
        """Tool calls of every run whose idempotency key had been called before (the
        world applied each key once: these are repeats it deduplicated)."""
        return sum(n - 1 for n in self.ledger.calls_by_key().values() if n > 1)

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
        """What is to do next in a run: ``{"action": tool, **arguments}`` or ``finish``."""
        found = self._task(label)
        if found is None:
            raise KeyError(f"no run is labelled {label!r}")
        return found[0].next(label)

    def call(self, label: str, tool: str, arguments: dict[str, Any], key: str) -> dict[str, Any]:
        """Run one tool call of a run; the result always says what is ``next``.

        Arguments that do not fit the tool's schema get an error result (a runner
        with no validation of its own passes them through)."""
        task = self._task(label)
        names = [t.name for t in task[0].spec.tools] if task else []
        if tool not in names:
            done: dict[str, Any] = {"ok": False, "error": f"no tool {tool!r} in this task"}
        else:
            misfit = task[0].spec.misfit(tool, arguments) if task else None
            if misfit:
                done = {"ok": False, "error": misfit}
            else:
                done = self._apply(label, tool, arguments, key)
        result = {**done, "next": self.next(label)}
        self.faults.kill_point(label, "tool")  # the effect is done, its result not yet back
        return result

    def _apply(self, label: str, tool: str, args: dict[str, Any], key: str) -> dict[str, Any]:
        found = self._task(label)
        assert found is not None  # call() checked the run
        return found[0].apply(label, tool, args, key)


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
    nxt = _next_action(last_result)
    if nxt is None:
        return "progress", "{}", None  # lost track: ask the world
    action = str(nxt["action"])
    if action == "finish":
        return "finish", json.dumps({"answer": "done"}), None
    args = {k: v for k, v in nxt.items() if k != "action"}
    kind = _drawn_error(rng, rates)
    wrong = None if kind is None else _wrong_call(spec, kind, action, args, last_call, rng)
    return wrong if wrong is not None else (action, json.dumps(args), None)


def _next_action(last_result: str | None) -> dict[str, Any] | None:
    """The next action the world named in the last tool result (``"next"``, with an
    ``"action"``); ``None``: the last message names none."""
    if last_result is None:
        return None
    try:
        parsed = json.loads(last_result)
    except ValueError:
        return None
    nxt = parsed.get("next") if isinstance(parsed, dict) else None
    return nxt if isinstance(nxt, dict) and "action" in nxt else None


def _drawn_error(rng: random.Random, rates: PolicyRates) -> str | None:
    """The kind of error this call is drawn to make (one draw against the rates laid
    end to end), or ``None``."""
    draw, edge = rng.random(), 0.0
    for kind, rate in rates.items():
        edge += rate
        if draw < edge:
            return kind
    return None


def _wrong_call(
    spec: TaskSpec,
    kind: str,
    action: str,
    args: dict[str, Any],
    last_call: tuple[str, str] | None,
    rng: random.Random,
) -> tuple[str, str, str | None] | None:
    """The call that makes the error ``kind`` instead of ``action(args)``; ``None``
    where this kind cannot be made of that call (then the call is made right)."""
    arg = next(iter(args), "")  # the first argument names the item
    value = args.get(arg)
    if kind == "malformed" and arg:
        wrong = f"item {value}" if isinstance(value, int) else len(str(value))
        bad = rng.choice([f'{{"{arg}": ', json.dumps({**args, arg: wrong})])
        return action, bad, kind
    if kind == "wrong_tool":
        others = [t.name for t in spec.tools if t.name not in (action, "progress")]
        return rng.choice(others), json.dumps(args), kind
    # A keyed call (deduplicated by idempotency key only) is never repeated on
    # purpose: a second one is a second effect, which no runtime can undo.
    if kind == "repeat" and last_call is not None and not _keyed(spec, last_call[0]):
        return last_call[0], last_call[1], kind
    if (
        kind == "forget"
        and isinstance(value, int)
        and value > 0
        and arg != "upto"
        and not _keyed(spec, action)
    ):
        return action, json.dumps({**args, arg: rng.randrange(value)}), kind
    return None


def _keyed(spec: TaskSpec, tool: str) -> bool:
    return any(t.name == tool and t.keyed for t in spec.tools)
