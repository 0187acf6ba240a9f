"""The run's state machine: the one writer of ``ms_runs.status`` and ``ms_runs.epoch``.

::

    queued ───claim──▶ running ──finish──▶ succeeded | failed | cancelled
      ▲  ▲               │ │ ▲                 │
      │  └───release─────┘ │ └─claim──┐        │ (failed only)
      │            suspend,│          │        │
      │             refuse ▼          │        │
      │               sleeping | waiting ◀─wake (waiting, due now)
      └──────────────────────retry──────────────┘
    queued | sleeping | waiting ──cancel──▶ cancelled
    running, lease run out ──dead_letter──▶ failed (cancelled when it was asked to)
    running ──next_session, ask_cancel──▶ running (its row changes, not its status)

Each edge is one row of :data:`RUN_EDGES` (from which statuses, to which, every column
it writes and every column it clears) and one function below that writes exactly
that: its ``UPDATE`` is built from the row (:meth:`RunEdge.update`), so the table
cannot drift from what is written, and ``tests`` walk the table on every store
(``mainspring.testing``'s transition conformance). Each ``UPDATE`` names the
statuses the edge leaves from, so an illegal edge writes nothing and its function
answers ``False``.

**The fence** is spelled once, :func:`fenced`: a holder's write applies only while
its run is ``running`` at the epoch it holds. The journal's commit, PostgreSQL's
one-round-trip pipeline and its one-statement commit, heartbeats, releases,
refusals and token streams all use that spelling; a dialect may change how the
statements travel, never what they write or check.

**The end of a run** (a finish, a dead-letter, a cancel, a cancel that cascades from
its parent) goes through one hook, :func:`_ended`, which alone queues the run's
event, tells its parent (and the forks holding its start) and closes its children.
Every end sets ``finished_at`` and clears the same columns (:data:`_END_CLEARS`).

The one status written outside this module is a run's first: ``queued``, by the
``INSERT`` that creates it (``create_run``, ``fork_run``, a schedule's fire).

``ms_runs.error`` holds the run's latest reason, not only a failure's: the reason
a cancel was asked with (on a run still ``running`` until its worker cancels it)
and the note of a refusal to replay (on a ``sleeping`` or ``waiting`` run, see
``refuse``). A column of its own for them would need a migration and a change of
every reader (``show``, ``doctor``, the API's run, the dashboard), which read the
reason there today; see docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._serde import dumps, loads
from ._api import queue_event
from ._children import (
    ON_CANCEL,
    ON_CLOSE,
    UNFINISHED,
    ChildLocked,
    child_signal,
    end_payload,
    forks_holding,
)
from ._connection import Connection, Cursor
from ._records import FINISHED, WAKE_NOW, RunStatus, RunTransition, split_wait_signals

__all__ = [
    "RUN_EDGES",
    "RunEdge",
    "ask_cancel",
    "cancel",
    "cancel_at_birth",
    "cancel_children",
    "claim",
    "close_children",
    "dead_letter",
    "fence_holds",
    "fenced",
    "finish",
    "next_session",
    "refuse",
    "release",
    "retry",
    "suspend",
    "take_edge",
    "wake",
]

# -- the fence ---------------------------------------------------------------------


def fenced(alias: str = "", epoch: str = "?") -> str:
    """The fence as an SQL condition on a run row (``alias``: its table's, with the
    dot; ``epoch``: the SQL of the epoch the writer holds)."""
    return f"{alias}epoch = {epoch} AND {alias}status = 'running'"


def fence_holds(epoch: int, status: str, held: int) -> bool:
    """The fence on a row already read: :func:`fenced` in Python."""
    return epoch == held and status == "running"


# -- the table ---------------------------------------------------------------------

# What every end of a run clears: it holds no worker, no lease and waits for nothing.
_END_CLEARS = (
    ("owner", "NULL"),
    ("lease_until", "NULL"),
    ("wake_at", "NULL"),
    ("wait_reason", "NULL"),
    ("wait_signal", "NULL"),
)
_NOT_FINISHED: tuple[RunStatus, ...] = ("queued", "sleeping", "waiting", "running")
_PARKED: tuple[RunStatus, ...] = ("sleeping", "waiting")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEdge:
    """One edge of the run's state machine.

    Attributes:
        name: the function that takes it.
        sources: the statuses it leaves from (any other: refused, nothing written).
        targets: the statuses it may end in.
        sets: ``(column, SQL value)`` in the order of the ``UPDATE``'s ``SET``: a
            ``?`` is a parameter, ``NULL`` clears the column, ``{at}`` is the SQL of
            "now" in lease arithmetic (the caller's or the database's clock).
        fence: the ``WHERE`` holds the writer's epoch too (:func:`fenced`).
        ends: the run ends: :func:`_ended` follows the write.
    """

    name: str
    sources: tuple[RunStatus, ...]
    targets: tuple[RunStatus, ...]
    sets: tuple[tuple[str, str], ...]
    fence: bool = False
    ends: bool = False

    @property
    def writes(self) -> frozenset[str]:
        """The columns it gives a value."""
        return frozenset(c for c, v in self.sets if v != "NULL")

    @property
    def clears(self) -> frozenset[str]:
        """The columns it sets NULL."""
        return frozenset(c for c, v in self.sets if v == "NULL")

    @property
    def bumps_epoch(self) -> bool:
        return ("epoch", "epoch + 1") in self.sets

    def assignments(self, at: str = "?", **override: str) -> str:
        """The ``SET`` list, ``{at}`` filled, with ``override``'s SQL for those columns
        (a statement that brings a value from elsewhere, as PostgreSQL's claim)."""
        unknown = override.keys() - {c for c, _ in self.sets}
        assert not unknown, f"{self.name} does not write {sorted(unknown)}"
        return ", ".join(f"{c} = {override.get(c, v).format(at=at)}" for c, v in self.sets)

    def update(self, at: str = "?", *, extra: str = "") -> str:
        """The edge's statement; its parameters: the ``SET``'s, the run id, the
        writer's epoch (``fence``), then ``extra``'s."""
        where = f"id = ? AND status IN ({', '.join(repr(s) for s in self.sources)})"
        if self.fence:
            where = f"id = ? AND {fenced()}"
        return f"UPDATE ms_runs SET {self.assignments(at)} WHERE {where}{extra}"


_CLAIM = RunEdge(
    name="claim",
    sources=_NOT_FINISHED,  # running: its lease ran out (a takeover)
    targets=("running",),
    sets=(
        ("status", "'running'"),
        ("epoch", "epoch + 1"),
        ("owner", "?"),
        ("lease_until", "{at} + ?"),
        ("wake_at", "NULL"),
        ("wait_reason", "NULL"),
        ("wait_signal", "NULL"),
        ("recoveries", "?"),
        ("updated_at", "?"),
    ),
)
_SUSPEND = RunEdge(
    name="suspend",
    sources=("running",),
    targets=_PARKED,
    sets=(
        ("status", "?"),
        ("wake_at", "?"),
        ("wait_reason", "?"),
        ("wait_signal", "?"),
        ("keeps_slot", "?"),
        ("owner", "NULL"),
        ("lease_until", "NULL"),
        ("updated_at", "?"),
    ),
    fence=True,
)
_REFUSE = RunEdge(
    name="refuse",
    sources=("running",),
    targets=_PARKED,
    sets=(
        ("status", "?"),
        ("owner", "NULL"),
        ("lease_until", "NULL"),
        ("wake_at", "?"),
        ("wait_reason", "'replay'"),
        ("wait_signal", "NULL"),
        ("error", "?"),
        ("updated_at", "?"),
    ),
    fence=True,
)
_RELEASE = RunEdge(
    name="release",
    sources=("running",),
    targets=("queued",),
    sets=(("status", "'queued'"), ("owner", "NULL"), ("lease_until", "NULL"), ("updated_at", "?")),
    fence=True,
)
_WAKE = RunEdge(
    name="wake",
    sources=("waiting",),
    targets=("waiting",),
    sets=(("wake_at", "?"), ("updated_at", "?")),
)
_NEXT_SESSION = RunEdge(
    name="next_session",
    sources=("running",),
    targets=("running",),
    sets=(("session", "?"), ("handoff", "?"), ("updated_at", "?")),
    fence=True,
)
_ASK_CANCEL = RunEdge(
    name="ask_cancel",
    sources=("running",),
    targets=("running",),
    sets=(("cancel_requested", "1"), ("error", "?"), ("updated_at", "?")),
)
_FINISH = RunEdge(
    name="finish",
    sources=("running",),
    targets=("succeeded", "failed", "cancelled"),
    sets=(
        ("status", "?"),
        ("epoch", "epoch + 1"),
        ("output", "?"),
        # A cancelled run keeps the reason ``cancel()`` stored with the request.
        (
            "error",
            "CASE WHEN CAST(? AS TEXT) = 'cancelled' AND cancel_requested = 1"
            " AND error IS NOT NULL THEN error ELSE ? END",
        ),
        ("finished_at", "?"),
        ("updated_at", "?"),
        *_END_CLEARS,
    ),
    fence=True,
    ends=True,
)
_DEAD_LETTER = RunEdge(
    name="dead_letter",
    sources=("running",),
    targets=("failed", "cancelled"),
    sets=(
        ("status", "?"),
        ("epoch", "epoch + 1"),
        ("error", "?"),
        ("recoveries", "?"),
        ("finished_at", "?"),
        ("updated_at", "?"),
        *_END_CLEARS,
    ),
    ends=True,
)
_CANCEL = RunEdge(
    name="cancel",
    sources=("queued", "sleeping", "waiting"),  # running: ask_cancel, its worker ends it
    targets=("cancelled",),
    sets=(
        ("status", "'cancelled'"),
        ("epoch", "epoch + 1"),
        ("cancel_requested", "1"),
        ("error", "?"),
        ("finished_at", "?"),
        ("updated_at", "?"),
        *_END_CLEARS,
    ),
    ends=True,
)
# A child created under a parent being cancelled (or gone) in the transaction that
# inserts it: no worker ever saw it, nobody follows it yet, and its parent is the
# one ending, so there is nothing to tell, no event and no epoch to move on.
_CANCEL_AT_BIRTH = RunEdge(
    name="cancel_at_birth",
    sources=("queued",),
    targets=("cancelled",),
    sets=(
        ("status", "'cancelled'"),
        ("cancel_requested", "1"),
        ("error", "?"),
        ("finished_at", "?"),
    ),
)
_RETRY = RunEdge(
    name="retry",
    sources=("failed",),
    targets=("queued",),
    sets=(
        ("status", "'queued'"),
        ("epoch", "epoch + 1"),
        ("output", "NULL"),
        ("error", "NULL"),
        ("finished_at", "NULL"),
        *_END_CLEARS,
        ("recoveries", "0"),
        ("cancel_requested", "0"),
        ("retries", "retries + 1"),
        ("updated_at", "?"),
    ),
)

RUN_EDGES: Mapping[str, RunEdge] = {
    e.name: e
    for e in (
        _CLAIM,
        _SUSPEND,
        _REFUSE,
        _RELEASE,
        _WAKE,
        _NEXT_SESSION,
        _ASK_CANCEL,
        _FINISH,
        _DEAD_LETTER,
        _CANCEL,
        _CANCEL_AT_BIRTH,
        _RETRY,
    )
}

# -- the edges ---------------------------------------------------------------------


def claim(
    cur: Cursor,
    run_id: str,
    *,
    worker: str,
    at: tuple[str, list[Any]],
    lease_s: float,
    recoveries: int,
    now: float,
) -> bool:
    """A worker takes the run: a new epoch (the fence of all its holder's writes), a
    lease until ``at`` + ``lease_s``, and ``recoveries`` (counted by the claim)."""
    at_sql, at_params = at
    cur.execute(_CLAIM.update(at_sql), (worker, *at_params, lease_s, recoveries, now, run_id))
    return cur.rowcount == 1


def suspend(
    conn: Connection,
    cur: Cursor,
    run_id: str,
    epoch: int,
    t: RunTransition,
    now: float,
    *,
    cancel_requested: bool,
) -> bool:
    """The holder parks the run (``t``: ``sleeping`` or ``waiting``) and lets it go. A
    run asked to cancel, or whose signal beat the wait, is due at once."""
    wake_at = t.wake_at
    if cancel_requested:
        wake_at = WAKE_NOW  # let a worker pick it up at once and cancel it
    elif t.wait_signal is not None:
        names = split_wait_signals(t.wait_signal)  # any of them wakes the run
        cur.execute(
            "SELECT 1 FROM ms_signals WHERE run_id = ? AND name IN"
            f" ({', '.join('?' * len(names))}) AND consumed_at IS NULL LIMIT 1",
            (run_id, *names),
        )
        if cur.fetchone():  # the signal beat the wait: wake at once
            wake_at = WAKE_NOW
    slot = int(t.keeps_slot and t.status == "sleeping")
    params = (t.status, wake_at, t.wait_reason, t.wait_signal, slot, now, run_id, epoch)
    cur.execute(_SUSPEND.update(), params)
    if cur.rowcount != 1:
        return False
    if wake_at == WAKE_NOW:
        conn._notify(cur, run_id)
    if t.status == "waiting" and wake_at != WAKE_NOW:
        waiting = {"status": "waiting", "wait_reason": t.wait_reason}
        queue_event(cur, run_id, "run.waiting", waiting, now)
    return True


def refuse(
    conn: Connection,
    cur: Cursor,
    run_id: str,
    epoch: int,
    *,
    status: RunStatus,
    wake_at: float,
    note: str | None,
    now: float,
) -> bool:
    """The holder cannot replay the run and gives it back, ``sleeping`` (due at
    once, for a worker whose code can) or ``waiting`` (parked), ``wait_reason``
    ``replay``, with ``note`` as its ``error`` (see ``LeaseTables.refuse``)."""
    cur.execute(_REFUSE.update(), (status, wake_at, note, now, run_id, epoch))
    if cur.rowcount != 1:
        return False
    if status == "sleeping":
        conn._notify(cur, run_id)
    return True


def release(conn: Connection, cur: Cursor, run_id: str, epoch: int, now: float) -> bool:
    """The holder gives the run back (graceful shutdown): queued again, its epoch
    kept (the next claim moves it on), no recovery counted."""
    cur.execute(_RELEASE.update(), (now, run_id, epoch))
    if cur.rowcount != 1:
        return False
    conn._notify(cur, run_id)
    return True


def wake(conn: Connection, cur: Cursor, run_id: str, now: float) -> bool:
    """A waiting run's signal came: due at once."""
    cur.execute(_WAKE.update(), (WAKE_NOW, now, run_id))
    if cur.rowcount != 1:
        return False
    conn._notify(cur, run_id)
    return True


def next_session(
    cur: Cursor, run_id: str, epoch: int, *, session: int | None, handoff: str | None, now: float
) -> bool:
    """Continue-as-new: the run moves from ``session`` (``None``: the one it is in)
    to the next, with ``handoff``; its holder keeps the lease. Set, not incremented:
    a re-sent continue-as-new leaves the run in the session the first send opened
    (same idempotency keys downstream)."""
    ending = session
    if ending is None:
        cur.execute("SELECT session FROM ms_runs WHERE id = ?", (run_id,))
        ending = int(cur.fetchone()[0])
    cur.execute(
        _NEXT_SESSION.update(extra=" AND session = ?"),
        (ending + 1, handoff, now, run_id, epoch, ending),
    )
    return cur.rowcount == 1


def ask_cancel(cur: Cursor, run_id: str, error: str, now: float) -> bool:
    """A running run is asked to cancel, with ``error`` as the reason its end keeps:
    its worker cancels it at its next step boundary (status stays ``running``)."""
    cur.execute(_ASK_CANCEL.update(), (error, now, run_id))
    return cur.rowcount == 1


# How a finish ends a run that was asked to cancel (its error: the one the cancel stored).
_CANCELLED = RunTransition(
    kind="finish", status="cancelled", error=dumps({"type": "Cancelled", "message": "cancelled"})
)


def finish(
    conn: Connection,
    cur: Cursor,
    run_id: str,
    epoch: int,
    t: RunTransition,
    now: float,
    *,
    cancel_requested: bool,
) -> bool:
    """The holder ends the run with ``t``'s final status, output and error. A cancel
    answered "asked" (the run was running) is honoured here, read under the fence:
    the run ends cancelled whatever its workflow returned or raised."""
    if cancel_requested and t.status != "cancelled":
        t = _CANCELLED
    params = (t.status, t.output, t.status, t.error, now, now, run_id, epoch)
    return _ended(conn, cur, _FINISH.update(), params, run_id, now)


def dead_letter(
    conn: Connection, cur: Cursor, run_id: str, *, recoveries: int, error: str, now: float
) -> RunStatus | None:
    """A run whose recoveries ran out ends ``failed`` with ``error``; one asked to
    cancel ends ``cancelled`` with the cancel's reason, as its finish would have.
    Ending it moves the fence on: its last holder, stalled but alive, must not
    write into a dead run. Returns the status it ended in (``None``: not running)."""
    cur.execute("SELECT cancel_requested, error FROM ms_runs WHERE id = ?", (run_id,))
    row = cur.fetchone()
    if row is None:
        return None
    asked, reason = row
    end: RunStatus = "cancelled" if asked else "failed"
    params = (end, reason if asked else error, recoveries, now, now, run_id)
    return end if _ended(conn, cur, _DEAD_LETTER.update(), params, run_id, now) else None


def cancel(
    conn: Connection, cur: Cursor, run_id: str, error: str, now: float, *, by_parent: bool = False
) -> bool:
    """A run no worker holds is cancelled at once, with ``error`` as its reason (its
    epoch moves on, so nothing written by an earlier holder can land after). Its
    children were cancelled by the caller first (:func:`cancel_children`, locked
    before the run: the order a child's end takes). ``by_parent``: the cancel
    cascades from the parent, which is not told (the forks holding its start are)."""
    params = (error, now, now, run_id)
    return _ended(
        conn, cur, _CANCEL.update(), params, run_id, now, tell_parent=not by_parent, close=False
    )


def cancel_at_birth(cur: Cursor, run_id: str, error: str, now: float) -> bool:
    """A child created under a parent being cancelled (or gone) is born cancelled,
    in the transaction that inserts it (see ``_CANCEL_AT_BIRTH``)."""
    cur.execute(_CANCEL_AT_BIRTH.update(), (error, now, run_id))
    return cur.rowcount == 1


def retry(cur: Cursor, run_id: str, now: float) -> bool:
    """A failed run is queued again, with a new epoch (a worker that still held it
    cannot write into the retried run), its end and its counts of recoveries and
    cancel requests cleared."""
    cur.execute(_RETRY.update(), (now, run_id))
    return cur.rowcount == 1


# -- the table walked -------------------------------------------------------------

# Every column some edge writes, and some no edge may touch: what a walk compares.
_WALKED = sorted(
    {c for e in RUN_EDGES.values() for c, _ in e.sets}
    | {"workflow", "input", "created_at", "parent", "queue", "priority", "version"}
)

_TAKE: dict[str, Callable[[Connection, Cursor, str, int, dict[str, Any]], object]] = {
    "claim": lambda conn, cur, rid, epoch, a: claim(cur, rid, **a),
    "suspend": lambda conn, cur, rid, epoch, a: suspend(conn, cur, rid, epoch, **a),
    "refuse": lambda conn, cur, rid, epoch, a: refuse(conn, cur, rid, epoch, **a),
    "release": lambda conn, cur, rid, epoch, a: release(conn, cur, rid, epoch, **a),
    "wake": lambda conn, cur, rid, epoch, a: wake(conn, cur, rid, **a),
    "next_session": lambda conn, cur, rid, epoch, a: next_session(cur, rid, epoch, **a),
    "ask_cancel": lambda conn, cur, rid, epoch, a: ask_cancel(cur, rid, **a),
    "finish": lambda conn, cur, rid, epoch, a: finish(conn, cur, rid, epoch, **a),
    "dead_letter": lambda conn, cur, rid, epoch, a: dead_letter(conn, cur, rid, **a),
    "cancel": lambda conn, cur, rid, epoch, a: cancel(conn, cur, rid, **a),
    "cancel_at_birth": lambda conn, cur, rid, epoch, a: cancel_at_birth(cur, rid, **a),
    "retry": lambda conn, cur, rid, epoch, a: retry(cur, rid, **a),
}


def take_edge(
    store: Connection, edge: str, run_id: str, *, epoch: int | None = None, **args: Any
) -> tuple[bool, dict[str, Any], dict[str, Any]]:
    """Take one edge of :data:`RUN_EDGES` for ``run_id`` in a transaction of its own, with
    ``args`` (its function's keywords; ``epoch``: the one a holder's edge is fenced
    by, default the run's). For the conformance suite, which walks the table on
    every store. Returns whether it applied, and the run's row before and after:
    every column an edge writes, and the numbers of its queued events and signals."""

    def row(cur: Cursor) -> dict[str, Any]:
        cur.execute(f"SELECT {', '.join(_WALKED)} FROM ms_runs WHERE id = ?", (run_id,))
        found = dict(zip(_WALKED, cur.fetchone(), strict=True))
        for table in ("ms_outbox", "ms_signals"):
            cur.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", (run_id,))
            found[table] = int(cur.fetchone()[0])
        return found

    with store._write() as cur:
        before = row(cur)
        held = before["epoch"] if epoch is None else epoch
        applied = _TAKE[edge](store, cur, run_id, held, args)
        return applied not in (False, None), before, row(cur)


# -- the end of a run --------------------------------------------------------------


def _ended(
    conn: Connection,
    cur: Cursor,
    sql: str,
    params: tuple[Any, ...],
    run_id: str,
    now: float,
    *,
    tell_parent: bool = True,
    close: bool = True,
) -> bool:
    """Write an end (``sql``, an ending edge's statement) and, if it applied, what
    every end does, in its transaction: queue the run's event, tell its parent
    (``tell_parent``; the forks holding its start always) and cancel the children
    its end reaches (``close``; a cancel cascaded to them before)."""
    cur.execute(sql + " RETURNING status, output, error, parent, parent_step, parent_kind", params)
    row = cur.fetchone()
    if row is None:
        return False
    status, output, error, parent, step, kind = row
    event: dict[str, Any] = {"status": status}
    if output is not None:
        event["output"] = loads(output)
    if error is not None:
        event["error"] = loads(error)
    queue_event(cur, run_id, f"run.{status}", event, now)  # type: ignore[arg-type]
    if kind == "child" and parent is not None:
        payload = end_payload(run_id, (status, output, error))
        if tell_parent:
            _tell(conn, cur, parent, run_id, payload, now)
        for fork, _ in forks_holding(cur, parent, step, run_id):
            _tell(conn, cur, fork, run_id, payload, now)
    if close:
        close_children(conn, cur, run_id, status, now)
    return True


def _tell(conn: Connection, cur: Cursor, holder: str, child: str, payload: str, now: float) -> None:
    """Store a child's end for ``holder`` (its parent, or a fork holding its start)
    and wake it if it waits for it; a finished or missing holder is left alone."""
    # Locked: a suspend of the holder committing now either sees this signal or is
    # seen waiting by it (as ``send_signal``).
    cur.execute(f"SELECT status, wait_signal FROM ms_runs WHERE id = ?{conn._row_lock}", (holder,))
    found = cur.fetchone()
    if found is None or found[0] in FINISHED:
        return
    name = child_signal(child)
    cur.execute(
        "INSERT INTO ms_signals (run_id, name, payload, created_at) VALUES (?, ?, ?, ?)",
        (holder, name, payload, now),
    )
    if found[0] == "waiting" and name in split_wait_signals(found[1]):
        wake(conn, cur, holder, now)


def close_children(conn: Connection, cur: Cursor, run_id: str, status: str, now: float) -> None:
    """``run_id`` has just ended with ``status`` (in this transaction): cancel its
    unfinished children started with ``on_parent_close="cancel"``, as a cancel of
    it does (their own children too). One indexed lookup when it has none."""
    error = dumps({"type": "Cancelled", "message": f"its parent run {run_id!r} {status}"})
    cancel_children(conn, cur, run_id, error, now, on_close=True)


def cancel_children(
    conn: Connection,
    cur: Cursor,
    run_id: str,
    error: str,
    now: float,
    *,
    on_close: bool = False,
    wait: bool = True,
) -> list[tuple[str, str]]:
    """Cancel the unfinished child runs of ``run_id`` that a cancel of it reaches
    (``on_close``: that its end reaches), their children first (recursively): a
    running one is asked to cancel (its worker does at its next step), any other is
    cancelled at once. Children already asked to cancel are left to their own
    cascade. Returns ``(child id, status before)``.

    A child's row is locked before its parent's, the order a child's own end takes
    (its row, then its parent's, then the forks' holding its start; a child
    cancelled here tells those forks as at any end): the caller locks ``run_id``
    after. Siblings go in descending id order, each after its own children, the
    order ``lock_closed_children`` and ``lock_children`` take, so that no two of
    them wait for each other's rows in a cycle. A caller that holds ``run_id``
    already passes ``wait=False``: a child's row held by another transaction (which
    may be that child's end, waiting for the parent) is not waited for (``SKIP
    LOCKED``) but raises :class:`ChildLocked`, since waiting there closes a
    deadlock on PostgreSQL."""
    cur.execute(
        f"SELECT id FROM ms_runs WHERE parent = ? AND {ON_CLOSE if on_close else ON_CANCEL}"
        # Descending: the order of lock_closed_children's statement.
        f" AND {UNFINISHED} ORDER BY id DESC",
        (run_id,),
    )
    done: list[tuple[str, str]] = []
    for (child,) in cur.fetchall():
        done += cancel_children(conn, cur, child, error, now, wait=wait)
        lock = conn._row_lock if wait else conn._lock_clause
        cur.execute(f"SELECT status FROM ms_runs WHERE id = ?{lock}", (child,))
        row = cur.fetchone()
        if row is None and not wait:
            # Skipped (an unfinished run is never pruned): held by another transaction.
            raise ChildLocked(child)
        if row is None or row[0] in FINISHED:
            continue
        if row[0] == "running":
            ask_cancel(cur, child, error, now)
        else:
            # The parent is being cancelled; a fork holding the child's start is not.
            cancel(conn, cur, child, error, now, by_parent=True)
        done.append((child, row[0]))
    return done
