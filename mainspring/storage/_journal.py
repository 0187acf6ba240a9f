"""The journal: fenced commits of many runs' rows and transitions in one
transaction, and the reads that replay and follow a run. The transitions
themselves, and the fence, are the state machine's (``_transitions.py``)."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

from ._children import lock_closed_children, lock_parents
from ._connection import Connection, Cursor
from ._records import FINISHED, RunRecord, RunWrite, StepRecord, WriteResult
from ._rows import _RUN_COLUMNS, _STEP_COLUMNS, _UPSERT_STEP, _run, _step, _step_params
from ._transitions import fence_holds, finish, next_session, suspend

__all__ = ["JournalTables", "Snapshot"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """Runs and their journals as of one moment (see :meth:`JournalTables.snapshot`).

    Attributes:
        runs: by run id.
        wait_signals: the signal name(s) each parked run waits for, by run id (the
            ``wait_signal`` column; ``None`` when it waits for none).
        steps: each run's journal rows in order, by run id (absent: none).
    """

    runs: dict[str, RunRecord]
    wait_signals: dict[str, str | None]
    steps: dict[str, list[StepRecord]]


class JournalTables(Connection):
    """Journal commits and reads: methods of every :class:`~mainspring.storage.Store`."""

    def load_steps(self, run_id: str, session: int | None = None) -> list[StepRecord]:
        """A run's journal in order; one session's only when ``session`` is given."""
        with self._read() as cur:
            if session is None:
                cur.execute(
                    f"SELECT {_STEP_COLUMNS} FROM ms_steps WHERE run_id = ? ORDER BY session, seq",
                    (run_id,),
                )
            else:
                cur.execute(
                    f"SELECT {_STEP_COLUMNS} FROM ms_steps WHERE run_id = ? AND session = ?"
                    " ORDER BY seq",
                    (run_id, session),
                )
            return [_step(r) for r in cur.fetchall()]

    def steps_after(
        self, run_id: str, session: int, seq: int, *, limit: int = 1000
    ) -> list[StepRecord]:
        """Journal rows after position ``(session, seq)``, in order (for followers)."""
        with self._read() as cur:
            cur.execute(
                f"SELECT {_STEP_COLUMNS} FROM ms_steps WHERE run_id = ?"
                " AND (session > ? OR (session = ? AND seq > ?)) ORDER BY session, seq LIMIT ?",
                (run_id, session, session, seq, limit),
            )
            return [_step(r) for r in cur.fetchall()]

    def last_steps(self, run_ids: Sequence[str]) -> dict[str, StepRecord]:
        """The newest journal row of each run (its current step), by run id."""
        found: dict[str, StepRecord] = {}
        with self._read() as cur:
            for rid in run_ids:
                cur.execute(
                    f"SELECT {_STEP_COLUMNS} FROM ms_steps WHERE run_id = ?"
                    " ORDER BY session DESC, seq DESC LIMIT 1",
                    (rid,),
                )
                row = cur.fetchone()
                if row:
                    found[rid] = _step(row)
        return found

    def model_steps(self, run_ids: Sequence[str]) -> list[StepRecord]:
        """The completed model calls of these runs (what their tokens and cost are
        read from), in journal order, a run after another."""
        out: list[StepRecord] = []
        ids = list(dict.fromkeys(run_ids))
        with self._read() as cur:
            for i in range(0, len(ids), 500):  # within every database's parameter limit
                chunk = ids[i : i + 500]
                cur.execute(
                    f"SELECT {_STEP_COLUMNS} FROM ms_steps WHERE run_id IN"
                    f" ({', '.join('?' * len(chunk))}) AND kind = 'step' AND role = 'model'"
                    " AND status = 'completed' ORDER BY run_id, session, seq",
                    chunk,
                )
                out.extend(_step(r) for r in cur.fetchall())
        return out

    def iter_all_steps(self) -> Iterator[StepRecord]:
        """Every journal row, for consistency checks."""
        with self._read() as cur:
            cur.execute(f"SELECT {_STEP_COLUMNS} FROM ms_steps ORDER BY run_id, session, seq")
            rows = cur.fetchall()
        return map(_step, rows)

    def snapshot(self, run_ids: Collection[str] | None = None) -> Snapshot:
        """Runs (``None``: all) with their journals, for consistency checks. Each 500
        runs are read in one snapshot, rows and journal together: a retry moves a
        finished run's status and journal at once, and a reader must never see half
        of it."""
        runs: dict[str, RunRecord] = {}
        waits: dict[str, str | None] = {}
        steps: dict[str, list[StepRecord]] = {}
        ids = None if run_ids is None else sorted(set(run_ids))
        for i in range(0, len(ids) if ids is not None else 1, 500):
            chunk = [] if ids is None else ids[i : i + 500]
            where = f" IN ({', '.join('?' * len(chunk))})" if ids is not None else ""
            runs_sql = f"SELECT {_RUN_COLUMNS}, wait_signal FROM ms_runs"
            steps_sql = f"SELECT {_STEP_COLUMNS} FROM ms_steps"
            if where:
                runs_sql += f" WHERE id{where}"
                steps_sql += f" WHERE run_id{where}"
            with self._snapshot() as cur:
                cur.execute(runs_sql, chunk)
                for r in cur.fetchall():
                    runs[r[0]] = _run(r)
                    waits[r[0]] = r[-1]
                cur.execute(steps_sql + " ORDER BY run_id, session, seq", chunk)
                for r in cur.fetchall():
                    steps.setdefault(r[0], []).append(_step(r))
        return Snapshot(runs=runs, wait_signals=waits, steps=steps)

    # -- the journal -----------------------------------------------------------------

    def commit(self, batch: Sequence[RunWrite], now: float) -> list[WriteResult]:
        """Commit the writes of many runs in one transaction, each fenced.

        The fence is the epoch **and** the status: a run's writes apply only while
        it is ``running`` at the epoch the writer holds. Every write that ends or
        re-opens a run (finish, dead-letter, cancel, retry) bumps the epoch. A
        refused run gets ``WriteResult(ok=False)`` and none of its writes are
        applied; the others are.

        Every write is idempotent when re-sent after an ambiguous failure: journal
        rows only move forward (an older snapshot never replaces a newer row), a
        signal is consumed by one wait only, ``next_session`` moves from the
        session it names, and a finish or suspend that had already been applied
        answers ``ok`` with ``already=True`` and writes (and emits) nothing again.
        """
        if self._one_round_trip:
            at_once = self._commit_at_once(batch, now)
            if at_once is not None:
                return at_once
        results: list[WriteResult] = []
        with self._write() as cur:
            ids = sorted({w.run_id for w in batch})
            lock_closed_children(self, cur, _ending(batch))
            # One read of the fences and one upsert of all rows, however many runs.
            fences = self._fences(cur, ids)
            # A row another transaction holds is skipped on PostgreSQL: its run waits
            # and retries (busy); it must not hold up the rest of the batch.
            unlocked = self._epochs(cur, sorted(set(ids) - fences.keys()))
            # Holding several runs, it must not wait for a row its ends write (a
            # parent and its forks it tells, the children it cancels).
            ending = [w.run_id for w in batch if _ends(w) and w.run_id in fences]
            parent_held = lock_parents(self, cur, ending) if len(fences) > 1 and ending else set()
            taken: dict[int, str] = {}  # signal id -> the wait consuming it in this batch
            for w in batch:
                fence = fences.get(w.run_id)
                if fence is None:
                    held = unlocked.get(w.run_id)
                    busy = held is not None and held in (w.epoch, w.epoch + 1)
                    results.append(WriteResult(ok=False, busy=busy))
                    continue
                epoch, cancel, status = fence
                if not fence_holds(epoch, status, w.epoch):
                    results.append(self._resent(cur, w, epoch, status))
                    continue
                if w.run_id in parent_held:
                    results.append(WriteResult(ok=False, busy=True))
                    continue
                conflict = self._consume_conflict(cur, w, taken)
                if conflict is not None:
                    results.append(WriteResult(ok=False, conflict=conflict))
                    continue
                results.append(WriteResult(ok=True, cancel_requested=bool(cancel)))
            applied = [
                (w, r.cancel_requested)
                for w, r in zip(batch, results, strict=True)
                if r.ok and not r.already
            ]
            self._apply(cur, applied, now)
        return results

    def _commit_at_once(self, batch: Sequence[RunWrite], now: float) -> list[WriteResult] | None:
        """The usual commit in one round trip: every write is current (its run is
        ``running`` at its epoch and not locked elsewhere) and needs nothing read
        before it writes (steps, a recovery reset, a finish). The fence and the
        writes go in one transaction (the dialect's ``_fenced``); if any fence
        fails, nothing is written and ``None`` sends the caller to the statement
        by statement commit, which says why (refused, busy, ``already``). ``None``
        too for a batch with a suspend, a continue-as-new or consumed signals
        (what they write depends on what they read first), or with two writes of
        one run."""
        if not batch or len({w.run_id for w in batch}) != len(batch):
            return None
        for w in batch:
            if w.consume or (w.transition is not None and w.transition.kind != "finish"):
                return None
        if self._rows_in_one and all(w.transition is None for w in batch):
            cancel = self._fenced_rows(batch)
        else:
            # The writes are only sent, so a finish cannot read whether its run was
            # asked to cancel: the fence refuses a run asked to cancel that would
            # end otherwise, and the statement by statement commit ends it
            # cancelled. An end's children are locked before its run (they cancel
            # with it). Holding several runs, the fence also locks the rows its ends
            # tell (see ``lock_parents``) without waiting; a run alone may wait for
            # its parent.
            ending = _ending(batch)
            cancel = self._fenced(
                [(w.run_id, w.epoch) for w in batch],
                # Never ends touching each other (the fence refuses those): no order.
                lambda cur: self._apply(cur, [(w, False) for w in batch], now, ordered=False),
                lock=(lambda cur: lock_closed_children(self, cur, ending)) if ending else None,
                parents_of=ending if len(batch) > 1 else (),
                not_cancelled=[w.run_id for w in batch if _ends(w, but="cancelled")],
            )
        if cancel is None:
            return None
        return [WriteResult(ok=True, cancel_requested=cancel[w.run_id]) for w in batch]

    def _apply(
        self, cur: Cursor, writes: list[tuple[RunWrite, bool]], now: float, *, ordered: bool = True
    ) -> None:
        """The writes of runs whose fence held, with whether each was asked to
        cancel: journal rows, consumed signals, the recovery reset, the transition
        (``ordered``: the ends of children before their parents')."""
        step_rows = [_step_params(s) for w, _ in writes for s in w.steps]
        if step_rows:
            cur.executemany(_UPSERT_STEP, step_rows)
        ended = False  # a run of this batch ended: its cascade may have reached others
        for w, cancel_requested in _deepest_first(cur, writes) if ordered else writes:
            t = w.transition
            if ended and not cancel_requested and t is not None and t.kind == "suspend":
                # The fence was read before the batch applied; an end earlier in it
                # (this run's parent) may have asked this run to cancel since.
                cur.execute("SELECT cancel_requested FROM ms_runs WHERE id = ?", (w.run_id,))
                cancel_requested = bool(cur.fetchone()[0])
            ended = ended or _ends(w)
            for signal_id, by in w.consume:
                cur.execute(
                    "UPDATE ms_signals SET consumed_at = ?, consumed_by = ? WHERE id = ?"
                    " AND consumed_at IS NULL",
                    (now, by, signal_id),
                )
            if w.reset_recoveries:
                cur.execute("UPDATE ms_runs SET recoveries = 0 WHERE id = ?", (w.run_id,))
            if w.transition is not None:
                self._transition(cur, w, cancel_requested, now)

    def _resent(self, cur: Cursor, w: RunWrite, epoch: int, status: str) -> WriteResult:
        """A write the fence refuses: ``already`` when it is a finish or suspend whose
        first send committed (the run is exactly where that write put it); else
        refused."""
        t = w.transition
        if t is None:
            return WriteResult(ok=False)
        if t.kind == "finish" and epoch == w.epoch + 1 and status == "cancelled":
            # Only this writer's finish ends its run at epoch + 1 as cancelled (as it
            # asked, or honouring a cancel asked before it: the run keeps that reason),
            # or a claim that found the run asked to cancel and out of recoveries:
            # either way the run ended as this finish would have left it.
            return WriteResult(ok=True, already=True, cancel_requested=True)
        if status != t.status:
            return WriteResult(ok=False)
        if t.kind == "suspend" and epoch == w.epoch:
            # Only this epoch's holder moves the run from running to waiting or
            # sleeping at this epoch, and only once.
            return WriteResult(ok=True, already=True)
        if t.kind == "finish" and epoch == w.epoch + 1:
            cur.execute("SELECT output, error FROM ms_runs WHERE id = ?", (w.run_id,))
            output, error = cur.fetchone()
            # A dead-letter also ends a run at epoch + 1, with its own error.
            if (output, error) == (t.output, t.error):
                return WriteResult(ok=True, already=True)
        return WriteResult(ok=False)

    def _consume_conflict(self, cur: Cursor, w: RunWrite, taken: dict[int, str]) -> str | None:
        """Why ``w`` cannot consume its signals (another wait has one), or ``None``.

        Only the run's current holder consumes its signals, and the fence holds the
        run's row, so what this reads cannot change before the commit."""
        if not w.consume:
            return None
        marks = ", ".join("?" * len(w.consume))
        cur.execute(
            f"SELECT id, consumed_by FROM ms_signals WHERE run_id = ? AND id IN ({marks})",
            (w.run_id, *(sid for sid, _ in w.consume)),
        )
        stored = {sid: by for sid, by in cur.fetchall()}
        for sid, by in w.consume:
            if sid not in stored:
                return f"signal {sid} of run {w.run_id!r} does not exist"
            holder = stored[sid] if stored[sid] is not None else taken.get(sid)
            if holder is not None and holder != by:
                return (
                    f"signal {sid} of run {w.run_id!r} was consumed by the wait at {holder},"
                    f" not the one at {by}"
                )
        for sid, by in w.consume:
            taken[sid] = by
        return None

    def _fences(self, cur: Cursor, run_ids: list[str]) -> dict[str, tuple[int, int, str]]:
        fences: dict[str, tuple[int, int, str]] = {}
        if len(run_ids) == 1:  # a run alone (the usual commit): no IN list to build
            sql = "SELECT epoch, cancel_requested, status FROM ms_runs WHERE id = ?"
            cur.execute(sql + self._fence_lock, run_ids)
            row = cur.fetchone()
            if row is not None:
                fences[run_ids[0]] = (row[0], row[1], row[2])
            return fences
        for i in range(0, len(run_ids), 500):
            chunk = run_ids[i : i + 500]
            # Ordered, so that concurrent batches lock rows in one order (no deadlock).
            cur.execute(
                "SELECT id, epoch, cancel_requested, status FROM ms_runs WHERE id IN"
                f" ({', '.join('?' * len(chunk))}) ORDER BY id{self._fence_lock}",
                chunk,
            )
            for rid, epoch, cancel, status in cur.fetchall():
                fences[rid] = (epoch, cancel, status)
        return fences

    def _epochs(self, cur: Cursor, run_ids: list[str]) -> dict[str, int]:
        """Epochs read without locking (of runs whose fence row was skipped)."""
        epochs: dict[str, int] = {}
        for i in range(0, len(run_ids), 500):
            chunk = run_ids[i : i + 500]
            cur.execute(
                f"SELECT id, epoch FROM ms_runs WHERE id IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
            epochs.update({rid: epoch for rid, epoch in cur.fetchall()})
        return epochs

    def _transition(self, cur: Cursor, w: RunWrite, cancel_requested: bool, now: float) -> None:
        """The run's move its holder commits, by the state machine's edges."""
        t = w.transition
        assert t is not None
        if t.kind == "finish":
            finish(self, cur, w.run_id, w.epoch, t, now, cancel_requested=cancel_requested)
        elif t.kind == "suspend":
            suspend(self, cur, w.run_id, w.epoch, t, now, cancel_requested=cancel_requested)
        else:
            session = t.session
            if session is None and w.steps:
                session = w.steps[0].session
            next_session(cur, w.run_id, w.epoch, session=session, handoff=t.handoff, now=now)


def _ends(w: RunWrite, *, but: str | None = None) -> bool:
    """Whether ``w`` ends its run (and so tells its parent, if it has one); with
    ``but``, to another status than that one."""
    t = w.transition
    return t is not None and t.kind == "finish" and t.status in FINISHED and t.status != but


def _deepest_first(cur: Cursor, writes: list[tuple[RunWrite, bool]]) -> list[tuple[RunWrite, bool]]:
    """``writes`` with the ends of runs deeper in a tree of child runs first.

    A run's end cancels its unfinished children (``close_children``): a child whose own
    end is in the same batch must end first, as it would have in a commit of its own,
    or the cascade would ask it to cancel under the end it is about to commit (which
    was decided without that request, under the fence read before). Only a batch that
    ends several runs reads anything (the one-round-trip commit refuses a batch whose
    ends touch each other's rows, so it never needs this)."""
    ending = [w.run_id for w, _ in writes if _ends(w)]
    if len(ending) < 2:
        return writes
    cur.execute(
        "WITH RECURSIVE up (id, node, depth) AS ("
        f" SELECT id, id, 0 FROM ms_runs WHERE id IN ({', '.join('?' * len(ending))})"
        " UNION ALL SELECT up.id, r.parent, up.depth + 1 FROM up JOIN ms_runs r"
        " ON r.id = up.node WHERE r.parent_kind = 'child' AND r.parent IS NOT NULL"
        " AND up.depth < 1000)"
        " SELECT id, max(depth) FROM up GROUP BY id",
        ending,
    )
    depth = {rid: d for rid, d in cur.fetchall()}
    # Stable: writes that end nothing, or at one depth, keep the batch's order.
    return sorted(writes, key=lambda x: -depth.get(x[0].run_id, 0) if _ends(x[0]) else 0)


def _ending(batch: Sequence[RunWrite]) -> list[str]:
    """The runs ``batch`` ends (a finish to a final status): their commit cancels
    their children (``close_children``), whose rows it locks first."""
    return sorted(w.run_id for w in batch if _ends(w))
