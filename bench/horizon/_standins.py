"""Stand-ins for the horizon branch's ``SuiteFaults`` and ``SuiteModelServer``.

Used only while ``mainspring.lab`` does not export them (see HORIZON.md): same names,
same methods, same tables-in-the-world-file idea, kept small. ``_faults.py`` picks the
real ones when they exist; once the horizon branch is merged this file can go.

One difference the stand-in world cannot hide: the real ``SuiteWorld.call`` runs the
``"tool"`` kill point itself; with these stand-ins the runners call it right after
``SuiteWorld.call`` returns (``TOOL_POINT_IN_WORLD = False``), the same place.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import threading
from dataclasses import asdict, dataclass
from typing import Any, Literal

from mainspring.lab import TASKS, PolicyRates, SuiteWorld, decide
from mainspring.models import Usage, estimate_tokens
from mainspring.testing import FakeOpenAIServer
from mainspring.testing._fake_common import FakeReply, RecordedRequest

TOOL_POINT_IN_WORLD = False

Phase = Literal["model", "tool", "commit"]


@dataclass(frozen=True, slots=True)
class KillRates:
    """Per-event probability of a SIGKILL at each point (HORIZON.md's defaults)."""

    model: float = 0.008
    tool: float = 0.008
    commit: float = 0.004


@dataclass(frozen=True, slots=True)
class ProviderFaults:
    """Per-request probability of each provider fault (HORIZON.md's defaults)."""

    server_error: float = 0.04
    rate_limited: float = 0.03
    timeout: float = 0.03
    retry_after_s: float = 1.0
    timeout_s: float = 30.0


class SuiteFaults:
    """Kill points and approvals, in the world's SQLite file (stand-in)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        # Frameworks call kill points from their own threads (LangGraph's node pool).
        self._local = threading.local()
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS standin_config (
                id INTEGER PRIMARY KEY CHECK (id = 1), seed INTEGER NOT NULL,
                kills TEXT NOT NULL, provider TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS standin_points (
                label TEXT NOT NULL, phase TEXT NOT NULL, n INTEGER NOT NULL,
                PRIMARY KEY (label, phase));
            CREATE TABLE IF NOT EXISTS standin_kills (label TEXT NOT NULL, phase TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS standin_approvals (
                label TEXT NOT NULL, key TEXT NOT NULL, tool TEXT NOT NULL,
                arguments TEXT NOT NULL, decision TEXT, PRIMARY KEY (label, key));
            """
        )

    @property
    def _db(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self._local.conn = conn
        return conn

    def configure(self, seed: int, kills: KillRates, provider: ProviderFaults) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO standin_config VALUES (1, ?, ?, ?)",
            (seed, json.dumps(asdict(kills)), json.dumps(asdict(provider))),
        )

    def config(self) -> tuple[int, KillRates, ProviderFaults] | None:
        row = self._db.execute("SELECT seed, kills, provider FROM standin_config").fetchone()
        if row is None:
            return None
        return row[0], KillRates(**json.loads(row[1])), ProviderFaults(**json.loads(row[2]))

    def kill_point(self, label: str, phase: Phase) -> None:
        config = self.config()
        if config is None:
            return
        seed, rates, _ = config
        self._db.execute("BEGIN IMMEDIATE")
        self._db.execute(
            "INSERT INTO standin_points VALUES (?, ?, 1) ON CONFLICT (label, phase) "
            "DO UPDATE SET n = n + 1",
            (label, phase),
        )
        (count,) = self._db.execute(
            "SELECT n FROM standin_points WHERE label = ? AND phase = ?", (label, phase)
        ).fetchone()
        hit = random.Random(f"kill:{seed}:{label}:{phase}:{count}").random() < getattr(rates, phase)
        if hit:
            self._db.execute("INSERT INTO standin_kills VALUES (?, ?)", (label, phase))
        self._db.execute("COMMIT")
        if hit:
            os.kill(os.getpid(), signal.SIGKILL)

    def kills(self, label: str | None = None) -> dict[str, int]:
        sql, args = "SELECT phase, COUNT(*) FROM standin_kills", ()
        if label is not None:
            sql, args = sql + " WHERE label = ?", (label,)
        return {p: int(n) for p, n in self._db.execute(sql + " GROUP BY phase", args)}

    def request_approval(self, label: str, key: str, tool: str, arguments: str) -> str | None:
        self._db.execute(
            "INSERT OR IGNORE INTO standin_approvals VALUES (?, ?, ?, ?, NULL)",
            (label, key, tool, arguments),
        )
        row = self._db.execute(
            "SELECT decision FROM standin_approvals WHERE label = ? AND key = ?", (label, key)
        ).fetchone()
        return None if row[0] is None else str(row[0])

    def pending(self) -> list[tuple[str, str, str, str]]:
        return [
            (str(a), str(b), str(c), str(d))
            for a, b, c, d in self._db.execute(
                "SELECT label, key, tool, arguments FROM standin_approvals WHERE decision IS NULL"
            )
        ]

    def answer(self, label: str, key: str, approved: bool) -> None:
        self._db.execute(
            "UPDATE standin_approvals SET decision = ? WHERE label = ? AND key = ?",
            ("approved" if approved else "rejected", label, key),
        )


class SuiteModelServer(FakeOpenAIServer):
    """OpenAI Chat Completions that plays ``decide`` per run label and injects the
    provider faults drawn per (seed, label, the label's request count) (stand-in)."""

    client_timeout_s = 2.0

    def __init__(self, world_path: str | os.PathLike[str]) -> None:
        super().__init__(fallback=self._play)
        self.world = SuiteWorld(world_path)
        config = SuiteFaults(world_path).config()
        self.seed, self.faults = (0, ProviderFaults()) if config is None else (config[0], config[2])
        self.rates = PolicyRates()
        self._requests: dict[str, int] = {}
        self._count_lock = threading.Lock()

    def _play(self, request: RecordedRequest) -> FakeReply:
        body = request.body if isinstance(request.body, dict) else {}
        messages: list[dict[str, Any]] = body.get("messages", [])
        text = next(str(m["content"]) for m in messages if m.get("role") == "user")
        label = text.rsplit(" ", 1)[-1]
        task = text.split(" ", 1)[0]
        with self._count_lock:
            self._requests[label] = n = self._requests.get(label, 0) + 1
        fault = random.Random(f"provider:{self.seed}:{label}:{n}")
        draw, f = fault.random(), self.faults
        if draw < f.server_error:
            return self.server_error(fault.choice([500, 503]))
        if draw < f.server_error + f.rate_limited:
            return self.rate_limited(f.retry_after_s)
        if draw < f.server_error + f.rate_limited + f.timeout:
            # Past the client's timeout; stop() cuts it short at the end of a cell.
            return self.error(504, "timed out", delay_s=self.client_timeout_s + 1.0)
        result = next((str(m["content"]) for m in reversed(messages) if m["role"] == "tool"), None)
        previous = next(
            (m["tool_calls"][0] for m in reversed(messages) if m.get("tool_calls")), None
        )
        made, _ = self.world.model_calls(label)
        rng = random.Random(f"horizon:{self.seed}:{label}:{made}")
        last = None
        if previous is not None:
            last = (previous["function"]["name"], previous["function"]["arguments"])
        tool, arguments, error = decide(TASKS[task], result, last, rng, self.rates)
        if error is not None:
            self.world.record_injected(label, error)
        usage = Usage(
            input_tokens=self.estimate_input_tokens(body),
            output_tokens=estimate_tokens(tool + arguments),
        )
        self.world.record_model_call(label, usage.input_tokens + usage.output_tokens)
        return self.tool_call(tool, arguments, usage=usage)
