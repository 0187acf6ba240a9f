"""Retention: deleting old finished runs, and never what a live run still needs.

:meth:`RetentionTables.prune` deletes finished runs (succeeded, failed, cancelled)
that finished before a cut-off, with their journals, signals, token streams and
settled webhook events. It never deletes an unfinished run, and it keeps a finished
run past the cut-off while an unfinished run still needs it (a :class:`KeptRun`
says which and why):

* ``ancestor``: it is the parent or fork source of an unfinished run, or of one of
  that run's ancestors (the live run's page shows where it comes from);
* ``descendant``: it descends from an unfinished run: a fork of it, or a child its
  current session started (the live run shows them; a child of an earlier session
  is no longer referenced, the hand-off carries what goes on), or a run below such
  a one;
* ``start_held``: it is a child whose start an unfinished fork of its parent holds
  (the fork's journal shows it);
* ``child_path``: it is a fork whose journal holds the start of an unfinished child:
  that child's end reaches the forks (and forks of forks) holding its start by
  walking from its parent through them (``_children.forks_holding``), so deleting a
  fork in the middle would leave those below it waiting for ever.

Everything else past the cut-off is deleted, oldest first, ``batch`` runs per short
transaction; on PostgreSQL the batch's rows are locked ``FOR UPDATE SKIP LOCKED``
(a row another transaction holds waits for a later prune), and what they need is
read after they are locked: a fork of a run, and a child of one, lock it first, so
none can appear under a run this prune is deleting. A kept run is kept only for as
long as the reason holds: a later prune deletes it once it does not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ._children import forks_holding, started_child
from ._connection import Connection, Cursor
from ._records import FINISHED

__all__ = ["KeepReason", "KeptRun", "PruneResult", "RetentionTables"]

KeepReason = Literal["ancestor", "descendant", "start_held", "child_path"]

_CHUNK = 500  # ids per statement: within every driver's parameter limit


@dataclass(frozen=True, slots=True, kw_only=True)
class KeptRun:
    """A finished run past the cut-off that :meth:`Store.prune` kept, and why.

    Attributes:
        run_id: the run kept.
        reason: ``ancestor`` (an unfinished run descends from it), ``descendant``
            (it descends from an unfinished run), ``start_held`` (an unfinished
            fork holds its start) or ``child_path`` (it holds the start of an
            unfinished child, whose end reaches forks through it).
        by: the unfinished run it is kept for (for ``child_path``, that child).
    """

    run_id: str
    reason: KeepReason
    by: str

    def describe(self) -> str:
        """The reason in words, naming the run it is kept for."""
        return {
            "ancestor": f"unfinished run {self.by} descends from it",
            "descendant": f"it descends from unfinished run {self.by}",
            "start_held": f"unfinished fork {self.by} holds its start",
            "child_path": f"it holds the start of unfinished child {self.by}, whose end "
            "reaches the forks below it through it",
        }[self.reason]

    def summary(self) -> dict[str, str]:
        """JSON-ready: run id, reason, by and the description."""
        return {
            "run_id": self.run_id,
            "reason": self.reason,
            "by": self.by,
            "why": self.describe(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneResult:
    """What :meth:`Store.prune` deleted (or, on a dry run, would delete), and the
    finished runs past the cut-off it kept (:class:`KeptRun`)."""

    runs: int
    steps: int
    signals: int
    kept: tuple[KeptRun, ...] = ()


@dataclass(frozen=True, slots=True)
class _Node:
    id: str
    parent: str | None
    kind: str | None  # parent_kind
    step: str | None  # parent_step
    status: str
    session: int

    @property
    def live(self) -> bool:
        return self.status not in FINISHED

    def counts_under(self, parent: _Node) -> bool:
        """Whether ``parent`` still references this run: a fork always, a child if
        the parent's current (or last) session started it."""
        if self.kind != "child":
            return True
        return (self.step or "").split(":", 1)[0] == str(parent.session)


_NODE = "id, parent, parent_kind, parent_step, status, session"


def _node(row: Any) -> _Node:
    return _Node(row[0], row[1], row[2], row[3], row[4], int(row[5]))


def _chunks(ids: Iterable[str]) -> Iterable[list[str]]:
    listed = sorted(set(ids))
    for i in range(0, len(listed), _CHUNK):
        yield listed[i : i + _CHUNK]


def _marks(chunk: list[str]) -> str:
    return ", ".join("?" * len(chunk))


class RetentionTables(Connection):
    """Pruning: a method of every :class:`~mainspring.storage.Store`."""

    def prune(
        self, older_than_s: float, now: float, *, batch: int = 500, dry_run: bool = False
    ) -> PruneResult:
        """Delete finished runs whose ``finished_at`` is before ``now - older_than_s``,
        with their journals and signals, except those an unfinished run still needs
        (see the module: returned as ``kept``). Unfinished runs are never touched.

        Deletes ``batch`` runs per transaction, so that no lock is held for long while
        workers keep committing. ``dry_run`` deletes nothing and says what would go.
        """
        if batch <= 0:
            raise ValueError(f"batch must be > 0, got {batch!r}")
        cutoff = now - older_than_s
        runs = steps = signals = 0
        kept: list[KeptRun] = []
        after: tuple[float, str] | None = None  # the last run looked at, in order
        while True:
            with self._read() if dry_run else self._write() as cur:
                page = ""
                params: list[Any] = [cutoff]
                if after is not None:
                    page = " AND (finished_at > ? OR (finished_at = ? AND id > ?))"
                    params += [after[0], after[0], after[1]]
                # Rows another transaction holds are skipped on PostgreSQL: a later
                # prune takes them.
                cur.execute(
                    f"SELECT {_NODE}, finished_at FROM ms_runs WHERE status IN"
                    f" ('succeeded', 'failed', 'cancelled') AND finished_at < ?{page}"
                    f" ORDER BY finished_at, id LIMIT ?{'' if dry_run else self._lock_clause}",
                    [*params, batch],
                )
                rows = cur.fetchall()
                if not rows:
                    break
                after = (float(rows[-1][6]), rows[-1][0])
                found = [_node(r) for r in rows]
                keep = self._needed(cur, found)
                kept += keep.values()
                gone = [n.id for n in found if n.id not in keep]
                n_runs, n_steps, n_signals = (
                    self._count(cur, gone) if dry_run else self._delete(cur, gone)
                )
                runs, steps, signals = runs + n_runs, steps + n_steps, signals + n_signals
            if len(rows) < batch:
                break
        return PruneResult(runs=runs, steps=steps, signals=signals, kept=tuple(kept))

    def _delete(self, cur: Cursor, ids: list[str]) -> tuple[int, int, int]:
        runs = steps = signals = 0
        for chunk in _chunks(ids):
            marks = _marks(chunk)
            cur.execute(f"DELETE FROM ms_steps WHERE run_id IN ({marks})", chunk)
            steps += cur.rowcount
            cur.execute(f"DELETE FROM ms_signals WHERE run_id IN ({marks})", chunk)
            signals += cur.rowcount
            cur.execute(f"DELETE FROM ms_stream_chunks WHERE run_id IN ({marks})", chunk)
            cur.execute(f"DELETE FROM ms_stream_heads WHERE run_id IN ({marks})", chunk)
            # A graph run's checkpoints are kept under its id as the thread.
            for table in ("ms_checkpoints", "ms_checkpoint_blobs", "ms_checkpoint_writes"):
                cur.execute(f"DELETE FROM {table} WHERE thread_id IN ({marks})", chunk)
            # Delivered or given-up webhook events of those runs go with them.
            cur.execute(
                f"DELETE FROM ms_outbox WHERE run_id IN ({marks})"
                " AND (delivered_at IS NOT NULL OR next_at IS NULL)",
                chunk,
            )
            cur.execute(f"DELETE FROM ms_runs WHERE id IN ({marks})", chunk)
            runs += cur.rowcount
        return runs, steps, signals

    def _count(self, cur: Cursor, ids: list[str]) -> tuple[int, int, int]:
        steps = signals = 0
        for chunk in _chunks(ids):
            marks = _marks(chunk)
            cur.execute(f"SELECT COUNT(*) FROM ms_steps WHERE run_id IN ({marks})", chunk)
            steps += int(cur.fetchone()[0])
            cur.execute(f"SELECT COUNT(*) FROM ms_signals WHERE run_id IN ({marks})", chunk)
            signals += int(cur.fetchone()[0])
        return len(ids), steps, signals

    # -- what an unfinished run still needs ------------------------------------------

    def _needed(self, cur: Cursor, found: list[_Node]) -> dict[str, KeptRun]:
        """The runs of ``found`` (finished, past the cut-off) to keep, with why."""
        keep: dict[str, KeptRun] = {}

        def mark(run_id: str, reason: KeepReason, by: str) -> None:
            keep.setdefault(run_id, KeptRun(run_id=run_id, reason=reason, by=by))

        self._live_below(cur, found, mark)
        self._live_above(cur, [n for n in found if n.id not in keep], mark)
        for n in found:
            if n.id not in keep and n.kind == "child" and n.parent is not None:
                for fork in forks_holding(cur, n.parent, n.step, n.id):
                    if fork[1] not in FINISHED:
                        mark(n.id, "start_held", fork[0])
                        break
        forks = [n.id for n in found if n.id not in keep and n.kind == "fork"]
        for run_id, child in self._unfinished_starts(cur, forks):
            mark(run_id, "child_path", child)
        return keep

    def _live_below(self, cur: Cursor, found: list[_Node], mark: Any) -> None:
        """Mark the runs of ``found`` an unfinished run descends from (``ancestor``),
        level by level down the tree, nearest first."""
        roots: dict[str, set[str]] = {n.id: {n.id} for n in found}  # node -> roots above
        while roots:
            below: dict[str, set[str]] = {}
            for chunk in _chunks(roots):
                cur.execute(f"SELECT {_NODE} FROM ms_runs WHERE parent IN ({_marks(chunk)})", chunk)
                for row in cur.fetchall():
                    node = _node(row)
                    assert node.parent is not None
                    for root in roots[node.parent]:
                        if node.live:
                            mark(root, "ancestor", node.id)
                        below.setdefault(node.id, set()).add(root)
            roots = below

    def _live_above(self, cur: Cursor, found: list[_Node], mark: Any) -> None:
        """Mark the runs of ``found`` that descend from an unfinished run
        (``descendant``): up the tree through the links the parent still references
        (:meth:`_Node.counts_under`), nearest first."""
        climbing: dict[str, tuple[_Node, set[str]]] = {n.id: (n, {n.id}) for n in found}
        while climbing:
            wanted = {n.parent for n, _ in climbing.values() if n.parent is not None}
            parents: dict[str, _Node] = {}
            for chunk in _chunks(p for p in wanted if p is not None):
                cur.execute(f"SELECT {_NODE} FROM ms_runs WHERE id IN ({_marks(chunk)})", chunk)
                parents.update((r[0], _node(r)) for r in cur.fetchall())
            up: dict[str, tuple[_Node, set[str]]] = {}
            for node, roots in climbing.values():
                parent = parents.get(node.parent or "")
                if parent is None or not node.counts_under(parent):
                    continue
                if parent.live:
                    for root in roots:
                        mark(root, "descendant", parent.id)
                else:
                    up.setdefault(parent.id, (parent, set()))[1].update(roots)
            climbing = up

    def _unfinished_starts(self, cur: Cursor, forks: list[str]) -> list[tuple[str, str]]:
        """``(fork, child)`` for each fork of ``forks`` whose journal holds the start
        of a child run that has not finished."""
        starts: list[tuple[str, str]] = []
        for chunk in _chunks(forks):
            cur.execute(
                f"SELECT run_id, role, output FROM ms_steps WHERE run_id IN ({_marks(chunk)})"
                " AND role = 'child' AND status = 'completed' ORDER BY run_id, session, seq",
                chunk,
            )
            for run_id, role, output in cur.fetchall():
                child = started_child(role, output)
                if child is not None:
                    starts.append((run_id, child))
        live: set[str] = set()
        for chunk in _chunks(c for _, c in starts):
            cur.execute(
                f"SELECT id FROM ms_runs WHERE id IN ({_marks(chunk)}) AND status NOT IN"
                " ('succeeded', 'failed', 'cancelled')",
                chunk,
            )
            live.update(r[0] for r in cur.fetchall())
        return [(fork, child) for fork, child in starts if child in live]
