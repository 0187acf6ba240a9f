"""Claims and leases: how workers take runs, keep them and give them back. A claim
bumps the run's epoch, the fence every later write of its holder is checked against;
the moves themselves are the state machine's edges (``_transitions.py``)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from .._serde import dumps, loads
from ._api import queue_event
from ._children import lock_parents
from ._connection import Cursor
from ._queues import ClaimTerms, QueueTables, ready_queues_sql
from ._records import WAKE_NOW, RunRecord, RunStatus
from ._rows import _RUN_COLUMNS, _claimable_sql, _names, _run
from ._transitions import RUN_EDGES, dead_letter, fenced, refuse, release
from ._workers import WorkerBeat, register

__all__ = ["Heartbeat", "LeaseTables"]

# A run that no worker's code could replay for this long waits (parked) instead of
# being due at once, and is tried again this often from then on (see refuse).
PARK_AFTER_S = 600.0
PARK_RETRY_S = 600.0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What a heartbeat learned: runs whose lease is gone, runs asked to cancel."""

    lost: frozenset[str]
    cancel: frozenset[str]


class LeaseTables(QueueTables):
    """Claiming, heartbeats and release: methods of every
    :class:`~mainspring.storage.Store`."""

    # Whether a claim can be one UPDATE ... RETURNING that locks its candidates
    # (PostgreSQL; SQLite's writer lock makes its claim one transaction anyway).
    _claim_returning: ClassVar[bool] = False

    # -- claiming and leases ---------------------------------------------------------

    def claim(
        self,
        *,
        worker: str,
        now: float,
        lease_s: float,
        limit: int,
        workflows: Sequence[str] | None,
        max_recoveries: int,
        run_id: str | None = None,
        isolate_after: int | None = None,
        alone: bool = False,
        db_clock: bool = False,
        versions: Sequence[str | None] | None = None,
        dead_lettered: list[tuple[str, str]] | None = None,
        skip: Collection[str] = (),
    ) -> list[RunRecord]:
        """Take up to ``limit`` runnable runs: bump each one's epoch and lease it.

        Runnable: queued; sleeping or waiting whose ``wake_at`` has come; running
        whose lease expired (a recovery). A run recovered more than
        ``max_recoveries`` times in a row without progress is dead-lettered:
        moved to ``failed`` with the reason, not claimed.

        Args:
            isolate_after: a run recovered this many times in a row without progress
                is a *suspect* (its step may be what kills workers): it is claimed
                only by a caller that holds nothing else (``alone``), and then as the
                only run of the claim, so that a crash it causes is charged to it
                alone. ``None``: no isolation.
            alone: the caller executes no other run now.
            db_clock: compare and write leases with the database's clock instead of
                ``now`` (where the dialect has one: PostgreSQL), so that workers
                whose clocks disagree still agree on whose lease has run out.
            versions: claim only runs whose code version (``ms_runs.version``) is one
                of these (``None`` in it: runs submitted with no version); ``None``:
                runs of every version. Applies to a claim by ``run_id`` too.
            dead_lettered: given, ``(run id, workflow)`` of each run this claim
                dead-lettered is appended to it once the claim committed (a worker
                counts them as they happen).
            skip: runs not to claim, however runnable (those this worker's code
                could not replay lately: see :meth:`refuse`).
        """
        self._check()
        if limit <= 0:
            return []
        names = list(workflows) if workflows is not None else None
        one = _claimable_sql(None, versions, skip)  # what a claim by id checks beside runnability
        at = self._clock(now, db_clock)
        terms = ClaimTerms(
            worker=worker,
            now=now,
            lease_s=lease_s,
            at=at,
            wf=_claimable_sql(names, versions, skip),
            max_recoveries=max_recoveries,
            isolate_after=isolate_after,
            run_id=run_id,
        )
        if names == []:
            return []
        if self._claim_returning:
            runs = self._claim_returning_first(terms, limit=limit, alone=alone)
            if runs is not None:
                return runs
        dead: list[tuple[str, str]] = []
        with self._write() as cur:
            claimed, suspect = self._claim_runnable(
                cur, terms, _runnable_queries(terms, one, self._lock_clause), limit, alone, dead
            )
            if not suspect and len(claimed) < limit:
                claimed += self._claim_queued(
                    cur, terms, left=limit - len(claimed), alone=alone and not claimed
                )
            records = self._records(cur, claimed)
        if dead_lettered is not None:
            dead_lettered.extend(dead)  # committed: the write block is left
        return records

    def _claim_returning_first(
        self, terms: ClaimTerms, *, limit: int, alone: bool
    ) -> list[RunRecord] | None:
        """The claim as :meth:`_claim_at_once`, then runs in queues if any may start
        and ``limit`` leaves room; ``None``: a candidate is a suspect or is to be
        dead-lettered, which the statement-by-statement claim handles."""
        found = self._claim_at_once(terms, limit=limit)
        if found is None:
            return None
        runs, in_queues = found
        left = limit - len(runs)
        if not in_queues or left <= 0:
            return runs
        with self._write() as cur:
            ids = self._claim_queued(cur, terms, left=left, alone=alone and not runs)
            return runs + self._records(cur, ids)

    def _claim_runnable(
        self,
        cur: Cursor,
        terms: ClaimTerms,
        queries: list[tuple[str, list[Any]]],
        limit: int,
        alone: bool,
        dead: list[tuple[str, str]],
    ) -> tuple[list[str], bool]:
        """Claim, statement by statement, the runnable runs outside queues (and
        takeovers in them), in the order of ``queries``; dead-letter those recovered
        too often (appended to ``dead``). Returns the ids claimed and whether one is a
        suspect (then it is the only one)."""
        claimed: list[str] = []
        for sql, params in queries:
            left = limit - len(claimed)
            if left <= 0:
                break
            if terms.run_id is None:
                params = [*params, left]
            cur.execute(sql, params)
            for rid, status, recoveries, workflow in cur.fetchall():
                taken = self._take_runnable(
                    cur, terms, rid, status, recoveries, sole=alone and not claimed
                )
                if taken == "dead":
                    dead.append((rid, workflow))
                elif taken != "left":
                    claimed.append(rid)
                if taken == "suspect":
                    return claimed, True
        return claimed, False

    def _take_runnable(
        self,
        cur: Cursor,
        terms: ClaimTerms,
        rid: str,
        status: str,
        recoveries: int,
        *,
        sole: bool,
    ) -> Literal["claimed", "suspect", "dead", "left"]:
        """Claim one candidate, or dead-letter it when its recoveries run out.
        ``sole``: nothing is claimed yet and the caller executes nothing else, so a
        suspect may be taken. ``"left"``: neither (a suspect for another caller, a
        run whose end must wait, a dead-letter that did not fail the run)."""
        recovering = status == "running"
        count = recoveries + 1 if recovering else recoveries
        suspect = terms.suspect(count)
        if suspect and not sole:
            return "left"  # a suspect runs alone: left for a caller that holds nothing
        if recovering and count > terms.max_recoveries:
            if lock_parents(self, cur, [rid]):
                # A row its end writes (its parent or a fork it tells, a child it
                # cancels) is held elsewhere, and this claim holds other runs: it
                # must not wait. A later claim ends it.
                return "left"
            end = dead_letter(
                self,
                cur,
                rid,
                recoveries=count,
                error=_dead_letter_error(terms.max_recoveries),
                now=terms.now,
            )
            return "dead" if end == "failed" else "left"
        terms.take(cur, rid, count)
        return "suspect" if suspect else "claimed"

    def _records(self, cur: Cursor, ids: list[str]) -> list[RunRecord]:
        """The claimed runs' records, in claim order."""
        if not ids:
            return []
        cur.execute(
            f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE id IN ({', '.join('?' * len(ids))})", ids
        )
        by_id = {r.id: r for r in map(_run, cur.fetchall())}
        return [by_id[rid] for rid in ids]

    def _claim_at_once(
        self, terms: ClaimTerms, *, limit: int
    ) -> tuple[list[RunRecord], bool] | None:
        """The usual claim as one ``UPDATE ... RETURNING`` (one round trip): the
        candidates in claim order (expired leases by ``lease_until``, then due
        sleepers and waiters by ``wake_at``, then queued runs by ``created_at``),
        each kind locked only up to what the kinds before it left of ``limit``.
        When any candidate is a suspect or is to be dead-lettered, nothing is
        claimed and ``None`` sends the caller to the statement-by-statement claim,
        which applies those rules (they are rare: crashes).

        Runs in queues are left out but for takeovers (they keep their slot); the
        flag returned with the runs says whether any of them may start now, for
        :meth:`_claim_queued`."""
        wf_sql, wf_params = terms.wf
        now_sql, now_params = terms.at
        run_id = terms.run_id
        one = " AND id = ?" if run_id is not None else ""
        one_params = [run_id] if run_id is not None else []
        lock = self._lock_clause
        woken = f"status IN ('sleeping', 'waiting') AND wake_at <= {now_sql}"
        kinds = (  # name, rank, order, recovering, condition, its parameters
            ("expired", 0, "lease_until", True, f"status = 'running' AND lease_until < {now_sql}"),
            (
                "due",
                1,
                "wake_at",
                False,
                f"{woken} AND queue IS NULL",
            ),
            ("fresh", 2, "created_at", False, "status = 'queued' AND queue IS NULL"),
        )
        ctes: list[str] = []
        params: list[Any] = []
        before = ""
        for name, rank, order, recovering, where in kinds:
            counted = "recoveries + 1" if recovering else "recoveries"
            ctes.append(
                f"{name} AS (SELECT id, {rank} AS rank, {order} AS ord, {counted} AS n,"
                f" {'TRUE' if recovering else 'FALSE'} AS recovering FROM ms_runs"
                f" WHERE {where}{wf_sql}{one} ORDER BY {order}"
                f" LIMIT GREATEST(? {before}, 0){lock})"
            )
            params += [*(now_params if "?" in where else []), *wf_params, *one_params, limit]
            before += f" - (SELECT count(*) FROM {name})"
        returned = ", ".join(f"r.{c}" for c in _names(_RUN_COLUMNS))
        # The claim edge's own assignments, with the recoveries counted above.
        claim_set = RUN_EDGES["claim"].assignments(now_sql, recoveries="p.n")
        sql = (
            f"WITH {', '.join(ctes)},"
            " picked AS (SELECT * FROM expired UNION ALL SELECT * FROM due"
            " UNION ALL SELECT * FROM fresh),"
            # Left to the statement-by-statement claim: dead-letters and suspects.
            " special AS (SELECT count(*) AS k FROM picked"
            " WHERE (recovering AND n > ?) OR n BETWEEN ? AND ?),"
            f" claimed AS (UPDATE ms_runs r SET {claim_set}"
            " FROM picked p WHERE r.id = p.id AND (SELECT k FROM special) = 0"
            f" RETURNING p.rank, p.ord, {returned})"
            # Runs in queues that may start: per declared queue, two index probes.
            " SELECT s.k, EXISTS (SELECT 1 FROM ms_queues q WHERE"
            f" {ready_queues_sql(wf_sql + one, woken)}),"
            " c.* FROM special s LEFT JOIN claimed c ON TRUE ORDER BY c.rank, c.ord"
        )
        most = terms.max_recoveries
        isolate = terms.isolate_after if terms.isolate_after is not None else most + 1
        params += [most, isolate, most, terms.worker, *now_params, terms.lease_s, terms.now]
        params += [*wf_params, *one_params, *now_params, *wf_params, *one_params]
        with self._autocommit() as cur:
            cur.execute(sql, params)
            rows = cur.fetchall()
        if rows[0][0]:
            return None
        return [_run(r[4:]) for r in rows if r[2] is not None], bool(rows[0][1])

    def heartbeat(
        self,
        *,
        runs: Sequence[tuple[str, int]],
        now: float,
        lease_s: float,
        db_clock: bool = False,
        worker: WorkerBeat | None = None,
    ) -> Heartbeat:
        """Extend the leases of ``(run_id, epoch)`` pairs this worker holds
        (``db_clock``: as :meth:`claim`) and, with ``worker``, register the worker's
        beat in the same transaction (see ``_workers.py``)."""
        self._check()
        if not runs and worker is None:
            return Heartbeat(frozenset(), frozenset())
        lost: set[str] = set()
        cancel: set[str] = set()
        at, at_params = self._clock(now, db_clock)
        with self._write() as cur:
            if worker is not None:
                register(cur, worker, at, at_params)
            for rid, epoch in sorted(runs):
                cur.execute(
                    f"UPDATE ms_runs SET lease_until = {at} + ? WHERE id = ? AND {fenced()}",
                    (*at_params, lease_s, rid, epoch),
                )
                if cur.rowcount == 0:
                    lost.add(rid)
            ids = [rid for rid, _ in runs if rid not in lost]
            if ids:
                cur.execute(
                    "SELECT id FROM ms_runs WHERE cancel_requested = 1 AND id IN"
                    f" ({', '.join('?' * len(ids))})",
                    ids,
                )
                cancel = {r[0] for r in cur.fetchall()}
        return Heartbeat(frozenset(lost), frozenset(cancel))

    def release(self, run_id: str, epoch: int, now: float) -> bool:
        """Give a run back (graceful shutdown): queued again, no recovery counted."""
        with self._write() as cur:
            return release(self, cur, run_id, epoch, now)

    def refuse(
        self,
        run_id: str,
        epoch: int,
        now: float,
        *,
        error: str,
        at: str,
        worker: str,
        park_after_s: float = PARK_AFTER_S,
        retry_s: float = PARK_RETRY_S,
        again: bool = False,
    ) -> RunStatus | None:
        """A worker whose code cannot replay the run (its journal holds a step, a
        patch marker or a version this code does not produce) gives it back for a
        worker whose code can: ``sleeping`` and due at once, ``wait_reason``
        ``replay``, no recovery counted (the run is not what kills workers).

        ``error`` (the replay error, JSON) is kept on the run, with ``refused``: how
        many refusals in a row at journal position ``at`` (``"session:seq"``; a move
        starts the count again), since when, and by which worker. Once refusals have
        gone on for ``park_after_s`` with no worker able to replay it, the run
        ``waiting`` instead, tried again every ``retry_s``: parked where an operator
        sees it (``mainspring runs --status waiting``, ``show``, ``doctor``), never
        failed. A run asked to cancel is made due at once and keeps the cancel's
        reason. ``again``: the refusing worker's claim took the run back before it
        could skip it; give it back as it was (``error`` is its note), counting
        nothing. Returns the status set, or ``None``: the run is no longer this
        holder's (``epoch``) or no longer running.
        """
        with self._write() as cur:
            cur.execute(
                f"SELECT error, cancel_requested FROM ms_runs WHERE id = ? AND {fenced()}"
                f"{self._row_lock}",
                (run_id, epoch),
            )
            row = cur.fetchone()
            if row is None:
                return None
            old = loads(row[0]) if row[0] else None
            prior = old.get("refused") if isinstance(old, dict) else None
            if isinstance(prior, dict) and (again or prior.get("at") == at):
                count = int(prior.get("count", 0)) + (0 if again else 1)
                since, at = float(prior.get("since", now)), str(prior.get("at", at))
                was_parked = bool(prior.get("parked"))
            else:
                count, since, was_parked = 1, now, False
            parked = now - since >= park_after_s
            status: RunStatus = "waiting" if parked else "sleeping"
            wake_at = now + retry_s if parked else WAKE_NOW
            note: str | None = dumps(
                {
                    **(loads(error) or {}),
                    "refused": {
                        "count": count,
                        "since": since,
                        "at": at,
                        "worker": worker,
                        "parked": parked,
                    },
                }
            )
            if row[1]:  # asked to cancel: a worker cancels it at once, with its reason
                status, wake_at, note = "sleeping", WAKE_NOW, row[0]
            # Sleeping: due at once, for a worker whose code can replay it.
            refuse(self, cur, run_id, epoch, status=status, wake_at=wake_at, note=note, now=now)
            if status == "waiting" and not was_parked:
                waiting = {"status": "waiting", "wait_reason": "replay"}
                queue_event(cur, run_id, "run.waiting", waiting, now)
            return status


def _runnable_queries(
    terms: ClaimTerms, one: tuple[str, list[Any]], lock: str
) -> list[tuple[str, list[Any]]]:
    """The statements that find a claim's candidates outside queues (and takeovers in
    them), in claim order, each to be given the room left as its ``LIMIT``; a claim by
    id is one statement that checks ``one`` (versions, runs to skip) beside
    runnability."""
    at, at_params = terms.at
    wf_sql, wf_params = terms.wf
    one_sql, one_params = one
    if terms.run_id is not None:
        return [
            (
                # A run in a queue starts (or wakes) only within its queue's limits:
                # _claim_queued, not here. Its takeover keeps its slot.
                "SELECT id, status, recoveries, workflow FROM ms_runs WHERE id = ? AND"
                " (((status = 'queued' OR (status IN ('sleeping', 'waiting')"
                f" AND wake_at <= {at})) AND queue IS NULL)"
                f" OR (status = 'running' AND lease_until < {at})){one_sql}{lock}",
                [terms.run_id, *at_params, *at_params, *one_params],
            )
        ]
    return [
        (
            "SELECT id, status, recoveries, workflow FROM ms_runs WHERE status = 'running'"
            f" AND lease_until < {at}{wf_sql} ORDER BY lease_until LIMIT ?{lock}",
            [*at_params, *wf_params],
        ),
        (
            "SELECT id, status, recoveries, workflow FROM ms_runs WHERE status IN"
            f" ('sleeping', 'waiting') AND wake_at <= {at} AND queue IS NULL{wf_sql}"
            " ORDER BY wake_at"
            f" LIMIT ?{lock}",
            [*at_params, *wf_params],
        ),
        (
            "SELECT id, status, recoveries, workflow FROM ms_runs WHERE status = 'queued'"
            f" AND queue IS NULL{wf_sql} ORDER BY created_at LIMIT ?{lock}",
            [*wf_params],
        ),
    ]


def _dead_letter_error(max_recoveries: int) -> str:
    return dumps(
        {
            "type": "DeadLettered",
            "message": f"recovery failed {max_recoveries} times in a row without progress;"
            " the run was moved to failed (dead-lettered)",
        }
    )
