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
from ._rows import _versions_sql
from ._transitions import claim

__all__ = ["QueueRecord", "QueueTables", "check_queue_limits", "ready_queues_sql"]

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
        wf_sql = ""
        params: list[Any] = []
        if names:
            wf_sql += f" AND workflow IN ({', '.join('?' * len(names))})"
            params += names
        if versions is not None:
            v_sql, v_params = _versions_sql(versions)
            wf_sql += f" AND {v_sql}"
            params += v_params
        with self._read() as cur:
            cur.execute(
                "SELECT 1 FROM ms_queues q WHERE (SELECT id FROM ms_runs WHERE queue = q.name"
                f" AND {_FRESH}{wf_sql} ORDER BY priority DESC, created_at LIMIT 1) IS NOT NULL"
                " LIMIT 1",
                params,
            )
            return cur.fetchone() is not None

    def _claim_queued(
        self,
        cur: Cursor,
        *,
        worker: str,
        now: float,
        lease_s: float,
        left: int,
        wf: tuple[str, list[Any]],
        run_id: str | None,
        at: tuple[str, list[Any]],
        isolate_after: int | None,
        max_recoveries: int,
        alone: bool,
    ) -> list[str]:
        """Start up to ``left`` runs of queues within their limits, in ``cur``'s
        transaction; their ids, in claim order. ``alone``: the claim took nothing
        else and its caller executes nothing (a suspect may be taken, then alone)."""
        wf_sql, wf_params = wf
        at_sql, at_params = at
        woken = _WOKEN.format(at=at_sql)
        if run_id is not None:
            # A claim by id starts its run only in its turn: when no run of its queue
            # that this claim could start comes before it.
            cur.execute(
                f"SELECT queue FROM ms_runs WHERE id = ? AND queue IS NOT NULL"
                f" AND ({_FRESH} OR ({woken})){wf_sql}",
                [run_id, *at_params, *wf_params],
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
            got, suspect = self._claim_from_queue(
                cur,
                name,
                row,
                worker=worker,
                now=now,
                lease_s=lease_s,
                left=left - len(claimed),
                wf=(wf_sql, wf_params),
                at=at,
                isolate_after=isolate_after,
                max_recoveries=max_recoveries,
                alone=alone and not claimed,
                only=run_id,
            )
            claimed += got
            if suspect:
                break
        return claimed

    def _claim_from_queue(
        self,
        cur: Cursor,
        name: str,
        row: Sequence[Any],
        *,
        worker: str,
        now: float,
        lease_s: float,
        left: int,
        wf: tuple[str, list[Any]],
        at: tuple[str, list[Any]],
        isolate_after: int | None,
        max_recoveries: int,
        alone: bool,
        only: str | None = None,
    ) -> tuple[list[str], bool]:
        """Start runs of the queue ``name`` (whose row the caller holds) within its
        limits: woken runs first, then fresh ones, each by priority then age
        (``only``: that run, if it is the first to start). Returns the ids and
        whether a suspect was taken (then nothing else)."""
        concurrency, per_key, rate, burst, tat, db_now = row
        clock = float(db_now)
        wf_sql, wf_params = wf
        at_sql, at_params = at
        # Slots held: runs running, and runs sleeping on a retry back-off (they keep
        # theirs), by queue key.
        cur.execute(
            "SELECT queue_key, COUNT(*) FROM (SELECT queue_key FROM ms_runs WHERE queue = ?"
            " AND status = 'running' UNION ALL SELECT queue_key FROM ms_runs WHERE queue = ?"
            f" AND {_HOLDING}) held GROUP BY queue_key",
            (name, name),
        )
        by_key: dict[str | None, int] = {k: int(n) for k, n in cur.fetchall()}
        free = None if concurrency is None else concurrency - sum(by_key.values())
        claimed: list[str] = []
        full: set[str] = {
            k for k, n in by_key.items() if k is not None and per_key and n >= per_key
        }
        passed: list[str] = []  # suspects left for a caller that holds nothing
        suspect = False  # taken: then it is the claim's only run
        tat = float(tat)
        # Back-off sleepers that are due first: they hold their slot already, so they
        # need no room. Then woken runs, then fresh ones, each within the room left.
        phases = (
            (_HELD_WOKEN.format(at=at_sql), "wake_at", False, False),
            (_WOKEN_UNHELD.format(at=at_sql), "wake_at", False, True),
            (_FRESH, "created_at", True, True),
        )
        for where, order, fresh, needs_room in phases:
            while len(claimed) < left and not suspect:
                if needs_room and free is not None and free <= 0:
                    break
                if fresh and rate is not None and max(tat, clock) - clock > (burst - 1) / rate:
                    break  # the rate admits no start before the next claim
                want = left - len(claimed)
                if needs_room and free is not None:
                    want = min(want, free)
                keys = sorted(full) if needs_room else []
                skip_keys = (
                    f" AND (queue_key IS NULL OR queue_key NOT IN ({', '.join('?' * len(keys))}))"
                    if keys
                    else ""
                )
                skip_ids = f" AND id NOT IN ({', '.join('?' * len(passed))})" if passed else ""
                page = want + 16
                cur.execute(
                    "SELECT id, recoveries, queue_key FROM ms_runs WHERE queue = ?"
                    f" AND {where}{wf_sql}{skip_keys}{skip_ids}"
                    f" ORDER BY priority DESC, {order}, id LIMIT ?{self._lock_clause}",
                    [name, *([] if fresh else at_params), *wf_params, *keys, *passed, page],
                )
                found = cur.fetchall()
                for rid, recoveries, key in found:
                    if len(claimed) >= left or (needs_room and free is not None and free <= 0):
                        break
                    if needs_room and key is not None and per_key and by_key.get(key, 0) >= per_key:
                        full.add(key)
                        continue
                    if only is not None and rid != only:
                        return [], False  # not its turn
                    is_suspect = isolate_after is not None and (
                        isolate_after <= recoveries <= max_recoveries
                    )
                    if is_suspect and (not alone or claimed):
                        passed.append(rid)  # a suspect runs alone
                        continue
                    if fresh and rate is not None:
                        base = max(tat, clock)
                        if base - clock > (burst - 1) / rate:
                            break
                        tat = base + 1 / rate
                    # Its recoveries as they are: a takeover is the main claim's.
                    claim(
                        cur,
                        rid,
                        worker=worker,
                        at=at,
                        lease_s=lease_s,
                        recoveries=recoveries,
                        now=now,
                    )
                    claimed.append(rid)
                    if needs_room:  # a back-off sleeper's slot was counted already
                        if free is not None:
                            free -= 1
                        if key is not None:
                            by_key[key] = by_key.get(key, 0) + 1
                    if is_suspect:
                        suspect = True
                        break
                if suspect or len(found) < page:
                    break
                if fresh and rate is not None and max(tat, clock) - clock > (burst - 1) / rate:
                    break
        if rate is not None and tat != float(row[4]):
            cur.execute("UPDATE ms_queues SET tat = ? WHERE name = ?", (tat, name))
        return claimed, suspect
