"""The ``research`` task: gather N facts over several sessions with a context limit.

Each fact takes a ``search`` (which names its source) and a ``read`` (which returns
its text). A session holds ``session_calls`` searches and reads (refused ones too:
they took room in the context); then the world's
``next`` says the session is over and the agent must ``handoff`` its notes (the
texts of the facts it read in the session). The world stores them, and the next
session starts with ``resume``, which says how many facts are noted and returns the
latest handoff's notes. When every fact is noted, ``report`` calls list them all, a
section of up to ``_REPORT_BATCH`` facts each (a tool result is cut at 4,000
characters by default, so no argument the world proposes may grow with N).

What the audit fails: a fact recorded twice (a handoff re-issued with a new
idempotency key appends its notes again: the notebook deduplicates by key only), a
fact lost across a handoff (read in a session but not in its notes, or a session
abandoned without a handoff), a fact never noted, a report that misses one. The
policy's *forget* error here is acting as if a handoff's notes were missing:
searching or reading a fact already noted, or resuming an older session; the world
refuses those and says where the notes are.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from typing import Any

from ._task_spec import PROGRESS, TaskSpec, TaskWorld, ToolDef, int_args, str_args

__all__ = ["RESEARCH", "ResearchWorld", "fact_text"]

_SESSION_CALLS = 8
_REPORT_BATCH = 10

RESEARCH = TaskSpec(
    "research",
    "Gather every fact of the batch: search a fact to find its source, read the source. "
    f"Your context holds {_SESSION_CALLS} searches and reads: when a session is over, "
    "hand off your notes (the facts you read in it); start the next session by resuming "
    "it. When every fact is noted, report them all, a section at a time. "
    "Call finish when done.",
    (
        PROGRESS,
        ToolDef("search", "Search for a fact; returns its source.", int_args("fact")),
        ToolDef("read", "Read a source; returns its fact.", int_args("source")),
        ToolDef(
            "handoff",
            "End the session: store its notes for the next one.",
            str_args("notes"),
            keyed=True,
        ),
        ToolDef("resume", "Start a session from the notes so far.", int_args("session")),
        ToolDef("report", "Add facts to the final report.", str_args("facts")),
    ),
    # A search and a read per fact, a handoff and a resume per four facts, and a
    # report per ten.
    calls_per_item=2 + 2 / (_SESSION_CALLS / 2) + 1 / 10,
    session_calls=_SESSION_CALLS,
)

_FACT = re.compile(r"F(\d+)=([0-9a-f]{6})")


def fact_text(fact: int) -> str:
    """Fact ``fact``'s text, as a read returns it and notes and reports carry it."""
    return f"F{fact}=" + hashlib.sha256(f"fact:{fact}".encode()).hexdigest()[:6]


def _facts(text: str) -> list[int]:
    """The true facts a notes or report text carries, in order, repeats included."""
    return [int(i) for i, digest in _FACT.findall(text) if fact_text(int(i)) == f"F{i}={digest}"]


def _source(fact: int) -> int:
    return 2 * fact + 1


def _notes(facts: list[int]) -> str:
    return "; ".join(fact_text(f) for f in facts)


class ResearchWorld(TaskWorld):
    spec = RESEARCH
    # phase: 'open' (a session runs) or 'handed' (its notes are stored; the next
    # session starts with resume). context: the facts searched or read this session.
    tables = """
        CREATE TABLE IF NOT EXISTS research_runs (
            label TEXT PRIMARY KEY, n INTEGER NOT NULL, session INTEGER NOT NULL DEFAULT 1,
            calls INTEGER NOT NULL DEFAULT 0, phase TEXT NOT NULL DEFAULT 'open',
            report TEXT);
        CREATE TABLE IF NOT EXISTS research_context (
            label TEXT NOT NULL, fact INTEGER NOT NULL, state TEXT NOT NULL,
            PRIMARY KEY (label, fact));
        CREATE TABLE IF NOT EXISTS research_notes (
            id INTEGER PRIMARY KEY AUTOINCREMENT, label TEXT NOT NULL,
            fact INTEGER NOT NULL, session INTEGER NOT NULL);
        CREATE TABLE IF NOT EXISTS research_lost (
            label TEXT NOT NULL, fact INTEGER NOT NULL, session INTEGER NOT NULL);
    """

    def create(self, label: str, items: int) -> None:
        self.conn().execute("INSERT INTO research_runs (label, n) VALUES (?, ?)", (label, items))

    def _run(self, label: str) -> tuple[int, int, int, str, str | None]:
        row = self.conn().execute(
            "SELECT n, session, calls, phase, report FROM research_runs WHERE label = ?",
            (label,),
        )
        n, session, calls, phase, report = row.fetchone()
        return int(n), int(session), int(calls), str(phase), report

    def _context(self, label: str) -> dict[int, str]:
        rows = self.conn().execute(
            "SELECT fact, state FROM research_context WHERE label = ? ORDER BY fact", (label,)
        )
        return {int(f): str(s) for f, s in rows}

    def _noted(self, label: str) -> dict[int, int]:
        """Each noted fact and the session whose handoff first noted it."""
        noted: dict[int, int] = {}
        for fact, session in self.conn().execute(
            "SELECT fact, session FROM research_notes WHERE label = ? ORDER BY id", (label,)
        ):
            noted.setdefault(int(fact), int(session))
        return noted

    def next(self, label: str) -> dict[str, Any]:
        n, session, calls, phase, report = self._run(label)
        if phase == "handed":
            return {"action": "resume", "session": session + 1}
        context = self._context(label)
        read = [f for f, s in context.items() if s == "read"]
        if calls >= RESEARCH.session_calls:
            return {"action": "handoff", "notes": _notes(read)}
        noted = self._noted(label)
        todo = next((f for f in range(n) if f not in noted and context.get(f) != "read"), None)
        if todo is not None:
            if context.get(todo) == "searched":
                return {"action": "read", "source": _source(todo)}
            return {"action": "search", "fact": todo}
        if read:
            return {"action": "handoff", "notes": _notes(read)}
        reported = set(_facts(report or ""))
        unreported = [f for f in range(n) if f not in reported]
        if unreported:
            return {"action": "report", "facts": _notes(unreported[:_REPORT_BATCH])}
        return {"action": "finish"}

    def apply(self, label: str, tool: str, args: dict[str, Any], key: str) -> dict[str, Any]:
        if tool == "progress":
            return {"ok": True}
        if tool == "handoff":
            return self._handoff(label, str(args["notes"]), key)
        if tool == "resume":
            return self._resume(label, int(args["session"]))
        n, session, calls, phase, _ = self._run(label)
        if phase == "handed":
            return {"ok": False, "error": f"session {session} is handed off: resume first"}
        if tool == "report":
            return self._report(label, str(args["facts"]))
        if calls >= RESEARCH.session_calls:
            return {"ok": False, "error": f"session {session}'s context is full: hand off"}
        self.conn().execute("UPDATE research_runs SET calls = calls + 1 WHERE label = ?", (label,))
        return self._look(label, tool, args, n)

    def _report(self, label: str, facts: str) -> dict[str, Any]:
        """The final answer, a batch at a time: appended to the run's report."""
        self.conn().execute(
            "UPDATE research_runs SET report = COALESCE(report || '; ', '') || ? WHERE label = ?",
            (facts, label),
        )
        return {"ok": True, "reported": len(_facts(facts))}

    def _look(self, label: str, tool: str, args: dict[str, Any], n: int) -> dict[str, Any]:
        """A ``search`` (a fact's source) or a ``read`` (a source's fact) in this
        session's context, of the run's ``n`` facts."""
        value = int(args["fact"] if tool == "search" else args["source"])
        fact = value if tool == "search" else (value - 1) // 2
        if not 0 <= fact < n or (tool == "read" and _source(fact) != value):
            return {"ok": False, "error": f"{tool} {value}: no such {next(iter(args))}"}
        noted = self._noted(label)
        if fact in noted:  # the forget error: acting as if a handoff's notes were missing
            return {
                "ok": False,
                "error": f"fact {fact} is in the notes handed off in session {noted[fact]}: "
                "it is noted already",
            }
        if self._context(label).get(fact) == "read":
            return {"ok": False, "error": f"fact {fact} was read in this session already"}
        state = "searched" if tool == "search" else "read"
        self.conn().execute(
            "INSERT INTO research_context (label, fact, state) VALUES (?, ?, ?)"
            " ON CONFLICT (label, fact) DO UPDATE SET state = excluded.state",
            (label, fact, state),
        )
        if tool == "search":
            return {"ok": True, "fact": fact, "source": _source(fact)}
        return {"ok": True, "source": value, "text": fact_text(fact)}

    @staticmethod
    def _end_session(conn: sqlite3.Connection, label: str, session: int, kept: list[int]) -> None:
        """Forget the session's context; what it read and ``kept`` lacks is lost."""
        lost = [
            f
            for (f,) in conn.execute(
                "SELECT fact FROM research_context WHERE label = ? AND state = 'read'", (label,)
            )
            if f not in kept
        ]
        conn.executemany(
            "INSERT INTO research_lost (label, fact, session) VALUES (?, ?, ?)",
            [(label, f, session) for f in lost],
        )
        conn.execute("DELETE FROM research_context WHERE label = ?", (label,))

    def _handoff(self, label: str, notes: str, key: str) -> dict[str, Any]:
        _, session, _, _, _ = self._run(label)
        facts = _facts(notes)

        def store(conn: sqlite3.Connection) -> None:
            # The notebook appends: a handoff re-issued with a new key notes twice.
            conn.executemany(
                "INSERT INTO research_notes (label, fact, session) VALUES (?, ?, ?)",
                [(label, f, session) for f in facts],
            )
            self._end_session(conn, label, session, facts)
            conn.execute(
                "UPDATE research_runs SET phase = 'handed', calls = 0 WHERE label = ?", (label,)
            )

        applied = self.ledger.apply(
            key, "handoff", {"label": label, "item": session, "facts": facts}, on_apply=store
        )
        return {"ok": True, "session": session, "noted": len(facts), "replayed": not applied}

    def _resume(self, label: str, wanted: int) -> dict[str, Any]:
        _, session, _, phase, _ = self._run(label)
        if wanted != session + 1:
            return {
                "ok": False,
                "error": f"resume {wanted}: session {session} is the last "
                f"({'handed off' if phase == 'handed' else 'open'}); the next is {session + 1}",
            }
        conn = self.conn()
        conn.execute("BEGIN IMMEDIATE")
        if phase == "open":  # a session abandoned without a handoff loses its context
            self._end_session(conn, label, session, [])
        conn.execute(
            "UPDATE research_runs SET session = ?, calls = 0, phase = 'open' WHERE label = ?",
            (wanted, label),
        )
        conn.execute("COMMIT")
        latest = [f for f, s in self._noted(label).items() if s == session]
        return {
            "ok": True,
            "session": wanted,
            "noted": len(self._noted(label)),
            "latest": _notes(sorted(latest)),
        }

    def duplicates(self, label: str) -> int:
        rows = self.conn().execute(
            "SELECT COUNT(*) - COUNT(DISTINCT fact) FROM research_notes WHERE label = ?",
            (label,),
        )
        return int(rows.fetchone()[0])

    def check(self, label: str, items: int) -> list[str]:
        conn = self.conn()
        problems = []
        for fact, count in conn.execute(
            "SELECT fact, COUNT(*) FROM research_notes WHERE label = ?"
            " GROUP BY fact HAVING COUNT(*) > 1 ORDER BY fact",
            (label,),
        ):
            problems.append(f"{label}: fact {fact} recorded {count} times")
        for fact, session in conn.execute(
            "SELECT fact, session FROM research_lost WHERE label = ? ORDER BY fact", (label,)
        ):
            problems.append(
                f"{label}: fact {fact} lost across a handoff (read in session {session}, "
                "not in its notes)"
            )
        missing = [f for f in range(items) if f not in self._noted(label)]
        if missing:
            problems.append(f"{label}: {len(missing)} fact(s) never noted: {missing[:10]}")
        report = self._run(label)[4]
        reported = set(_facts(report or ""))
        absent = [f for f in range(items) if f not in reported]
        if report is None:
            problems.append(f"{label}: no report")
        elif absent:
            problems.append(f"{label}: the report misses {len(absent)} fact(s): {absent[:10]}")
        return problems
