"""Child runs in the store: a parent learns of its child's end in the transaction
that ends the child, and a cancel reaches a run's unfinished children.

A child run (``parent_kind = 'child'``) tells its parent it ended with a signal named
:func:`child_signal` whose payload is the child's status, output and error, inserted in
the very transaction that writes that end (a finish, a cancel, a dead-letter). A
signal is stored before or after the wait that consumes it, so the parent wakes
whether it waits already or only later; and what it reads is what the child's row
holds, never lost between two transactions.
"""

from __future__ import annotations

from .._serde import dumps, loads
from ._api import queue_event
from ._connection import Connection, Cursor
from ._records import FINISHED, WAKE_NOW, split_wait_signals

__all__ = [
    "CHILD_SIGNAL_PREFIX",
    "ChildLocked",
    "cancel_children",
    "child_signal",
    "lock_parents",
    "tell_parent",
]

CHILD_SIGNAL_PREFIX = "child:"


def child_signal(child_id: str) -> str:
    """The signal a child run's end is stored as, for its parent."""
    return CHILD_SIGNAL_PREFIX + child_id


def tell_parent(conn: Connection, cur: Cursor, run_id: str, now: float) -> None:
    """If ``run_id`` is a child run that has just ended (in this transaction), store
    its end as a signal for its parent and wake the parent if it waits for it."""
    cur.execute(
        "SELECT parent, status, output, error FROM ms_runs WHERE id = ? AND parent_kind = 'child'",
        (run_id,),
    )
    row = cur.fetchone()
    if row is None or row[0] is None or row[1] not in FINISHED:
        return
    parent, status, output, error = row
    # Locked: a suspend of the parent committing now either sees this signal or is
    # seen waiting by it (as ``send_signal``).
    cur.execute(f"SELECT status, wait_signal FROM ms_runs WHERE id = ?{conn._row_lock}", (parent,))
    found = cur.fetchone()
    if found is None or found[0] in FINISHED:
        return
    name = child_signal(run_id)
    head = dumps({"run_id": run_id, "status": status})
    payload = f'{head[:-1]},"output":{output or "null"},"error":{error or "null"}}}'
    cur.execute(
        "INSERT INTO ms_signals (run_id, name, payload, created_at) VALUES (?, ?, ?, ?)",
        (parent, name, payload, now),
    )
    if found[0] == "waiting" and name in split_wait_signals(found[1]):
        cur.execute(
            "UPDATE ms_runs SET wake_at = ?, updated_at = ? WHERE id = ?", (WAKE_NOW, now, parent)
        )
        conn._notify(cur, parent)


class ChildLocked(Exception):
    """A child :func:`cancel_children` was told not to wait for is locked by another
    transaction: the caller rolls back (letting go of the parent) and starts again."""


def lock_parents(conn: Connection, cur: Cursor, run_ids: list[str]) -> set[str]:
    """Lock the parents of those of ``run_ids`` that are child runs, without waiting
    for a row another transaction holds (``SKIP LOCKED``); returns the children whose
    parent was held elsewhere.

    For a transaction that holds several runs' rows before it ends some of them (a
    batch commit, a claim that dead-letters): :func:`tell_parent` waiting there for a
    parent could close a cycle with another such transaction that holds that parent
    and waits for a parent this one holds (a deadlock on PostgreSQL). With the
    parents locked here first, it does not wait; a child whose parent was held is
    left for later (busy). A transaction that holds one run's row may wait for its
    parent: such waits only go up the tree."""
    if not conn._lock_clause:  # no row locks (SQLite: one writer at a time)
        return set()
    parents: dict[str, str] = {}
    for i in range(0, len(run_ids), 500):  # within every driver's parameter limit
        chunk = run_ids[i : i + 500]
        # Joined: a parent that is gone (pruned) has nothing to lock.
        cur.execute(
            "SELECT c.id, c.parent FROM ms_runs c JOIN ms_runs p ON p.id = c.parent"
            f" WHERE c.id IN ({', '.join('?' * len(chunk))}) AND c.parent_kind = 'child'",
            chunk,
        )
        parents.update({child: parent for child, parent in cur.fetchall()})
    wanted = sorted(set(parents.values()))
    got: set[str] = set()
    for i in range(0, len(wanted), 500):
        chunk = wanted[i : i + 500]
        cur.execute(
            f"SELECT id FROM ms_runs WHERE id IN ({', '.join('?' * len(chunk))})"
            f" ORDER BY id{conn._lock_clause}",
            chunk,
        )
        got.update(r[0] for r in cur.fetchall())
    return {child for child, parent in parents.items() if parent not in got}


def cancel_children(
    conn: Connection, cur: Cursor, run_id: str, error: str, now: float, *, wait: bool = True
) -> list[tuple[str, str]]:
    """Cancel the unfinished child runs of ``run_id``, their children first
    (recursively): a running one is asked to cancel (its worker does at its next
    step), any other is cancelled at once. Children already asked to cancel are left
    to their own cascade. Returns ``(child id, status before)``.

    A child's row is locked before its parent's, the order a child's own end takes
    (its row, then its parent's, in :func:`tell_parent`): the caller locks
    ``run_id`` after. A caller that holds ``run_id`` already passes ``wait=False``:
    a child's row held by another transaction (which may be that child's end,
    waiting for the parent) is not waited for (``SKIP LOCKED``) but raises
    :class:`ChildLocked`, since waiting there closes a deadlock on PostgreSQL."""
    cur.execute(
        "SELECT id FROM ms_runs WHERE parent = ? AND parent_kind = 'child'"
        " AND status NOT IN ('succeeded', 'failed', 'cancelled') AND cancel_requested = 0"
        " ORDER BY id",
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
            cur.execute(
                "UPDATE ms_runs SET cancel_requested = 1, error = ?, updated_at = ?"
                " WHERE id = ? AND status = 'running'",
                (error, now, child),
            )
        else:
            cur.execute(
                "UPDATE ms_runs SET status = 'cancelled', epoch = epoch + 1,"
                " cancel_requested = 1, error = ?, finished_at = ?, updated_at = ?,"
                " owner = NULL, lease_until = NULL, wake_at = NULL, wait_signal = NULL,"
                " wait_reason = NULL WHERE id = ? AND status = ?",
                (error, now, now, child, row[0]),
            )
            event = {"status": "cancelled", "error": loads(error)}
            queue_event(cur, child, "run.cancelled", event, now)
        done.append((child, row[0]))
    return done
