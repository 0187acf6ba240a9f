"""Runs' ends racing what else holds their rows, on PostgreSQL.

- A heartbeat extending leases whose rows were held a moment ago (its second
  statement, which waits for them) locks them in the cascade's order, child before
  parent, as a child's end does (its row, then its parent's): before, it updated them
  in no set order, so it could hold a parent while waiting for a child whose end held
  the child and waited for the parent. Its 500 ms lock timeout broke that cycle before
  PostgreSQL's deadlock detector: the child's end stalled for half a second and the
  beat extended none of the leases it waited for.
- A group commit that ends two runs at different depths of one tree (a child and its
  own child) while an ancestor is cancelled: no deadlock, and every run ends as its
  cancel says (an asked cancel ends a run cancelled).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pg
import psycopg
import pytest

from mainspring import StoreUnavailable
from mainspring.storage import RunTransition, RunWrite, StepRecord, Store, open_store
from mainspring.testing import check_invariants

# How long a helper waits for the server to show the expected lock waits before it
# gives up. Not a duration under test: each wait shows within milliseconds.
GIVE_UP_S = 30.0
LEASE_S = 60.0


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


def _running(store: Store, run_id: str, parent: str | None = None) -> int:
    """Create ``run_id`` (a child of ``parent``) and take it as a worker does: its epoch."""
    store.create_run(
        run_id=run_id, workflow="wf", input="null", key=None, now=time.time(), parent=parent,
        parent_step=None if parent is None else "0:0",
    )  # fmt: skip
    [run] = store.claim(
        worker="w", now=time.time(), lease_s=LEASE_S, limit=1, workflows=None,
        max_recoveries=3, run_id=run_id,
    )  # fmt: skip
    return run.epoch


def _until_waiting(monitor: psycopg.Connection, n: int) -> None:
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
    def __init__(self, target: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.call = target
        self.result: object = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as exc:  # reported by the test
            self.error = exc


def _lease(store: Store, run_id: str) -> float:
    run = store.get_run(run_id)
    assert run is not None and run.lease_until is not None
    return run.lease_until


# -- the heartbeat's second statement against a child's end ------------------------------


def test_a_beat_waiting_for_held_rows_locks_a_child_before_its_parent(
    store: Store, pg_url: str
) -> None:
    """The worker holds a parent and its child; both rows were held elsewhere at its
    beat's first statement, so the second one waits for them. The child's end holds
    the child's row (and, stalled on a journal row another session holds, has not yet
    asked for the parent's). Locking the child first, the beat waits behind that end,
    which then takes the parent's row, ends and lets the beat extend the parent's
    lease. Locking the parent first (ids sort it first here), the beat held it while
    it waited for the child, the end waited for the parent, and the beat's lock
    timeout gave up on both leases."""
    parent, child = "a-parent", "b-child"  # the old statement's order: the parent first
    parent_epoch = _running(store, parent)
    child_epoch = _running(store, child, parent)
    step = StepRecord(
        run_id=child, session=0, seq=0, kind="step", name="s", status="started", attempt=1,
        epoch=child_epoch, started_at=time.time(),
    )  # fmt: skip
    [ok] = store.commit([RunWrite(run_id=child, epoch=child_epoch, steps=[step])], time.time())
    assert ok.ok
    before = _lease(store, parent)
    done = StepRecord(**{**_fields(step), "status": "completed", "output": "1"})
    end = RunWrite(
        run_id=child, epoch=child_epoch, steps=[done],
        transition=RunTransition(kind="finish", status="succeeded", output="1"),
    )  # fmt: skip
    at = time.time() + 1000  # far from `before`: an extension shows
    with psycopg.connect(pg_url, autocommit=True) as monitor, psycopg.connect(pg_url) as journal:
        # The child's end stalls on its journal row, holding the child's row.
        journal.execute("SELECT 1 FROM ms_steps WHERE run_id = %s FOR UPDATE", (child,))
        ending = _Thread(lambda: store.commit([end], time.time()))
        ending.start()
        _until_waiting(monitor, 1)
        beat = _Thread(
            lambda: store._beat_locked(  # type: ignore[attr-defined]
                [(parent, parent_epoch), (child, child_epoch)], "?", [at], LEASE_S
            )
        )
        beat.start()
        _until_waiting(monitor, 2)  # the beat waits too (for the parent's row, or the child's)
        journal.commit()
        ending.join(GIVE_UP_S)
        beat.join(GIVE_UP_S)
    assert (ending.error, beat.error) == (None, None)
    assert [r.ok for r in ending.result] == [True]  # type: ignore[attr-defined]
    child_run = store.get_run(child)
    assert child_run is not None and child_run.status == "succeeded"
    # The parent's lease was extended (the child's, ended meanwhile, is not a lease).
    assert (before, _lease(store, parent)) == (before, at + LEASE_S)


def _fields(s: StepRecord) -> dict[str, object]:
    return {f: getattr(s, f) for f in StepRecord.__dataclass_fields__}


# -- a batch ending runs at two depths of one tree while an ancestor is cancelled ---------


def _commit_until_done(store: Store, batch: list[RunWrite]) -> None:
    """As a worker's group commit: writes answered busy are sent again."""
    while batch:
        results = store.commit(batch, time.time())
        assert all(r.ok or r.busy for r in results), results
        batch = [w for w, r in zip(batch, results, strict=True) if r.busy]
        time.sleep(random.random() * 0.002)


def _depth_round(store: Store) -> str | None:
    """A → B → C, each running; one batch ends B and C at once while another thread
    cancels A. Returns the deadlock met, if one was."""
    a, b, c = (uuid.uuid4().hex for _ in range(3))
    epochs = {a: _running(store, a)}
    epochs[b] = _running(store, b, a)
    epochs[c] = _running(store, c, b)
    end = RunTransition(kind="finish", status="succeeded", output='"ok"')
    batch = [RunWrite(run_id=r, epoch=epochs[r], transition=end) for r in (b, c)]
    start = threading.Barrier(2)
    answers: list[str] = []

    def commit() -> None:
        start.wait()
        _commit_until_done(store, batch)

    def cancel() -> None:
        start.wait()
        time.sleep(random.random() * 0.003)  # lands all around the batch
        answers.append(store.cancel(a, time.time(), "stop"))

    threads = [_Thread(commit), _Thread(cancel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GIVE_UP_S)
    for t in threads:
        if isinstance(t.error, StoreUnavailable) and "deadlock" in str(t.error):
            return str(t.error)
        if t.error is not None:
            raise t.error
    assert answers == ["running"]  # A held by its worker: asked
    # A's worker honours the cancel: its end, whatever it meant, is a cancel.
    [done] = store.commit([RunWrite(run_id=a, epoch=epochs[a], transition=end)], time.time())
    assert done.ok and done.cancel_requested
    runs = {r: store.get_run(r) for r in (a, b, c)}
    for rid, run in runs.items():
        assert run is not None and run.finished, (rid, run)
        # Asked to cancel (the cascade reached it while it ran) ends it cancelled;
        # one whose end committed first keeps it.
        assert run.status == ("cancelled" if run.cancel_requested else "succeeded"), run
    assert runs[a].status == "cancelled"  # type: ignore[union-attr]
    assert check_invariants(store, run_ids=[a, b, c]) == []
    return None


def _no_deadlocks(one_round: Callable[[], str | None], rounds: int) -> None:
    deadlocks = [d for d in (one_round() for _ in range(rounds)) if d is not None]
    assert deadlocks == [], f"{len(deadlocks)} of {rounds} rounds deadlocked: {deadlocks[0]}"


def test_a_batch_ending_two_depths_of_a_tree_as_its_root_is_cancelled(store: Store) -> None:
    _no_deadlocks(lambda: _depth_round(store), 25)


@pytest.mark.slow
def test_a_batch_ending_two_depths_of_a_tree_as_its_root_is_cancelled_many(
    store: Store,
) -> None:
    _no_deadlocks(lambda: _depth_round(store), 400)


def test_the_depth_race_ends_the_same_on_sqlite(tmp_path: Path) -> None:
    s = open_store(f"sqlite:///{tmp_path / 'ms.db'}")
    try:
        _no_deadlocks(lambda: _depth_round(s), 10)
    finally:
        s.close()


# -- a cancel that comes too late changes nothing ------------------------------------------


def test_a_cancel_that_finds_its_run_ended_changes_nothing(store: Store, pg_url: str) -> None:
    """The parent's end and a cancel of it both lock its running child first. The end
    gets there first (the cancel queues behind it), ends the parent and asks the child
    to cancel because its parent succeeded. The cancel then took the child too, wrote
    its own reason over that, and only then found the parent ended: it answered that it
    came too late, yet had changed the child. Now it rolls back and changes nothing."""
    parent = uuid.uuid4().hex
    epoch = _running(store, parent)
    child = uuid.uuid4().hex
    _running(store, child, parent)
    end = RunWrite(
        run_id=parent, epoch=epoch,
        transition=RunTransition(kind="finish", status="succeeded", output='"ok"'),
    )  # fmt: skip
    with psycopg.connect(pg_url, autocommit=True) as monitor, psycopg.connect(pg_url) as hold:
        hold.execute("SELECT 1 FROM ms_runs WHERE id = %s FOR UPDATE", (child,))
        ending = _Thread(lambda: store.commit([end], time.time()))
        ending.start()
        _until_waiting(monitor, 1)  # the end waits for the child's row first ...
        cancel = _Thread(lambda: store.cancel(parent, time.time(), "too late"))
        cancel.start()
        _until_waiting(monitor, 2)  # ... and the cancel behind it
        hold.commit()
        ending.join(GIVE_UP_S)
        cancel.join(GIVE_UP_S)
    assert (ending.error, cancel.error) == (None, None)
    assert cancel.result == "succeeded"  # too late, and it says so
    run = store.get_run(parent)
    assert run is not None and (run.status, run.cancel_requested) == ("succeeded", False)
    kid = store.get_run(child)
    assert kid is not None and kid.cancel_requested  # asked by its parent's end ...
    assert f"its parent run {parent!r} succeeded" in (kid.error or "")  # ... and only by it
