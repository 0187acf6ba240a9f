"""Ends of child runs racing what holds their parents, on PostgreSQL: no deadlock.

A child's end locks its own row, then its parent's (to tell it, in the same
transaction). Whatever holds a parent's row and then waits for another run's row
can close a cycle with it, which PostgreSQL ends by aborting one transaction as a
deadlock (``StoreUnavailable``). Three did, before they stopped waiting:

- a cancel of the parent, which locks the children it finds before the parent, but
  finds a child started while it came in only once it holds the parent; it now lets
  the parent go and starts again (about one race in fourteen deadlocked);
- two workers' group commits, each ending a child whose parent the other's batch
  holds; a batch now locks those parents with its runs, without waiting (about two
  races in three deadlocked);
- a claim that holds the runs it takes and dead-letters a child whose parent a batch
  holds; it now leaves that child for a later claim (about one race in four).

A parent's end cancels its unfinished children (``on_parent_close="cancel"``), and a
child's end tells the forks of its parent that hold its start: the rounds below race
those too (a parent's end against its child's, each in a batch that ends the other
pair's; two batches each ending a child whose parent's fork the other holds).

A prune races a child's end too: it must keep a finished fork through which the
child's end reaches a fork of it, and neither may wait for the other in a cycle.

``test_a_cancel_holding_the_parent_never_waits_for_an_ending_child`` sets the first
interleaving up step by step (other transactions hold rows to order it); the race
loops leave it to the scheduler. The default suite runs short loops, ``-m slow``
long ones.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pg
import psycopg
import pytest

from mainspring import StoreUnavailable
from mainspring._serde import dumps
from mainspring.storage import RunTransition, RunWrite, StepRecord, Store, open_store

# How long a helper waits for the server to show the expected lock waits before it
# gives up. Not a duration under test: each wait shows within milliseconds.
GIVE_UP_S = 30.0


@pytest.fixture
def pg_url(pg_session_dsn: str) -> str:
    """An empty PostgreSQL database (skips without a server)."""
    pg.reset(pg_session_dsn)
    return pg_session_dsn


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    s = open_store(pg_url)
    yield s
    s.close()


def _run(store: Store, parent: str | None = None) -> str:
    run_id = uuid.uuid4().hex
    store.create_run(
        run_id=run_id, workflow="wf", input="null", key=None, now=time.time(), parent=parent
    )
    return run_id


def _claim(store: Store, run_id: str) -> int | None:
    """Take ``run_id`` as a worker does; its epoch, or None if it is not runnable."""
    runs = store.claim(
        worker="w",
        now=time.time(),
        lease_s=60.0,
        limit=1,
        workflows=None,
        max_recoveries=3,
        run_id=run_id,
    )
    return runs[0].epoch if runs else None


def _finish(store: Store, run_id: str, epoch: int) -> None:
    end = RunTransition(kind="finish", status="succeeded", output='"ok"')
    write = RunWrite(run_id=run_id, epoch=epoch, transition=end)
    [result] = store.commit([write], time.time())
    while result.busy:  # its row held for a moment (by the cancel): a worker sends it again
        [result] = store.commit([write], time.time())
    assert result.ok, result


def _lock(url: str, run_id: str) -> psycopg.Connection:
    """Another transaction holding ``run_id``'s row until it commits."""
    conn = psycopg.connect(url)
    conn.execute("SELECT 1 FROM ms_runs WHERE id = %s FOR UPDATE", (run_id,))
    return conn


def _until_waiting(monitor: psycopg.Connection, n: int) -> None:
    """Until ``n`` sessions of this database wait for a lock."""
    deadline = time.monotonic() + GIVE_UP_S
    while time.monotonic() < deadline:
        row = monitor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
        if row is not None and row[0] >= n:
            return
        time.sleep(0.005)
    raise AssertionError(f"{n} sessions never waited for a lock")


class _Thread(threading.Thread):
    """A thread that keeps what its target raised."""

    def __init__(self, target: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.call = target
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.call()
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_a_cancel_holding_the_parent_never_waits_for_an_ending_child(
    store: Store, pg_url: str
) -> None:
    parent = _run(store)
    assert _claim(store, parent) is not None
    older = _run(store, parent)
    with psycopg.connect(pg_url, autocommit=True) as monitor:
        # The cancel finds the older child only, and stops on its row.
        holds_older = _lock(pg_url, older)
        answers: list[str] = []
        cancel = _Thread(lambda: answers.append(store.cancel(parent, time.time(), "stop")))
        cancel.start()
        _until_waiting(monitor, 1)
        # Meanwhile a new child starts and its worker takes it.
        child = _run(store, parent)
        epoch = _claim(store, child)
        assert epoch is not None
        # The cancel goes on to the parent's row and stops there ...
        holds_parent = _lock(pg_url, parent)
        holds_older.commit()
        _until_waiting(monitor, 1)
        # ... and the child's end locks the child's row and stops at its parent's,
        # behind the cancel: the parent goes to the cancel first.
        end = _Thread(lambda: _finish(store, child, epoch))
        end.start()
        _until_waiting(monitor, 2)
        holds_parent.commit()
        cancel.join(GIVE_UP_S)
        end.join(GIVE_UP_S)
        holds_older.close()
        holds_parent.close()
    assert (cancel.error, end.error) == (None, None)
    assert answers == ["running"]
    run = store.get_run(parent)
    assert run is not None and run.status == "running" and run.cancel_requested
    assert _status(store, older) == "cancelled"
    assert _status(store, child) == "succeeded"
    # The child's end reached its parent, as it does when nothing races it.
    assert f"child:{child}" in {s.name for s in store.list_signals(parent)}


def _status(store: Store, run_id: str) -> str:
    run = store.get_run(run_id)
    assert run is not None
    return run.status


def _no_deadlocks(one_round: Callable[[], str | None], rounds: int) -> None:
    """Play ``rounds`` rounds of a race; none may meet a deadlock."""
    deadlocks = [d for d in (one_round() for _ in range(rounds)) if d is not None]
    assert deadlocks == [], f"{len(deadlocks)} of {rounds} rounds deadlocked: {deadlocks[0]}"


def _deadlock(threads: list[_Thread]) -> str | None:
    """Join ``threads``; the deadlock one met, if one did (anything else raises)."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(GIVE_UP_S)
    for t in threads:
        if isinstance(t.error, StoreUnavailable) and "deadlock" in str(t.error):
            return str(t.error)
        if t.error is not None:
            raise t.error
    return None


def _round(store: Store) -> str | None:
    """A running parent with an unfinished child; one thread starts a second child,
    takes it and ends it, while another cancels the parent. Returns the deadlock
    either met, if one did."""
    parent = _run(store)
    assert _claim(store, parent) is not None
    _run(store, parent)  # found by the cancel: it has a child to lock first
    start = threading.Barrier(2)
    children: list[str] = []

    def child_ends() -> None:
        start.wait()
        children.append(_run(store, parent))
        epoch = _claim(store, children[0])
        if epoch is not None:  # None: the cancel got to it while it was queued
            _finish(store, children[0], epoch)

    def cancel() -> None:
        start.wait()
        time.sleep(random.random() * 0.002)  # lands all around the child's short life
        assert store.cancel(parent, time.time(), "stop") == "running"

    threads = [_Thread(child_ends), _Thread(cancel)]
    met = _deadlock(threads)
    if met is not None:
        return met
    run = store.get_run(parent)
    assert run is not None and run.cancel_requested
    # Ended before the cancel reached it, or cancelled by it while queued.
    assert _status(store, children[0]) in ("succeeded", "cancelled")
    return None


def test_a_cancel_racing_a_new_child_end_never_deadlocks(store: Store) -> None:
    _no_deadlocks(lambda: _round(store), 25)


@pytest.mark.slow
def test_a_cancel_racing_a_new_child_end_never_deadlocks_many(store: Store) -> None:
    _no_deadlocks(lambda: _round(store), 400)


def test_the_race_ends_the_same_on_sqlite(tmp_path: Path) -> None:
    """SQLite's writers queue on one lock: the same rounds, the same outcomes."""
    s = open_store(f"sqlite:///{tmp_path / 'ms.db'}")
    try:
        _no_deadlocks(lambda: _round(s), 10)
        for _ in range(5):
            assert _batch_round(s) is None
            assert _dead_letter_round(s) is None
            assert _close_round(s, batched=False) is None
            assert _close_round(s, batched=True) is None
            assert _fork_round(s) is None
            assert _prune_round(s) is None
    finally:
        s.close()


# -- batches: two workers' group commits, each ending the other's parent's child -------


def _commit_until_done(store: Store, batch: list[RunWrite]) -> None:
    """Commit ``batch`` as a worker's group commit does: writes answered busy (a row
    held elsewhere for a moment) are sent again, after a moment."""
    while batch:
        results = store.commit(batch, time.time())
        assert all(r.ok or r.busy for r in results), results
        batch = [w for w, r in zip(batch, results, strict=True) if r.busy]
        time.sleep(random.random() * 0.002)


def _batch_round(store: Store) -> str | None:
    """Parents P1 and P2, each running with a child running; one batch ends P1's
    child and commits P2, the other ends P2's child and commits P1, at once."""
    end = RunTransition(kind="finish", status="succeeded", output='"ok"')
    parents = [_run(store), _run(store)]
    epochs = [_claim(store, p) for p in parents]
    children = [_run(store, p) for p in parents]
    child_epochs = [_claim(store, c) for c in children]
    batches = [
        [
            RunWrite(run_id=children[i], epoch=child_epochs[i] or 0, transition=end),
            RunWrite(run_id=parents[1 - i], epoch=epochs[1 - i] or 0),
        ]
        for i in (0, 1)
    ]
    start = threading.Barrier(2)

    def commit(batch: list[RunWrite]) -> Callable[[], None]:
        def go() -> None:
            start.wait()
            _commit_until_done(store, batch)

        return go

    threads = [_Thread(commit(b)) for b in batches]
    met = _deadlock(threads)
    if met is not None:
        return met
    for parent, child in zip(parents, children, strict=True):
        assert _status(store, child) == "succeeded"
        assert f"child:{child}" in {s.name for s in store.list_signals(parent)}
    return None


def test_batches_ending_each_others_parents_children_never_deadlock(store: Store) -> None:
    _no_deadlocks(lambda: _batch_round(store), 25)


@pytest.mark.slow
def test_batches_ending_each_others_parents_children_never_deadlock_many(store: Store) -> None:
    _no_deadlocks(lambda: _batch_round(store), 400)


# -- a claim that dead-letters a child, against a batch that holds its parent ----------


def _take(store: Store, run_id: str, *, at: float, max_recoveries: int = 1) -> int:
    """Claim ``run_id`` with a lease that ran out at ``at`` + 1 (a worker that died)."""
    runs = store.claim(
        worker="gone",
        now=at,
        lease_s=1.0,
        limit=1,
        workflows=None,
        max_recoveries=max_recoveries,
        run_id=run_id,
    )
    assert runs, run_id
    return runs[0].epoch


def _dead_letter_round(store: Store) -> str | None:
    """A claim takes P2 (its worker died) and dead-letters P1's child X (its workers
    kept dying), holding both rows, while a batch ends P2's child and commits P1."""
    past = time.time() - 100
    p1, p2 = _run(store), _run(store)
    e1 = _claim(store, p1)
    x, c2 = _run(store, p1), _run(store, p2)
    _take(store, x, at=past)
    _take(store, x, at=past + 10)  # recovered once: the next recovery dead-letters it
    _take(store, p2, at=past - 10)  # its lease ran out first: the claim takes it first
    e2 = _claim(store, c2)
    end = RunTransition(kind="finish", status="succeeded", output='"ok"')
    batch = [RunWrite(run_id=c2, epoch=e2 or 0, transition=end), RunWrite(run_id=p1, epoch=e1 or 0)]
    start = threading.Barrier(2)

    def claim() -> None:
        start.wait()
        store.claim(
            worker="w", now=time.time(), lease_s=60.0, limit=2, workflows=None, max_recoveries=1
        )

    def commit() -> None:
        start.wait()
        time.sleep(random.random() * 0.002)
        _commit_until_done(store, batch)

    threads = [_Thread(claim), _Thread(commit)]
    met = _deadlock(threads)
    if met is not None:
        return met
    # A claim that found X's parent held left X for the next one.
    store.claim(
        worker="w", now=time.time(), lease_s=60.0, limit=2, workflows=None, max_recoveries=1
    )
    assert _status(store, x) == "failed"
    assert _status(store, c2) == "succeeded"
    assert f"child:{x}" in {s.name for s in store.list_signals(p1)}
    assert f"child:{c2}" in {s.name for s in store.list_signals(p2)}
    return None


def test_a_dead_letter_racing_a_batch_never_deadlocks(store: Store) -> None:
    _no_deadlocks(lambda: _dead_letter_round(store), 25)


@pytest.mark.slow
def test_a_dead_letter_racing_a_batch_never_deadlocks_many(store: Store) -> None:
    _no_deadlocks(lambda: _dead_letter_round(store), 400)


# -- a parent's end (which cancels its children) against its child's end ---------------


def _close_round(store: Store, *, batched: bool) -> str | None:
    """Parents P1 and P2, each running with a running child it never awaits (the
    default policy: its end cancels it); each parent ends as its child ends. Alone,
    two commits, P1's end and C1's; ``batched``, two batches, one ending P1 and C2,
    the other P2 and C1, so each holds a child whose parent the other ends."""
    end = RunTransition(kind="finish", status="succeeded", output='"ok"')
    parents = [_run(store), _run(store)]
    epochs = [_claim(store, p) or 0 for p in parents]
    children = [_run(store, p) for p in parents]
    child_epochs = [_claim(store, c) or 0 for c in children]
    ends = [
        RunWrite(run_id=r, epoch=e, transition=end) for r, e in zip(parents, epochs, strict=True)
    ]
    child_ends = [
        RunWrite(run_id=r, epoch=e, transition=end)
        for r, e in zip(children, child_epochs, strict=True)
    ]
    if batched:
        batches = [[ends[0], child_ends[1]], [ends[1], child_ends[0]]]
    else:
        batches = [[ends[0]], [child_ends[0]], [ends[1]], [child_ends[1]]]
    start = threading.Barrier(len(batches))

    def commit(batch: list[RunWrite]) -> Callable[[], None]:
        def go() -> None:
            start.wait()
            _commit_until_done(store, batch)

        return go

    met = _deadlock([_Thread(commit(b)) for b in batches])
    if met is not None:
        return met
    for parent, child in zip(parents, children, strict=True):
        assert _status(store, parent) == "succeeded"
        # Running when its parent ended: asked to cancel, and its end (already sent)
        # ends it cancelled; or it ended first.
        run = store.get_run(child)
        assert run is not None
        assert run.status == ("cancelled" if run.cancel_requested else "succeeded")
    return None


def test_a_parent_ending_as_its_child_ends_never_deadlocks(store: Store) -> None:
    for batched in (False, True):
        _no_deadlocks(partial(_close_round, store, batched=batched), 25)


@pytest.mark.slow
def test_a_parent_ending_as_its_child_ends_never_deadlocks_many(store: Store) -> None:
    for batched in (False, True):
        _no_deadlocks(partial(_close_round, store, batched=batched), 200)


# -- a child's end tells its parent's forks: batches holding each other's forks --------


def _forked(store: Store) -> tuple[str, str, str, int, int]:
    """A running parent whose journal started a running child, and a running fork of
    the parent past that start: ``(parent, child, fork, child epoch, fork epoch)``."""
    parent = _run(store)
    epoch = _claim(store, parent) or 0
    child = uuid.uuid4().hex
    store.create_run(
        run_id=child, workflow="kid", input="null", key=None, now=time.time(),
        parent=parent, parent_step="0:0",
    )  # fmt: skip
    start = StepRecord(
        run_id=parent, session=0, seq=0, kind="step", name="child", status="completed",
        attempt=1, epoch=epoch, output=dumps({"run_id": child}), started_at=time.time(),
        role="child",
    )  # fmt: skip
    [result] = store.commit([RunWrite(run_id=parent, epoch=epoch, steps=[start])], time.time())
    assert result.ok, result
    source = store.get_run(parent)
    assert source is not None
    fork = uuid.uuid4().hex
    store.fork_run(source, run_id=fork, session=0, upto_seq=0, output=None, now=time.time())
    return parent, child, fork, _claim(store, child) or 0, _claim(store, fork) or 0


def _fork_round(store: Store) -> str | None:
    """Two parents, each with a child and a fork holding the child's start; one
    batch ends C1 and commits F2, the other ends C2 and commits F1, at once: each
    child's end tells a fork the other batch holds."""
    end = RunTransition(kind="finish", status="succeeded", output='"ok"')
    one, two = _forked(store), _forked(store)
    batches = [
        [RunWrite(run_id=a[1], epoch=a[3], transition=end), RunWrite(run_id=b[2], epoch=b[4])]
        for a, b in ((one, two), (two, one))
    ]
    start = threading.Barrier(2)

    def commit(batch: list[RunWrite]) -> Callable[[], None]:
        def go() -> None:
            start.wait()
            _commit_until_done(store, batch)

        return go

    met = _deadlock([_Thread(commit(b)) for b in batches])
    if met is not None:
        return met
    for parent, child, fork, _, _ in (one, two):
        assert _status(store, child) == "succeeded"
        assert f"child:{child}" in {s.name for s in store.list_signals(parent)}
        assert f"child:{child}" in {s.name for s in store.list_signals(fork)}
    return None


def test_batches_ending_children_of_each_others_forks_never_deadlock(store: Store) -> None:
    _no_deadlocks(lambda: _fork_round(store), 25)


@pytest.mark.slow
def test_batches_ending_children_of_each_others_forks_never_deadlock_many(store: Store) -> None:
    _no_deadlocks(lambda: _fork_round(store), 400)


# -- prune against a child's end that reaches a fork through a finished fork ----------


def _prune_round(store: Store) -> str | None:
    """P holds child C's start; F1, a fork of P, has ended; F2, a fork of F1, runs.
    A prune (of everything finished) and C's end race: the prune must keep F1 (C's
    end reaches F2 through it) and neither may wait for the other in a cycle."""
    end = RunTransition(kind="finish", status="succeeded", output='"ok"')
    parent, child, f1, child_epoch, f1_epoch = _forked(store)
    _finish(store, f1, f1_epoch)
    source = store.get_run(f1)
    assert source is not None
    f2 = uuid.uuid4().hex
    store.fork_run(source, run_id=f2, session=0, upto_seq=0, output=None, now=time.time())
    assert _claim(store, f2) is not None
    start = threading.Barrier(2)

    def prune() -> None:
        start.wait()
        time.sleep(random.random() * 0.002)
        store.prune(0, time.time() + 1)

    def child_ends() -> None:
        start.wait()
        _commit_until_done(store, [RunWrite(run_id=child, epoch=child_epoch, transition=end)])

    met = _deadlock([_Thread(prune), _Thread(child_ends)])
    if met is not None:
        return met
    assert store.get_run(f1) is not None, "prune deleted the fork on the child's path"
    assert f"child:{child}" in {s.name for s in store.list_signals(f2)}
    assert f"child:{child}" in {s.name for s in store.list_signals(parent)}
    return None


def test_a_prune_racing_a_child_end_keeps_the_fork_on_its_path(store: Store) -> None:
    _no_deadlocks(lambda: _prune_round(store), 15)


@pytest.mark.slow
def test_a_prune_racing_a_child_end_keeps_the_fork_on_its_path_many(store: Store) -> None:
    _no_deadlocks(lambda: _prune_round(store), 300)


# -- a parent's end and its cancel lock its children in one order ----------------------


def test_a_parent_ending_as_it_is_cancelled_never_deadlocks(store: Store, pg_url: str) -> None:
    """Both lock the parent's tree before the parent, one subtree after another, in
    one order: the end used to go deepest first over the whole tree (b11 first), the
    cancel subtree by subtree (a1 first), and each stopped at a row the other held."""
    parent = "x"
    store.create_run(run_id=parent, workflow="wf", input="null", key=None, now=time.time())
    epoch = _claim(store, parent)
    assert epoch is not None
    tree = {"a": parent, "a1": "a", "b": parent, "b1": "b", "b11": "b1"}
    for child, of in tree.items():
        store.create_run(
            run_id=child, workflow="wf", input="null", key=None, now=time.time(), parent=of
        )
    with psycopg.connect(pg_url, autocommit=True) as monitor:
        holds_a = _lock(pg_url, "a")  # the cancel stops at a, holding what it took
        cancel = _Thread(lambda: store.cancel(parent, time.time(), "stop"))
        cancel.start()
        _until_waiting(monitor, 1)
        end = _Thread(lambda: _finish(store, parent, epoch))
        end.start()
        _until_waiting(monitor, 2)  # the end stops at a row the cancel holds
        holds_a.commit()
        cancel.join(GIVE_UP_S)
        end.join(GIVE_UP_S)
        holds_a.close()
    assert (cancel.error, end.error) == (None, None)
    # The cancel, answered "running" (asked), came first: the end honours it.
    assert _status(store, parent) == "cancelled"
    assert {c: _status(store, c) for c in tree} == dict.fromkeys(tree, "cancelled")
