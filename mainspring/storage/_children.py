"""Child runs in the store: what the end of a run (``_transitions.py``, the one
place a run ends) needs to tell a parent of its child's end and to reach the
unfinished children of a run that ends or is cancelled: the signal's name and
payload, the forks holding a start, the reach of a cascade and the row locks
taken before it.

A child run (``parent_kind = 'child'``) tells its parent it ended with a signal named
:func:`child_signal` whose payload is the child's status, output and error, inserted in
the very transaction that writes that end (a finish, a cancel, a dead-letter). A
signal is stored before or after the wait that consumes it, so the parent wakes
whether it waits already or only later; and what it reads is what the child's row
holds, never lost between two transactions.

A run's end (a finish, a cancel, a dead-letter) cancels, in the same transaction, its
unfinished children started with ``on_parent_close="cancel"`` (the default), through
the cascade a cancel of the run takes; ``"abandon"`` children run on. A child started
before the policy existed (``parent_close`` NULL) keeps what it was started under: a
cancel of its parent cascades to it, its parent's normal end leaves it running.

A fork of the parent made past the child's start holds that start too (its journal
row, role ``child``, output ``{"run_id": ...}``), and is told the same end: by the
fork itself when the child had ended already (:func:`share_child_ends`, in the
fork's transaction), else by the child when it ends, which looks for the forks (and
forks of those forks) holding its start. Either the fork's transaction sees the
child ended or the child's end sees the fork: the fork locks the child's row first
(:func:`lock_children`), the row a child's end writes first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._serde import dumps, loads
from ._connection import Connection, Cursor
from ._records import FINISHED, StepRecord

__all__ = [
    "CHILD_SIGNAL_PREFIX",
    "ON_CANCEL",
    "ON_CLOSE",
    "UNFINISHED",
    "ChildLocked",
    "child_signal",
    "child_starts",
    "end_payload",
    "forks_holding",
    "lock_children",
    "lock_closed_children",
    "lock_parents",
    "retell_parent",
    "share_child_ends",
    "started_child",
    "told_rows_sql",
]

# A child's end as its row holds it: (status, output, error).
ChildEnd = tuple[str, str | None, str | None]

CHILD_SIGNAL_PREFIX = "child:"

# The children a cancel of their parent reaches, and those its end reaches.
ON_CANCEL = "(parent_close IS NULL OR parent_close = 'cancel')"
ON_CLOSE = "parent_close = 'cancel'"
UNFINISHED = (
    "parent_kind = 'child' AND status NOT IN ('succeeded', 'failed', 'cancelled')"
    " AND cancel_requested = 0"
)


def child_signal(child_id: str) -> str:
    """The signal a child run's end is stored as, for its parent."""
    return CHILD_SIGNAL_PREFIX + child_id


def child_starts(rows: Iterable[StepRecord]) -> dict[str, StepRecord]:
    """The child runs whose starts are among these journal rows, by id."""
    found: dict[str, StepRecord] = {}
    for r in rows:
        child = started_child(r.role, r.output) if r.status == "completed" else None
        if child is not None:
            found[child] = r
    return found


def lock_children(
    conn: Connection, cur: Cursor, child_ids: Iterable[str], *, wait: bool = True
) -> dict[str, ChildEnd]:
    """Lock the rows of these child runs (before any parent's row: the order a
    child's end takes; in descending id order, as ``_transitions.cancel_children`` does)
    and read where each is: ``{id: (status, output, error)}`` of those that exist.
    ``wait=False``, for a caller that holds their parent already: a row another
    transaction holds raises :class:`ChildLocked` rather than being waited for
    (see ``_transitions.cancel_children``)."""
    lock = conn._row_lock if wait else conn._lock_clause
    found: dict[str, ChildEnd] = {}
    for child in sorted(set(child_ids), reverse=True):
        cur.execute(
            "SELECT status, output, error FROM ms_runs WHERE id = ? AND parent_kind = 'child'"
            f"{lock}",
            (child,),
        )
        row = cur.fetchone()
        if row is not None:
            found[child] = (row[0], row[1], row[2])
        elif not wait:
            cur.execute("SELECT 1 FROM ms_runs WHERE id = ?", (child,))
            if cur.fetchone() is not None:  # skipped, not gone (pruned)
                raise ChildLocked(child)
    return found


def share_child_ends(
    cur: Cursor, fork_id: str, rows: Sequence[StepRecord], ends: dict[str, ChildEnd], now: float
) -> None:
    """Store, for a new fork whose journal is ``rows``, the end of each child whose
    start it copied and which has ended already (``ends``, read under
    :func:`lock_children`), unless the copy holds the wait that took it. A child
    still running tells the fork itself when it ends (``_transitions._ended``)."""
    taken = {r.name for r in rows if r.kind == "signal" and r.status == "completed"}
    for child in child_starts(rows):
        end = ends.get(child)
        if end is None or end[0] not in FINISHED or child_signal(child) in taken:
            continue
        cur.execute(
            "INSERT INTO ms_signals (run_id, name, payload, created_at) VALUES (?, ?, ?, ?)",
            (fork_id, child_signal(child), end_payload(child, end), now),
        )


def end_payload(child: str, end: ChildEnd) -> str:
    """The signal's payload: the child's status, output and error as its row holds them."""
    status, output, error = end
    head = dumps({"run_id": child, "status": status})
    return f'{head[:-1]},"output":{output or "null"},"error":{error or "null"}}}'


def forks_holding(cur: Cursor, parent: str, step: str | None, child: str) -> list[tuple[str, str]]:
    """``(id, status)`` of the forks of ``parent``, and forks of those, whose journals
    hold the start of ``child`` at ``step`` (``"session:seq"``), parents before their
    forks. A fork that does not hold it has no fork that does (a fork copies its
    source's rows); one that does is reached only through its source's row, which is
    why :meth:`~mainspring.storage.Store.prune` keeps such a fork while the child has
    not ended."""
    try:
        session, seq = (int(x) for x in (step or "").split(":"))
    except ValueError:
        return []
    found: list[tuple[str, str]] = []
    todo = [parent]
    while todo:
        cur.execute(
            "SELECT id, status FROM ms_runs WHERE parent = ? AND parent_kind = 'fork' ORDER BY id",
            (todo.pop(0),),
        )
        for fork, status in cur.fetchall():
            cur.execute(
                "SELECT role, output FROM ms_steps WHERE run_id = ? AND session = ? AND seq = ?"
                " AND status = 'completed'",
                (fork, session, seq),
            )
            row = cur.fetchone()
            if row is not None and started_child(row[0], row[1]) == child:
                found.append((fork, status))
                todo.append(fork)
    return found


def started_child(role: str | None, output: str | None) -> str | None:
    """The child run a journal row started (a ``child`` row's output), if any."""
    if role != "child" or output is None:
        return None
    try:
        value = loads(output)
    except ValueError:
        return None
    child = value.get("run_id") if isinstance(value, dict) else None
    return child if isinstance(child, str) else None


def retell_parent(cur: Cursor, run_id: str, now: float) -> None:
    """``run_id`` is open again (a retry, in this transaction): store the end of each
    child that ended while it was finished (its end, cancelled by the parent's failure
    or on its own, found no parent to tell), so that a wait for it wakes: its own
    children, and, for a fork, the children whose starts its journal holds (their
    ends tell only unfinished forks)."""
    cur.execute(
        "SELECT id, status, output, error FROM ms_runs c WHERE parent = ?"
        " AND parent_kind = 'child' AND status IN ('succeeded', 'failed', 'cancelled')"
        " AND NOT EXISTS (SELECT 1 FROM ms_signals s WHERE s.run_id = ? AND s.name = ? || c.id)"
        " ORDER BY id",
        (run_id, run_id, CHILD_SIGNAL_PREFIX),
    )
    ends: dict[str, ChildEnd] = {r[0]: (r[1], r[2], r[3]) for r in cur.fetchall()}
    cur.execute(
        "SELECT s.kind, s.role, s.name, s.output FROM ms_steps s JOIN ms_runs r ON r.id = s.run_id"
        " WHERE s.run_id = ? AND s.session = r.session AND s.status = 'completed'"
        " AND (s.role = 'child' OR s.kind = 'signal') ORDER BY s.seq",
        (run_id,),
    )
    rows = cur.fetchall()
    taken = {name for kind, _, name, _ in rows if kind == "signal"}
    held = {c for kind, role, _, out in rows if kind == "step" and (c := started_child(role, out))}
    for child in sorted(held - ends.keys()):
        if child_signal(child) in taken:
            continue  # the journal holds the wait that took its end (a fork's copy)
        cur.execute(
            "SELECT status, output, error FROM ms_runs WHERE id = ? AND status IN"
            " ('succeeded', 'failed', 'cancelled') AND NOT EXISTS (SELECT 1 FROM ms_signals"
            " WHERE run_id = ? AND name = ?)",
            (child, run_id, child_signal(child)),
        )
        row = cur.fetchone()
        if row is not None:
            ends[child] = (row[0], row[1], row[2])
    for child, end in sorted(ends.items()):
        cur.execute(
            "INSERT INTO ms_signals (run_id, name, payload, created_at) VALUES (?, ?, ?, ?)",
            (run_id, child_signal(child), end_payload(child, end), now),
        )


def lock_closed_children(conn: Connection, cur: Cursor, run_ids: list[str]) -> None:
    """Lock the rows ``_transitions.close_children`` will write for the ends of ``run_ids``,
    before the caller locks those runs: the order a child's own end takes (its row,
    then its parent's), so that a parent ending as its child ends never deadlocks.
    In the order ``_transitions.cancel_children`` locks them (a child's children before it,
    siblings in descending id order: the path from the root, descending), so that
    a parent's end and its cancel, or a cancel of an ancestor, never wait for each
    other in a cycle either. One statement, nothing to read back; nothing to do
    where a writer holds the whole database (SQLite)."""
    if not conn._row_lock or not run_ids:
        return
    # The tree close_children walks: the children its end reaches, then theirs that
    # their cancel reaches (the tree has only id and path: the rest is the run's).
    # A path sorts after the paths that extend it, so descending puts a child's
    # subtree before it; PostgreSQL SQL, as is the row lock (SQLite returned above).
    cur.execute(
        "WITH RECURSIVE tree (id, path) AS ("
        " SELECT id, ARRAY[parent, id] FROM ms_runs"
        f" WHERE parent IN ({', '.join('?' * len(run_ids))}) AND {ON_CLOSE} AND {UNFINISHED}"
        " UNION ALL SELECT r.id, t.path || r.id FROM ms_runs r JOIN tree t ON r.parent = t.id"
        f" WHERE {ON_CANCEL} AND {UNFINISHED})"
        " SELECT r.id FROM ms_runs r JOIN tree t ON r.id = t.id ORDER BY t.path DESC"
        f"{conn._row_lock} OF r",
        run_ids,
    )


class ChildLocked(Exception):
    """A child ``_transitions.cancel_children`` (or :func:`lock_children`) was told not to
    wait for is locked by another transaction: the caller rolls back (letting go of
    the parent) and starts again."""


def told_rows_sql(ids: str) -> str:
    """The ``WITH RECURSIVE`` clauses of a query (the caller's select follows) that
    name ``told (root, id)``: for each ending run ``root`` among the runs that
    ``ids`` selects (a condition on ``ms_runs``' ``id``), the rows its end writes
    besides its own: the children its end cancels (with theirs), the parent it
    tells if it is a child, and the forks that may hold a start those ends tell
    (every fork, and fork of a fork, of those parents: a few more than the end of
    a run, ``_transitions._ended``, finds, which only costs a busy answer). A row
    may be gone (a pruned parent): join ``ms_runs``."""
    return (
        "WITH RECURSIVE tree (root, id) AS ("
        f" SELECT id, id FROM ms_runs WHERE {ids}"
        " UNION ALL SELECT t.root, r.id FROM tree t JOIN ms_runs r ON r.parent = t.id"
        f" WHERE {ON_CANCEL} AND {UNFINISHED}),"
        " told (root, id) AS (SELECT root, id FROM tree WHERE id <> root"
        " UNION ALL SELECT t.root, r.parent FROM tree t JOIN ms_runs r ON r.id = t.id"
        " WHERE r.parent_kind = 'child' AND r.parent IS NOT NULL"
        " UNION ALL SELECT h.root, f.id FROM told h JOIN ms_runs f ON f.parent = h.id"
        " AND f.parent_kind = 'fork')"
    )


def lock_parents(conn: Connection, cur: Cursor, run_ids: list[str]) -> set[str]:
    """Lock the rows the ends of ``run_ids`` write besides their own (their parents
    and the forks those tell, the children their end cancels: :func:`told_rows_sql`),
    without waiting for a row another transaction holds (``SKIP LOCKED``); returns
    the runs of ``run_ids`` one of whose rows was held elsewhere.

    For a transaction that holds several runs' rows before it ends some of them (a
    batch commit, a claim that dead-letters): the end of a run telling its parent
    (``_transitions._ended``) or cancelling its children (the cascade of
    ``_transitions.close_children``) waiting there for a row could close a cycle
    with another such transaction that holds that row and waits for one this one holds (a
    deadlock on PostgreSQL). With those rows locked here first, it does not wait; a
    run one of whose rows was held is left for later (busy). A transaction that
    holds one run's row may wait for its parent (and the parent's forks after it):
    such waits only go up the tree, then across to the forks, never back down."""
    if not conn._lock_clause:  # no row locks (SQLite: one writer at a time)
        return set()
    told: dict[str, set[str]] = {}
    for i in range(0, len(run_ids), 500):  # within every driver's parameter limit
        chunk = run_ids[i : i + 500]
        cur.execute(
            told_rows_sql(f"id IN ({', '.join('?' * len(chunk))})")
            # Joined: a row that is gone (a pruned parent) has nothing to lock.
            + " SELECT DISTINCT h.root, h.id FROM told h JOIN ms_runs x ON x.id = h.id",
            chunk,
        )
        for root, row in cur.fetchall():
            told.setdefault(row, set()).add(root)
    wanted = sorted(told)
    got: set[str] = set()
    for i in range(0, len(wanted), 500):
        chunk = wanted[i : i + 500]
        cur.execute(
            f"SELECT id FROM ms_runs WHERE id IN ({', '.join('?' * len(chunk))})"
            f" ORDER BY id{conn._lock_clause}",
            chunk,
        )
        got.update(r[0] for r in cur.fetchall())
    return {root for row, roots in told.items() if row not in got for root in roots}
