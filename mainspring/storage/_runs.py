"""Runs: submitting, reading and listing them, forking, retrying and cancelling
(pruning is ``_retention.py``). Every move of a run's status, these included, is an
edge of the state machine in ``_transitions.py``."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

from .._errors import RunConflict, RunNotFound
from .._serde import dumps
from ._children import ChildLocked, child_starts, lock_children, retell_parent, share_child_ends
from ._connection import Connection, Cursor
from ._records import FINISHED, ParentClose, RunRecord, StepRecord
from ._rows import (
    _RUN_COLUMNS,
    _RUN_SUMMARY_COLUMNS,
    _STEP_COLUMNS,
    _UPSERT_STEP,
    _claimable_sql,
    _given,
    _run,
    _step,
    _step_params,
    _versions_sql,
)
from ._transitions import ask_cancel, cancel_at_birth, cancel_children, retry
from ._transitions import cancel as cancel_run

__all__ = ["RunTables"]

_T = TypeVar("_T")

# Attempts of a cancel (or a fork) that meets a just-started child held by another
# transaction (see ``RunTables._cancel``); the last one waits for it.
_LOCK_ATTEMPTS = 8


class RunTables(Connection):
    """Runs as their submitters and operators see them: methods of every
    :class:`~mainspring.storage.Store`."""

    # -- runs -------------------------------------------------------------------------

    def create_run(
        self,
        *,
        run_id: str,
        workflow: str,
        input: str,
        key: str | None,
        now: float,
        traceparent: str | None = None,
        parent: str | None = None,
        parent_step: str | None = None,
        version: str | None = None,
        queue: str | None = None,
        queue_key: str | None = None,
        priority: int = 0,
        parent_close: ParentClose = "cancel",
    ) -> tuple[RunRecord, bool]:
        """Insert a queued run, or return the existing run with that ``key``.
        ``traceparent``: the caller's W3C trace context, kept with the run.
        ``parent`` / ``parent_step``: the run that starts this one as its child, and
        its step (``"session:seq"``); with a ``key`` too, a child that run started at
        that step already is returned, whatever its key (``created`` False).
        ``version``: the submitting code's version.
        ``queue`` / ``queue_key`` / ``priority``: the queue that starts it within its
        limits (created with no limits if it was never declared), its key there and
        its priority (higher first). ``parent_close``: what the parent's end does to
        a child (:data:`ParentClose`).

        Returns ``(run, created)``.
        """
        kind = None if parent is None else "child"
        close = None if parent is None else parent_close
        values: tuple[Any, ...] = (run_id, workflow, key, input, now, now, traceparent)
        values += (parent, parent_step, kind, version, queue, queue_key, priority, close)
        insert = (
            "INSERT INTO ms_runs (id, workflow, idem_key, status, input, created_at,"
            " updated_at, traceparent, parent, parent_step, parent_kind, version, queue,"
            " queue_key, priority, parent_close)"
            " VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        if queue is None and (queue_key is not None or priority):
            raise ValueError("queue_key and priority need a queue")
        with self._write() as cur:
            if queue is not None:
                # Every queue a run names has a row: the claim finds queues by them.
                cur.execute(
                    "INSERT INTO ms_queues (name, updated_at) VALUES (?, ?)"
                    " ON CONFLICT (name) DO NOTHING",
                    (queue, now),
                )
            if parent is not None:
                # The parent's row is held while its child is added, so that a cancel
                # of the parent (which holds it too) sees the child and cancels it.
                cur.execute(
                    f"SELECT cancel_requested, status FROM ms_runs WHERE id = ?{self._row_lock}",
                    (parent,),
                )
                held = cur.fetchone()
                if held is None:
                    raise RunNotFound(f"cannot start a child of {parent!r}: no such run")
                if key is not None and parent_step is not None:
                    # The child this position started already, whatever key it was
                    # started under (an earlier version derived other keys): under the
                    # parent's lock, so that two starts of one position make one child.
                    cur.execute(
                        f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE parent = ?"
                        " AND parent_step = ? AND parent_kind = 'child' ORDER BY created_at, id",
                        (parent, parent_step),
                    )
                    row = cur.fetchone()
                    if row is not None:
                        return _checked_workflow(_run(row), key, workflow), False
            if key is None:
                cur.execute(insert, values)
                created = True
            else:
                # One conditional statement, not a read then an insert: concurrent
                # submits with one key (many API servers) all get the one run. On
                # PostgreSQL the loser waits for the winner's commit, then selects it.
                cur.execute(insert + " ON CONFLICT (idem_key) DO NOTHING", values)
                created = cur.rowcount == 1
            if not created:
                cur.execute(f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE idem_key = ?", (key,))
                return _checked_workflow(_run(cur.fetchone()), key, workflow), False
            if parent is not None and (held[0] or held[1] in FINISHED):
                # Started by a parent being cancelled (or gone): born cancelled.
                cancel_at_birth(cur, run_id, _cancel_error("its parent run was cancelled"), now)
            else:
                self._notify(cur, run_id)
            cur.execute(f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE id = ?", (run_id,))
            return _run(cur.fetchone()), True

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._read() as cur:
            cur.execute(f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE id = ?", (run_id,))
            row = cur.fetchone()
            return _run(row) if row else None

    def list_runs(
        self,
        *,
        statuses: Sequence[str] | None = None,
        queue: str | None = None,
        workflow: str | None = None,
        limit: int = 50,
        offset: int = 0,
        since: float | None = None,
        search: str | None = None,
        summary: bool = False,
        versions: Sequence[str | None] | None = None,
        parent: str | None = None,
    ) -> list[RunRecord]:
        """Newest first. ``since``: created at or after this time; ``search``: text
        found (case-insensitively) in the id, key, input, output or error; ``summary``:
        leave input, output and hand-off out (``None``), for lists; ``versions``: only
        runs submitted by these code versions (``None`` in it: with no version);
        ``parent``: only the runs whose parent (child runs and forks) is that run;
        ``queue``: only the runs submitted to that queue."""
        where, params = _given(queue=queue, parent=parent)
        if statuses:
            where.append(f"status IN ({', '.join('?' * len(statuses))})")
            params.extend(statuses)
        if workflow:
            where.append("workflow = ?")
            params.append(workflow)
        if versions is not None:
            v_sql, v_params = _versions_sql(versions)
            where.append(v_sql)
            params.extend(v_params)
        if since is not None:
            where.append("created_at >= ?")
            params.append(since)
        if search:
            escaped = search.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            columns = ("id", "idem_key", "input", "output", "error")
            where.append("(" + " OR ".join(f"LOWER({c}) LIKE ? ESCAPE '\\'" for c in columns) + ")")
            params.extend([f"%{escaped}%"] * len(columns))
        sql = f"SELECT {_RUN_SUMMARY_COLUMNS if summary else _RUN_COLUMNS} FROM ms_runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?"
        with self._read() as cur:
            cur.execute(sql, (*params, limit, offset))
            return [_run(r) for r in cur.fetchall()]

    def runs_changed_since(self, after: float, *, limit: int = 200) -> list[RunRecord]:
        """Runs whose row changed after ``after`` (their ``updated_at``), oldest change
        first: what a live list needs to redraw (summaries: no input, output or
        hand-off)."""
        with self._read() as cur:
            cur.execute(
                f"SELECT {_RUN_SUMMARY_COLUMNS} FROM ms_runs WHERE updated_at > ?"
                " ORDER BY updated_at, id LIMIT ?",
                (after, limit),
            )
            return [_run(r) for r in cur.fetchall()]

    def count_runs(self) -> dict[str, int]:
        """How many runs are in each status."""
        with self._read() as cur:
            cur.execute("SELECT status, COUNT(*) FROM ms_runs GROUP BY status")
            return {status: n for status, n in cur.fetchall()}

    def run_workflows(self, limit: int = 500) -> list[str]:
        """The workflow names runs in the store have (for a filter), sorted."""
        with self._read() as cur:
            cur.execute("SELECT DISTINCT workflow FROM ms_runs ORDER BY workflow LIMIT ?", (limit,))
            return [r[0] for r in cur.fetchall()]

    def run_ids_starting(self, prefix: str, limit: int = 2) -> list[str]:
        """Ids of runs that start with ``prefix`` (up to ``limit``), for abbreviated ids."""
        # LIKE with the prefix's own wildcards escaped: "a_" matches "a_...", not "ab...".
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._read() as cur:
            cur.execute(
                "SELECT id FROM ms_runs WHERE id LIKE ? ESCAPE '\\' ORDER BY id LIMIT ?",
                [pattern, limit],
            )
            return [r[0] for r in cur.fetchall()]

    def next_wake(
        self,
        workflows: Sequence[str] | None = None,
        versions: Sequence[str | None] | None = None,
        skip: Collection[str] = (),
    ) -> float | None:
        """The earliest ``wake_at`` of a sleeping or waiting run (of these workflows,
        and code versions as :meth:`claim` takes them, but the runs in ``skip``):
        when a worker next has something to claim that nobody needs to send."""
        wf_sql, params = _claimable_sql(workflows, versions, skip)
        with self._read() as cur:
            cur.execute(
                "SELECT MIN(wake_at) FROM ms_runs WHERE status IN ('sleeping', 'waiting')"
                f" AND wake_at IS NOT NULL{wf_sql}",
                params,
            )
            row = cur.fetchone()
            return None if row is None or row[0] is None else float(row[0])

    def run_stamps(self) -> list[tuple[str, str, str, float]]:
        """``(id, workflow, status, updated_at)`` of every run: what a metrics scrape
        needs to tell which runs changed."""
        with self._read() as cur:
            cur.execute("SELECT id, workflow, status, updated_at FROM ms_runs")
            return [(r[0], r[1], r[2], r[3]) for r in cur.fetchall()]

    def run_changes(
        self, after: float | None = None
    ) -> list[tuple[str, str, str, float, float | None, str | None]]:
        """``(id, workflow, status, updated_at, finished_at, wait_reason)`` of the runs
        whose row changed after ``after`` (every run when ``None``): how a metrics
        scrape keeps its aggregates without reading every run (``ms_runs_updated``)."""
        sql = "SELECT id, workflow, status, updated_at, finished_at, wait_reason FROM ms_runs"
        with self._read() as cur:
            if after is None:
                cur.execute(sql)
            else:
                cur.execute(sql + " WHERE updated_at > ?", (after,))
            return [(r[0], r[1], r[2], r[3], r[4], r[5]) for r in cur.fetchall()]

    def oldest_finished_at(self) -> float | None:
        """The earliest ``finished_at`` in the store (``ms_runs_finished`` index): it
        rises when :meth:`prune` deletes runs, which delete oldest first."""
        with self._read() as cur:
            cur.execute("SELECT MIN(finished_at) FROM ms_runs WHERE finished_at IS NOT NULL")
            row = cur.fetchone()
            return None if row is None or row[0] is None else float(row[0])

    def fork_run(
        self,
        source: RunRecord,
        *,
        run_id: str,
        session: int,
        upto_seq: int,
        output: str | None,
        now: float,
        outputs: Mapping[int, str] | None = None,
        parent_step: str | None = None,
        traceparent: str | None = None,
    ) -> RunRecord:
        """A new queued run of ``source``'s workflow and input whose journal is a copy
        of ``source``'s session ``session`` up to and including ``upto_seq``.
        The new run's ``parent`` is ``source.id``, its ``parent_step`` the step it was
        forked from (``"session:seq"``; default: ``upto_seq``'s).

        ``output`` replaces the journaled output of that last step (``None``: kept);
        ``outputs`` replaces the outputs of the steps it names by seq.
        ``traceparent``: the W3C trace context its spans join.
        The new run starts in ``session`` with ``source``'s hand-off, which the caller
        must have checked is the hand-off of that session.

        A child run whose start the copy holds reaches the new run as it reaches its
        parent: a child that has ended left its end for the new run here, one still
        running tells it when it ends.
        """

        def copied(cur: Cursor, where: str = "") -> list[StepRecord]:
            cur.execute(
                f"SELECT {_STEP_COLUMNS} FROM ms_steps WHERE run_id = ? AND session = ?"
                f" AND seq <= ?{where} ORDER BY seq",
                (source.id, session, upto_seq),
            )
            rows = [_step(r) for r in cur.fetchall()]
            for r in rows:
                r.run_id, r.epoch = run_id, 0
                if r.seq == upto_seq and output is not None:
                    r.output = output
                if outputs and r.seq in outputs:
                    r.output = outputs[r.seq]
            return rows

        def attempt(cur: Cursor, last: bool) -> RunRecord:
            # The children whose starts the copy holds are locked before the source
            # (the order a child's end takes: its row, then its parent's), so that
            # either this sees a child ended or the child's end sees this fork.
            ends = lock_children(self, cur, child_starts(copied(cur, " AND role = 'child'")))
            # The source's row is held while its journal is copied, so the copy and
            # the hand-off are of one moment (its worker may be committing).
            row = self._locked_run(cur, source.id, "session, handoff", "fork")
            handoff = _fork_handoff(source, session, now_session=row[0], now_handoff=row[1])
            cur.execute(
                "INSERT INTO ms_runs (id, workflow, status, input, session, handoff,"
                " created_at, updated_at, parent, parent_step, parent_kind, version, queue,"
                " queue_key, priority, traceparent) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?,"
                " ?, 'fork', ?, ?, ?, ?, ?)",
                (
                    run_id,
                    source.workflow,
                    source.input,
                    session,
                    handoff if session else None,
                    now,
                    now,
                    source.id,
                    parent_step if parent_step is not None else f"{session}:{upto_seq}",
                    source.version,
                    # A fork waits its turn in its source's queue.
                    source.queue,
                    source.queue_key,
                    source.priority,
                    traceparent,
                ),
            )
            rows = copied(cur)
            if rows:
                cur.executemany(_UPSERT_STEP, [_step_params(r) for r in rows])
            # A start the first read did not see (the source's journal moved under
            # it): locked now, out of order, so not waited for while the source is
            # held (that child may be ending, holding its row and waiting for the
            # source's): held, it rolls the fork back, and the next attempt sees it
            # first. A last attempt waits (the old order).
            late = child_starts(rows).keys() - ends.keys()
            ends.update(lock_children(self, cur, late, wait=last))
            share_child_ends(cur, run_id, rows, ends, now)
            self._notify(cur, run_id)
            cur.execute(f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE id = ?", (run_id,))
            return _run(cur.fetchone())

        return self._attempts(attempt)

    def retry_run(self, run_id: str, *, from_seq: int | None, now: float) -> RunRecord:
        """Queue a failed run again. Journal rows of its current session from
        ``from_seq`` on that did not complete are deleted, so that step runs again;
        completed rows are never deleted (a completed step never runs twice), so
        they replay, wherever they are.

        Re-opening the run bumps its epoch: a worker that still held it cannot
        write into the retried run.

        Raises:
            RunNotFound: no such run.
            RunConflict: the run is not failed (a concurrent retry got there first).
        """
        with self._write() as cur:
            run = _run(self._locked_run(cur, run_id, _RUN_COLUMNS, "retry"))
            if run.status != "failed":
                raise RunConflict(
                    f"cannot retry run {run_id!r}: it is {run.status}, and only a failed run "
                    "can be retried",
                    run_id=run_id,
                )
            if from_seq is not None:
                cur.execute(
                    "DELETE FROM ms_steps WHERE run_id = ? AND session = ? AND seq >= ?"
                    " AND status <> 'completed'",
                    (run_id, run.session, from_seq),
                )
            if not retry(cur, run_id, now):  # retried concurrently: raising rolls the delete back
                raise RunConflict(f"run {run_id!r} was retried concurrently", run_id=run_id)
            retell_parent(cur, run_id, now)
            self._notify(cur, run_id)
            cur.execute(f"SELECT {_RUN_COLUMNS} FROM ms_runs WHERE id = ?", (run_id,))
            return _run(cur.fetchone())

    def cancel(self, run_id: str, now: float, reason: str | None = None) -> str:
        """Cancel a run; returns its status afterwards.

        A run that no worker holds is cancelled at once (its epoch moves on, so
        nothing written by an earlier holder can land after). A running run is
        marked and its worker cancels it at the next step boundary (status stays
        ``running`` until then). A finished run is left exactly as it is and its
        final status returned.

        The cancel cascades: the run's unfinished child runs (``ctx.child``) are
        cancelled with it, recursively, in the same transaction.
        """
        error = _cancel_error(reason)
        try:
            return self._attempts(
                lambda cur, last: self._cancel(cur, run_id, error, now, last=last)
            )
        except _TooLate as late:  # rolled back: the cascade's writes with it
            return late.status

    def _attempts(self, attempt: Callable[[Cursor, bool], _T]) -> _T:
        """Run ``attempt`` in a transaction until it does not raise
        :class:`ChildLocked` (a child it must not wait for, held elsewhere): each
        time rolled back, letting go of the rows it held (a parent, a fork's
        source), and taken again. The last of ``_LOCK_ATTEMPTS`` is told
        (``True``) to wait rather than raise."""
        n = 1
        while True:
            try:
                with self._write() as cur:
                    return attempt(cur, n == _LOCK_ATTEMPTS)
            except ChildLocked:
                n += 1  # rolled back

    def _cancel(self, cur: Cursor, run_id: str, error: str, now: float, *, last: bool) -> str:
        """One attempt of :meth:`cancel`, in the caller's transaction. Raises
        :class:`ChildLocked` (unless ``last``) for a child that appeared after the
        children were locked and that another transaction holds."""
        cur.execute("SELECT status FROM ms_runs WHERE id = ?", (run_id,))
        first = cur.fetchone()
        if first is not None and first[0] not in FINISHED:
            # Children first: their rows are locked before the parent's, the
            # order a child's own end takes (its row, then its parent's).
            cancel_children(self, cur, run_id, error, now)
        # Locked: a worker's commit (a suspend, a finish) cannot slip between
        # this read and the write below.
        status: str = self._locked_run(cur, run_id, "status", "cancel")[0]
        if status in FINISHED:
            if first is not None and first[0] not in FINISHED:
                # It ended while its children were being cancelled: the cancel came too
                # late, and changes nothing (its end has cascaded as it ended).
                raise _TooLate(status)
            return status
        # A child started while the cancel came in (its start holds this row). Holding
        # the parent now, its row must not be waited for: that child may be ending,
        # its transaction holding its row and waiting for the parent's (a deadlock on
        # PostgreSQL). Held, it raises ChildLocked, and the next attempt locks it
        # with the others, before the parent. A last attempt waits (the old order):
        # each retry takes a child started within the one before, so it is not reached.
        cancel_children(self, cur, run_id, error, now, wait=last)
        if status == "running":
            ask_cancel(cur, run_id, error, now)
            return status
        cancel_run(self, cur, run_id, error, now)
        return "cancelled"


def _checked_workflow(existing: RunRecord, key: str | None, workflow: str) -> RunRecord:
    """``existing``, the run a create found in its place, if it is of ``workflow``."""
    if existing.workflow != workflow:
        named = f"key {key!r}" if existing.key == key else f"step {existing.parent_step!r}"
        raise RunConflict(
            f"{named} already names a run of workflow {existing.workflow!r}, not {workflow!r}",
            run_id=existing.id,
        )
    return existing


class _TooLate(Exception):
    """A cancel found its run ended once it held it: roll back what it did first."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


def _cancel_error(reason: str | None) -> str:
    return dumps({"type": "Cancelled", "message": reason or "cancelled"})


def _fork_handoff(
    source: RunRecord, session: int, *, now_session: int, now_handoff: str | None
) -> str | None:
    """The hand-off a fork from ``source``'s ``session`` starts with: the run's own
    if it is still in that session (``now_*``: its row as the fork holds it), the
    caller's record's if that record is of that session, none for session 0.

    Raises:
        RunConflict: any other session's hand-off is not kept.
    """
    if session == now_session:
        return now_handoff
    if session == source.session:
        return source.handoff  # the caller's record is of that session
    if session == 0:
        return None
    raise RunConflict(
        f"cannot fork run {source.id!r} from session {session}: its hand-off is "
        f"not kept (the run is in session {now_session})",
        run_id=source.id,
    )
