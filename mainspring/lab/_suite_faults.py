"""The horizon suite's process and provider faults, and its approvals, kept in the world file.

Every contender (mainspring, a plain SDK loop, LangGraph, the OpenAI Agents SDK) meets
the same faults at the same places, drawn from the same seeds:

* **Kill points** (:meth:`SuiteFaults.kill_point`): at a ``"model"`` point (a reply
  arrived and was paid for, not yet used or saved), a ``"tool"`` point (inside
  :meth:`~mainspring.lab.SuiteWorld.call`, after the effect and before the result
  returns) and a ``"commit"`` point (right after the contender's own durable write
  returns), the process draws whether it is SIGKILLed. The draw is
  ``random.Random(f"kill:{seed}:{label}:{phase}:{count}")`` where ``count`` numbers the
  label's events of that phase from 0. The count is committed before the kill, so a
  restarted process meets the next draw, not the same one, and a point right after a
  kill never kills (a rate of 1 kills every other event): no kill point can loop.
* **Provider faults** (:class:`ProviderFaults`): the suite's model server draws each
  request's fault from ``random.Random(f"provider:{seed}:{label}:{n}")``, ``n`` the
  label's request count (faulted requests included).
* **Approvals** for contenders with no human-in-the-loop of their own
  (:meth:`SuiteFaults.request_approval`), answered by the harness's scripted reviewer
  as it answers mainspring's.

No pid or clock enters a draw: the same seed gives the same kill points and provider
faults.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sqlite3
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .. import ConfigError

__all__ = ["KillRates", "Phase", "ProviderFault", "ProviderFaults", "SuiteFaults"]

Phase = Literal["model", "tool", "commit"]
ProviderFault = Literal["server_error", "rate_limited", "timeout"]
PHASES: tuple[Phase, ...] = ("model", "tool", "commit")
FAULT_KINDS: tuple[ProviderFault, ...] = ("server_error", "rate_limited", "timeout")


def _probabilities(owner: object, names: tuple[str, ...]) -> None:
    """Refuse a rate among ``owner``'s fields ``names`` that is no probability."""
    for name in names:
        value = getattr(owner, name)
        if not (isinstance(value, int | float) and 0.0 <= value <= 1.0 and not math.isnan(value)):
            raise ConfigError(
                f"{type(owner).__name__}.{name} must be a probability in [0, 1], got {value!r}"
            )


@dataclass(frozen=True, slots=True)
class KillRates:
    """Per-event probability of a SIGKILL at each kill point.

    The defaults total about one kill per 50 steps (a step: a model call and a tool
    call, and the contender's commits).
    """

    model: float = 0.008
    tool: float = 0.008
    commit: float = 0.004

    def __post_init__(self) -> None:
        _probabilities(self, PHASES)

    def of(self, phase: Phase) -> float:
        """The rate at ``phase``."""
        return float(getattr(self, phase))


@dataclass(frozen=True, slots=True)
class ProviderFaults:
    """Per-request probability of each provider fault (10 % of requests in all by default).

    Attributes:
        server_error: a 500 or 503 in the provider's error JSON.
        rate_limited: a 429 with ``retry-after`` (``retry_after_s``) and ``x-ratelimit-*``.
        timeout: no reply within the client timeout: the reply comes after it.
        retry_after_s: what a 429 asks the client to wait.
        timeout_s: the client timeout every contender sets on its client
            (``SuiteModelServer.client_timeout_s``); a timeout fault answers after it.
    """

    server_error: float = 0.04
    rate_limited: float = 0.03
    timeout: float = 0.03
    retry_after_s: float = 1.0
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        _probabilities(self, FAULT_KINDS)
        if self.total > 1.0:
            raise ConfigError(f"ProviderFaults' rates add up to {self.total!r}, more than 1")
        if not self.retry_after_s >= 0 or not self.timeout_s > 0:
            raise ConfigError(
                "ProviderFaults needs retry_after_s >= 0 and timeout_s > 0, got "
                f"{self.retry_after_s!r} and {self.timeout_s!r}"
            )

    @property
    def total(self) -> float:
        """The share of requests that fail."""
        return self.server_error + self.rate_limited + self.timeout

    def draw(self, seed: int, label: str, n: int) -> ProviderFault | None:
        """The fault of request ``n`` (from 0) of ``label``, or ``None``."""
        point, edge = random.Random(f"provider:{seed}:{label}:{n}").random(), 0.0
        for kind in FAULT_KINDS:
            edge += getattr(self, kind)
            if point < edge:
                return kind
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class SuiteSettings:
    """What :meth:`SuiteFaults.configure` stored: the cell's seed and fault rates, and
    the policy's error rates (as a dict of :class:`~mainspring.lab.PolicyRates` fields)."""

    seed: int
    kills: KillRates
    provider: ProviderFaults
    policy: dict[str, float] = field(default_factory=dict)


#: Set by the harness in its contenders' environment: its pid.
HARNESS_PID_ENV = "MAINSPRING_SUITE_HARNESS_PID"
_watching: list[int] = []


def _watch_harness() -> None:
    """In a contender's process (a worker or a runner the harness started): exit once the
    harness is gone. A harness that is SIGKILLed (a test's timeout, an operator) cannot
    stop its children, and a worker left behind would go on claiming and running a
    finished cell's runs."""
    given = os.environ.get(HARNESS_PID_ENV)
    if not given or _watching or int(given) == os.getpid():
        return
    harness = int(given)
    _watching.append(harness)

    def watch() -> None:
        while True:
            try:
                os.kill(harness, 0)
            except ProcessLookupError:
                os._exit(3)
            except PermissionError:  # alive, someone else's (pid reuse): keep waiting
                pass
            threading.Event().wait(1.0)

    threading.Thread(target=watch, name="suite-harness-watch", daemon=True).start()


class SuiteFaults:
    """The cell's faults and approvals, in tables of the world's SQLite file.

    Args:
        path: the world file (:class:`~mainspring.lab.SuiteWorld`'s); every process
            opening it shares the counts.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._local = threading.local()
        self._settings: SuiteSettings | None = None
        _watch_harness()
        self._conn().executescript(
            """
            CREATE TABLE IF NOT EXISTS suite_config (
                id INTEGER PRIMARY KEY CHECK (id = 1), settings TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS suite_points (
                label TEXT NOT NULL, phase TEXT NOT NULL, count INTEGER NOT NULL,
                last_kill INTEGER NOT NULL, PRIMARY KEY (label, phase));
            CREATE TABLE IF NOT EXISTS suite_kills (
                id INTEGER PRIMARY KEY AUTOINCREMENT, label TEXT NOT NULL,
                phase TEXT NOT NULL, count INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS suite_requests (
                label TEXT PRIMARY KEY, n INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS suite_provider_faults (
                id INTEGER PRIMARY KEY AUTOINCREMENT, label TEXT NOT NULL,
                n INTEGER NOT NULL, kind TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS suite_approvals (
                label TEXT NOT NULL, key TEXT NOT NULL, tool TEXT NOT NULL,
                arguments TEXT NOT NULL, decision TEXT, PRIMARY KEY (label, key));
            """
        )

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            # WAL with NORMAL sync survives a killed process (not a power cut), which
            # is the fault here, and spares an fsync per counted event.
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            self._local.conn = conn
        return conn

    def _rows(self, select: str, label: str | None, then: str) -> list[Any]:
        """The rows of ``select`` (``SELECT ... FROM table``) of one run's ``label``, or of
        every run's when ``label`` is ``None``, then ``then`` (its grouping or order)."""
        sql, args = select, tuple[str, ...]()
        if label is not None:
            sql, args = sql + " WHERE label = ?", (label,)
        return self._conn().execute(f"{sql} {then}", args).fetchall()

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- configuration -------------------------------------------------------------

    def configure(
        self,
        seed: int,
        kills: KillRates,
        provider: ProviderFaults,
        *,
        policy: dict[str, float] | None = None,
    ) -> None:
        """Store the cell's seed and rates (once, before any contender process starts)."""
        settings = {
            "seed": int(seed),
            "kills": asdict(kills),
            "provider": asdict(provider),
            "policy": dict(policy or {}),
        }
        self._conn().execute(
            "INSERT OR REPLACE INTO suite_config (id, settings) VALUES (1, ?)",
            (json.dumps(settings),),
        )
        self._settings = None

    def settings(self) -> SuiteSettings | None:
        """What :meth:`configure` stored, or ``None`` when the file was never configured."""
        if self._settings is None:
            row = self._conn().execute("SELECT settings FROM suite_config").fetchone()
            if row is None:
                return None
            raw = json.loads(row[0])
            self._settings = SuiteSettings(
                seed=int(raw["seed"]),
                kills=KillRates(**raw["kills"]),
                provider=ProviderFaults(**raw["provider"]),
                policy=raw.get("policy") or {},
            )
        return self._settings

    # -- kill points ---------------------------------------------------------------

    def kill_point(self, label: str, phase: Phase) -> None:
        """Count this event of ``label`` at ``phase``; SIGKILL this process when its draw hits.

        A no-op when the file was never configured or the phase's rate is 0.

        Raises:
            ConfigError: an unknown phase.
        """
        if phase not in PHASES:
            raise ConfigError(f"unknown kill point phase {phase!r}; the phases are {PHASES}")
        settings = self.settings()
        if settings is None or settings.kills.of(phase) <= 0:
            return
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "SELECT count, last_kill FROM suite_points WHERE label = ? AND phase = ?",
                (label, phase),
            ).fetchone()
            count, last_kill = (0, -2) if row is None else (int(row[0]), int(row[1]))
            draw = random.Random(f"kill:{settings.seed}:{label}:{phase}:{count}").random()
            # Never twice in a row at one point: a restart always gets past it.
            hit = draw < settings.kills.of(phase) and last_kill != count - 1
            conn.execute(
                "INSERT OR REPLACE INTO suite_points (label, phase, count, last_kill) "
                "VALUES (?, ?, ?, ?)",
                (label, phase, count + 1, count if hit else last_kill),
            )
            if hit:
                conn.execute(
                    "INSERT INTO suite_kills (label, phase, count) VALUES (?, ?, ?)",
                    (label, phase, count),
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if hit:
            os.kill(os.getpid(), signal.SIGKILL)

    def kills(self, label: str | None = None) -> dict[str, int]:
        """How many kills each phase made (every phase present)."""
        found = dict(self._rows("SELECT phase, COUNT(*) FROM suite_kills", label, "GROUP BY phase"))
        return {phase: int(found.get(phase, 0)) for phase in PHASES}

    def kill_events(self, label: str | None = None) -> list[tuple[str, str, int]]:
        """Every kill as ``(label, phase, count)``, in the order they happened."""
        rows = self._rows("SELECT label, phase, count FROM suite_kills", label, "ORDER BY id")
        return [(str(a), str(b), int(c)) for a, b, c in rows]

    def events(self, label: str, phase: Phase) -> int:
        """How many events ``label`` counted at ``phase``."""
        row = (
            self._conn()
            .execute("SELECT count FROM suite_points WHERE label = ? AND phase = ?", (label, phase))
            .fetchone()
        )
        return 0 if row is None else int(row[0])

    # -- provider faults (the model server's bookkeeping) ------------------------------

    def next_request(self, label: str) -> int:
        """Count a model request of ``label``; its number, from 0."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT n FROM suite_requests WHERE label = ?", (label,)).fetchone()
            n = 0 if row is None else int(row[0])
            conn.execute(
                "INSERT OR REPLACE INTO suite_requests (label, n) VALUES (?, ?)", (label, n + 1)
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return n

    def record_provider_fault(self, label: str, n: int, kind: ProviderFault) -> None:
        """Record that request ``n`` of ``label`` met ``kind``."""
        self._conn().execute(
            "INSERT INTO suite_provider_faults (label, n, kind) VALUES (?, ?, ?)", (label, n, kind)
        )

    def provider_faults(self, label: str | None = None) -> dict[str, int]:
        """How many requests met each provider fault (every kind present)."""
        select = "SELECT kind, COUNT(*) FROM suite_provider_faults"
        found = dict(self._rows(select, label, "GROUP BY kind"))
        return {kind: int(found.get(kind, 0)) for kind in FAULT_KINDS}

    def provider_fault_events(self, label: str) -> list[tuple[int, str]]:
        """``(request number, kind)`` of every faulted request of ``label``, in order."""
        return [
            (int(n), str(kind))
            for n, kind in self._conn().execute(
                "SELECT n, kind FROM suite_provider_faults WHERE label = ? ORDER BY n", (label,)
            )
        ]

    # -- approvals -----------------------------------------------------------------

    def request_approval(self, label: str, key: str, tool: str, arguments: str) -> str | None:
        """Ask the reviewer to approve a call: ``"approved"``, ``"rejected"``, or ``None``
        while pending. The request is made once per ``(label, key)``; poll with the same."""
        conn = self._conn()
        conn.execute(
            "INSERT OR IGNORE INTO suite_approvals (label, key, tool, arguments) "
            "VALUES (?, ?, ?, ?)",
            (label, key, tool, arguments),
        )
        row = conn.execute(
            "SELECT decision FROM suite_approvals WHERE label = ? AND key = ?", (label, key)
        ).fetchone()
        return None if row[0] is None else str(row[0])

    def pending(self) -> list[tuple[str, str, str, str]]:
        """The unanswered requests: ``(label, key, tool, arguments)``."""
        rows = self._conn().execute(
            "SELECT label, key, tool, arguments FROM suite_approvals WHERE decision IS NULL "
            "ORDER BY rowid"
        )
        return [(str(a), str(b), str(c), str(d)) for a, b, c, d in rows]

    def answer(self, label: str, key: str, approved: bool) -> None:
        """Answer a request (an answered one keeps its first answer).

        Raises:
            KeyError: no such request.
        """
        done = self._conn().execute(
            "UPDATE suite_approvals SET decision = COALESCE(decision, ?) "
            "WHERE label = ? AND key = ?",
            ("approved" if approved else "rejected", label, key),
        )
        if done.rowcount == 0:
            raise KeyError(f"no approval request {key!r} of batch {label!r}")
