"""Queues: named limits on when runs start, kept in the store so that every worker
enforces them together (docs/schedules-and-queues.md).

A queue has any of: a concurrency limit (runs of the queue in progress at once), a
per-key limit (runs of one ``queue_key`` running at once: one at a time per
customer) and a rate of starts (GCRA: a start is admitted when the queue's
theoretical arrival time ``tat`` is at most ``(burst - 1) / rate`` ahead of now,
and moves it on by ``1 / rate``). Runs start by priority, higher first, then in
submission order.

What holds a slot: a run in progress, that is ``running`` (executing, or its lease
not yet run out) or sleeping on a retry back-off (between two attempts of a step:
it keeps its slot, and starts again once due without needing room). Any other
sleeping or waiting run holds none: a run waiting a day for an approval does not
block its queue, and a parent waiting for its child in the same queue cannot
deadlock it. A run that wakes from such a wait takes a slot again (before the
queue's fresh runs); only a first start (from ``queued``) counts against the rate.
A takeover of a run whose lease ran out keeps its slot: it never stopped being
``running``.

Every start of a run in a queue happens in :meth:`QueueTables._claim_queued`, in a
transaction that holds the queue's row (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; a
worker that finds it held leaves the queue to its holder for this claim; SQLite
serialises writers anyway), so two workers can never both take its last slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError
from ._connection import Connection, Cursor
from ._rows import _claimable_sql
from ._transitions import claim

__all__ = ["ClaimTerms", "QueueRecord", "QueueTables", "check_queue_limits", "ready_queues_sql"]

# The runs of a queue that wait for a slot: fresh ones, and woken ones (their wake
# time has come).
_FRESH = "status = 'queued'"
_WOKEN = "status IN ('sleeping', 'waiting') AND wake_at <= {at}"
# Runs sleeping on a retry back-off keep their slot (``keeps_slot``, set by their
# suspend): counted as held, and, once due, started without needing room.
_HOLDING = "status = 'sleeping' AND keeps_slot = 1"
_HELD_WOKEN = _HOLDING + " AND wake_at <= {at}"
_WOKEN_UNHELD = "status IN ('sleeping', 'waiting') AND wake_at <= {at} AND keeps_slot = 0"


def ready_queues_sql(wf_sql: str, woken: str) -> str:
    """A condition on ``ms_queues q``: the queue has a run of ``wf_sql`` waiting for a
    slot. Each probe is an ordered top-1 on the queue's partial index, which the
    planner keeps to (an ``EXISTS`` lets it scan the whole table for a first row)."""
    return (
        f"(SELECT id FROM ms_runs WHERE queue = q.name AND {_FRESH}{wf_sql}"
        " ORDER BY priority DESC, created_at LIMIT 1) IS NOT NULL"
        f" OR (SELECT id FROM ms_runs WHERE queue = q.name AND {woken}{wf_sql}"
        " ORDER BY wake_at LIMIT 1) IS NOT NULL"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueRecord:
    """A queue's declared limits and what it holds now.

    Attributes:
        concurrency: runs of the queue running at once (``None``: no limit).
        per_key: runs of one ``queue_key`` running at once (``None``: no limit).
        rate: starts per second (``None``: no limit); ``burst`` of them may start
            back to back.
        running / queued / waiting: runs of the queue running, queued (never
            started, or given back), and sleeping or waiting.
        retrying: of the sleeping runs, those on a retry back-off: each keeps its
            slot (``concurrency`` counts ``running + retrying``).
    """

    name: str
    concurrency: int | None
    per_key: int | None
    rate: float | None
    burst: int
    running: int = 0
    queued: int = 0
    waiting: int = 0
    retrying: int = 0


def check_queue_limits(
    name: str,
    concurrency: int | None,
    per_key: int | None,
    rate: float | None,
    burst: int,
) -> None:
    """Raise :class:`ConfigError` naming what is wrong with a queue's limits."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ConfigError(f"a queue needs a name of 1 to 200 characters, got {name!r}")
    for what, value in (("concurrency", concurrency), ("per_key", per_key)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConfigError(f"queue {name!r}: {what} must be an int >= 1 or None, got {value!r}")
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < 1e9
    ):
        raise ConfigError(
            f"queue {name!r}: rate must be a number of starts per second > 0 or None, got {rate!r}"
        )
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise ConfigError(f"queue {name!r}: burst must be an int >= 1, got {burst!r}")


class QueueTables(Connection):
    """Declaring queues, their summary, and starting their runs within their limits:
    methods of every :class:`~mainspring.storage.Store`."""

    _queue_turn = 0  # where the next claim starts among queues (fairness)

    def declare_queue(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        per_key: int | None = None,
        rate: float | None = None,
        burst: int = 1,
        now: float,
    ) -> QueueRecord:
        """Create the queue ``name`` or set its limits (every worker enforces what
        the store holds; the last declaration wins). Its rate state is kept.

        Raises:
            ConfigError: a limit is not valid.
        """
        check_queue_limits(name, concurrency, per_key, rate, burst)
        with self._write() as cur:
            cur.execute(
                "INSERT INTO ms_queues (name, concurrency, per_key, rate, burst, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET"
                " concurrency = excluded.concurrency, per_key = excluded.per_key,"
                " rate = excluded.rate, burst = excluded.burst, updated_at = excluded.updated_at",
                (name, concurrency, per_key, None if rate is None else float(rate), burst, now),
            )
        return QueueRecord(
            name=name, concurrency=concurrency, per_key=per_key, rate=rate, burst=burst
        )

    def queues(self) -> list[QueueRecord]:
        """Every queue with its limits and its runs by state, by name."""
        with self._read() as cur:
            cur.execute(
                "SELECT name, concurrency, per_key, rate, burst FROM ms_queues ORDER BY name"
            )
            rows = cur.fetchall()
            cur.execute(
                "SELECT queue, status, COUNT(*) FROM ms_runs WHERE queue IS NOT NULL"
                " AND status IN ('queued', 'running', 'sleeping', 'waiting')"
                " GROUP BY queue, status"
            )
            counts: dict[tuple[str, str], int] = {(q, s): int(n) for q, s, n in cur.fetchall()}
            cur.execute(
                f"SELECT queue, COUNT(*) FROM ms_runs WHERE queue IS NOT NULL AND {_HOLDING}"
                " GROUP BY queue"
            )
            held: dict[str, int] = {q: int(n) for q, n in cur.fetchall()}
        return [
            QueueRecord(
                name=r[0],
                concurrency=r[1],
                per_key=r[2],
                rate=r[3],
                burst=r[4],
                running=counts.get((r[0], "running"), 0),
                queued=counts.get((r[0], "queued"), 0),
                waiting=counts.get((r[0], "sleeping"), 0) + counts.get((r[0], "waiting"), 0),
                retrying=held.get(r[0], 0),
            )
            for r in rows
        ]

    def get_queue(self, name: str) -> QueueRecord | None:
        """One queue of :meth:`queues`, or ``None``."""
        return next((q for q in self.queues() if q.name == name), None)

    def queue_backlog(
        self,
        workflows: Sequence[str] | None = None,
        versions: Sequence[str | None] | None = None,
    ) -> bool:
        """Whether a run of these workflows (and code versions, as :meth:`claim`
        takes them) waits in a queue for its first start: a worker that would stop
        when idle has work coming once a slot frees or the rate admits it."""
        names = list(workflows) if workflows is not None else None
        if names == []:
            return False
        wf_sql, params = _claimable_sql(names, versions)
        with self._read() as cur:
            cur.execute(
                "SELECT 1 FROM ms_queues q WHERE (SELECT id FROM ms_runs WHERE queue = q.name"
                f" AND {_FRESH}{wf_sql} ORDER BY priority DESC, created_at LIMIT 1) IS NOT NULL"
                " LIMIT 1",
                params,
            )
            return cur.fetchone() is not None

    def _claim_queued(self, cur: Cursor, terms: ClaimTerms, *, left: int, alone: bool) -> list[str]:
        """Start up to ``left`` runs of queues within their limits, in ``cur``'s
        transaction; their ids, in claim order. ``alone``: the claim took nothing
        else and its caller executes nothing (a suspect may be taken, then alone)."""
        wf_sql, wf_params = terms.wf
        at_sql, at_params = terms.at
        woken = _WOKEN.format(at=at_sql)
        if terms.run_id is not None:
            # A claim by id starts its run only in its turn: when no run of its queue
            # that this claim could start comes before it.
            cur.execute(
                f"SELECT queue FROM ms_runs WHERE id = ? AND queue IS NOT NULL"
                f" AND ({_FRESH} OR ({woken})){wf_sql}",
                [terms.run_id, *at_params, *wf_params],
            )
            names = [r[0] for r in cur.fetchall()]
            left = min(left, 1)
        else:
            cur.execute(
                f"SELECT name FROM ms_queues q WHERE {ready_queues_sql(wf_sql, woken)}"
                " ORDER BY name",
                [*wf_params, *at_params, *wf_params],
            )
            names = [r[0] for r in cur.fetchall()]
        if not names:
            return []
        # Each claim starts one queue further on, so that no queue always goes first.
        turn = self._queue_turn % len(names)
        self._queue_turn += 1
        claimed: list[str] = []
        for name in names[turn:] + names[:turn]:
            if len(claimed) >= left:
                break
            cur.execute(
                "SELECT concurrency, per_key, rate, burst, tat, CAST("
                f"{at_sql} AS DOUBLE PRECISION) FROM ms_queues WHERE name = ?{self._lock_clause}",
                [*at_params, name],
            )
            row = cur.fetchone()
            if row is None:  # held by another claim: its holder starts its runs now
                continue
            start = _QueueStart(
                terms, name, row, left=left - len(claimed), alone=alone and not claimed
            )
            claimed += start.run(cur, self._lock_clause)
            if start.suspect:
                break
        return claimed


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimTerms:
    """One claim's terms, as each part of it (runs outside queues, each queue)
    applies them: who takes the runs and for how long, by which clock, which runs
    it may take, and when a recovering run is a suspect.

    Attributes:
        at: the SQL for "now" in lease arithmetic and its parameters.
        wf: conditions (`` AND ...``) on the runs it may take and their parameters:
            workflows, code versions, runs to skip.
        run_id: a claim of that run only.
    """

    worker: str
    now: float
    lease_s: float
    at: tuple[str, list[Any]]
    wf: tuple[str, list[Any]]
    max_recoveries: int
    isolate_after: int | None
    run_id: str | None

    def suspect(self, recoveries: int) -> bool:
        """Whether a run recovered ``recoveries`` times in a row without progress is a
        suspect: its step may be what kills workers, so it runs alone."""
        return self.isolate_after is not None and (
            self.isolate_after <= recoveries <= self.max_recoveries
        )

    def take(self, cur: Cursor, run_id: str, recoveries: int) -> None:
        """Claim ``run_id`` (the claim edge), with ``recoveries`` as it is to be."""
        claim(
            cur,
            run_id,
            worker=self.worker,
            at=self.at,
            lease_s=self.lease_s,
            recoveries=recoveries,
            now=self.now,
        )


class _Slots:
    """A queue's slots as one claim sees and takes them: how many are free
    (``None``: no concurrency limit) and how many each queue key holds."""

    def __init__(self, cur: Cursor, name: str, concurrency: int | None, per_key: int | None):
        # Slots held: runs running, and runs sleeping on a retry back-off (they keep
        # theirs), by queue key.
        cur.execute(
            "SELECT queue_key, COUNT(*) FROM (SELECT queue_key FROM ms_runs WHERE queue = ?"
            " AND status = 'running' UNION ALL SELECT queue_key FROM ms_runs WHERE queue = ?"
            f" AND {_HOLDING}) held GROUP BY queue_key",
            (name, name),
        )
        self.by_key: dict[str | None, int] = {k: int(n) for k, n in cur.fetchall()}
        self.per_key = per_key
        self.free = None if concurrency is None else concurrency - sum(self.by_key.values())
        # Keys at their limit: the next page of candidates leaves their runs out.
        self.full: set[str] = {
            k for k, n in self.by_key.items() if k is not None and per_key and n >= per_key
        }

    def room(self) -> bool:
        return self.free is None or self.free > 0

    def at_most(self, want: int) -> int:
        return want if self.free is None else min(want, self.free)

    def key_full(self, key: str | None) -> bool:
        """Whether ``key``'s runs are at the per-key limit (then it is noted full)."""
        if key is not None and self.per_key and self.by_key.get(key, 0) >= self.per_key:
            self.full.add(key)
            return True
        return False

    def took(self, key: str | None) -> None:
        if self.free is not None:
            self.free -= 1
        if key is not None:
            self.by_key[key] = self.by_key.get(key, 0) + 1


class _Starts:
    """A queue's rate of first starts (GCRA, see the module's docstring) as one claim
    moves its theoretical arrival time ``tat`` on, by the database's clock."""

    def __init__(self, rate: float | None, burst: int, tat: float, clock: float):
        self.rate, self.burst, self.tat, self.clock = rate, burst, tat, clock

    def spent(self) -> bool:
        """Whether the rate admits no start before the next claim."""
        rate = self.rate
        return rate is not None and max(self.tat, self.clock) - self.clock > (self.burst - 1) / rate

    def start(self) -> bool:
        """Admit one start (moving ``tat`` on), or refuse it."""
        if self.rate is None:
            return True
        base = max(self.tat, self.clock)
        if base - self.clock > (self.burst - 1) / self.rate:
            return False
        self.tat = base + 1 / self.rate
        return True


class _QueueStart:
    """One claim's starts of runs of the queue ``name``, whose row the claim holds,
    within its limits: back-off sleepers that are due first (they hold their slot
    already, so they need no room), then woken runs, then fresh ones, each within the
    room left and by priority then age (``terms.run_id``: that run, if it is the
    first to start)."""

    def __init__(self, terms: ClaimTerms, name: str, row: Sequence[Any], *, left: int, alone: bool):
        concurrency, per_key, rate, burst, tat, db_now = row
        self.terms, self.name, self.left, self.alone = terms, name, left, alone
        self.concurrency, self.per_key = concurrency, per_key
        self.tat_held = float(tat)
        self.starts = _Starts(rate, burst, float(tat), float(db_now))
        self.claimed: list[str] = []
        self.passed: list[str] = []  # suspects left for a caller that holds nothing
        self.suspect = False  # taken: then it is the claim's only run
        self.not_its_turn = False  # a claim by id whose run is not the first to start

    def run(self, cur: Cursor, lock: str) -> list[str]:
        """The runs started, in order (none when it is not ``run_id``'s turn)."""
        slots = _Slots(cur, self.name, self.concurrency, self.per_key)
        at_sql = self.terms.at[0]
        phases = (  # where, order, fresh, needs room
            (_HELD_WOKEN.format(at=at_sql), "wake_at", False, False),
            (_WOKEN_UNHELD.format(at=at_sql), "wake_at", False, True),
            (_FRESH, "created_at", True, True),
        )
        for where, order, fresh, needs_room in phases:
            self._phase(cur, lock, where, order, fresh=fresh, slots=slots if needs_room else None)
            if self.not_its_turn:
                return []
        if self.starts.rate is not None and self.starts.tat != self.tat_held:
            cur.execute("UPDATE ms_queues SET tat = ? WHERE name = ?", (self.starts.tat, self.name))
        return self.claimed

    def _phase(
        self, cur: Cursor, lock: str, where: str, order: str, *, fresh: bool, slots: _Slots | None
    ) -> None:
        """Start the runs of one kind, a page of candidates at a time. ``slots``: the
        kind needs room (``None``: it holds its slot already)."""
        wf_sql, wf_params = self.terms.wf
        while len(self.claimed) < self.left and not self.suspect:
            if slots is not None and not slots.room():
                break
            if fresh and self.starts.spent():
                break  # the rate admits no start before the next claim
            want = self.left - len(self.claimed)
            keys = []
            if slots is not None:
                want, keys = slots.at_most(want), sorted(slots.full)
            skip_keys = (
                f" AND (queue_key IS NULL OR queue_key NOT IN ({', '.join('?' * len(keys))}))"
                if keys
                else ""
            )
            skip_ids = (
                f" AND id NOT IN ({', '.join('?' * len(self.passed))})" if self.passed else ""
            )
            page = want + 16
            cur.execute(
                "SELECT id, recoveries, queue_key FROM ms_runs WHERE queue = ?"
                f" AND {where}{wf_sql}{skip_keys}{skip_ids}"
                f" ORDER BY priority DESC, {order}, id LIMIT ?{lock}",
                [
                    self.name,
                    *([] if fresh else self.terms.at[1]),
                    *wf_params,
                    *keys,
                    *self.passed,
                    page,
                ],
            )
            found = cur.fetchall()
            self._start_found(cur, found, fresh=fresh, slots=slots)
            if self.suspect or self.not_its_turn or len(found) < page:
                break
            if fresh and self.starts.spent():
                break

    def _start_found(
        self, cur: Cursor, found: list[Any], *, fresh: bool, slots: _Slots | None
    ) -> None:
        """Start the candidates of one page in order, as long as there is room."""
        for rid, recoveries, key in found:
            if len(self.claimed) >= self.left or (slots is not None and not slots.room()):
                break
            if slots is not None and slots.key_full(key):
                continue
            if self.terms.run_id is not None and rid != self.terms.run_id:
                self.not_its_turn = True
                return
            is_suspect = self.terms.suspect(recoveries)
            if is_suspect and (not self.alone or self.claimed):
                self.passed.append(rid)  # a suspect runs alone
                continue
            if fresh and not self.starts.start():
                break
            # Its recoveries as they are: a takeover is the main claim's.
            self.terms.take(cur, rid, recoveries)
            self.claimed.append(rid)
            if slots is not None:  # a back-off sleeper's slot was counted already
                slots.took(key)
            if is_suspect:
                self.suspect = True
                break
