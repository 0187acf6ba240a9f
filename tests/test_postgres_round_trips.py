"""PostgreSQL's hot path: a step commit and a claim each cost one round trip, a refused
commit still answers as the commit protocol says, and a wake-up names its run."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pg
import pytest

from mainspring.storage import RunTransition, RunWrite, StepRecord

psycopg = pytest.importorskip("psycopg")
from mainspring.storage.postgres import PostgresStore  # noqa: E402


@pytest.fixture
def store() -> Iterator[PostgresStore]:
    dsn, name = pg.create_database()
    s = PostgresStore(dsn, min_size=1, max_size=1)
    yield s
    s.close()
    pg.drop_database(name)


def round_trips(store: PostgresStore, tmp: Path, call: Callable[[], Any]) -> tuple[int, Any]:
    """The server's ReadyForQuery messages while ``call`` runs: one per wait for an
    answer (libpq's trace; untrace flushes it)."""
    trace = tmp / "trace.log"
    with trace.open("w") as f:
        with store._pool.connection() as conn:  # the pool's only connection
            conn.pgconn.trace(f.fileno())
        try:
            result = call()
        finally:
            with store._pool.connection() as conn:
                conn.pgconn.untrace()
    return trace.read_text().count("ReadyForQuery"), result


def step(run_id: str, seq: int, epoch: int, now: float) -> StepRecord:
    return StepRecord(
        run_id=run_id, session=0, seq=seq, kind="step", name="s", status="completed",
        attempt=1, epoch=epoch, output=str(seq), started_at=now, finished_at=now,
    )  # fmt: skip


def claim(store: PostgresStore, now: float, **kw: Any) -> Any:
    return store.claim(worker="w", now=now, lease_s=60, limit=kw.pop("limit", 1),
                       workflows=None, max_recoveries=3, **kw)  # fmt: skip


def test_step_commit_and_claim_are_one_round_trip_each(
    store: PostgresStore, tmp_path: Path
) -> None:
    now = time.time()
    store.create_run(run_id="r", workflow="wf", input="null", key=None, now=now)
    trips, [run] = round_trips(store, tmp_path, lambda: claim(store, now))
    assert trips == 1
    assert run.status == "running" and run.epoch == 1
    for seq in range(3):
        write = RunWrite(run_id="r", epoch=run.epoch, steps=[step("r", seq, run.epoch, now)])
        trips, [result] = round_trips(store, tmp_path, lambda w=write: store.commit([w], now))
        assert trips == 1 and result.ok and not result.already
    finish = RunTransition(kind="finish", status="succeeded", output="2")
    done = RunWrite(run_id="r", epoch=run.epoch, transition=finish)
    trips, [result] = round_trips(store, tmp_path, lambda: store.commit([done], now))
    assert trips == 1 and result.ok and not result.already
    # Exactly what was written, timestamps to the last bit.
    assert store.load_steps("r") == [step("r", seq, run.epoch, now) for seq in range(3)]
    # Re-sent after an ambiguous failure: the fence fails, the commit protocol answers.
    assert store.commit([done], now)[0].already
    assert store.get_run("r").status == "succeeded"  # type: ignore[union-attr]


def test_a_refused_batch_writes_none_of_the_refused_runs_rows(store: PostgresStore) -> None:
    now = time.time()
    for rid in ("a", "b"):
        store.create_run(run_id=rid, workflow="wf", input="null", key=None, now=now)
    runs = {r.id: r for r in claim(store, now, limit=2)}
    stale = RunWrite(run_id="a", epoch=runs["a"].epoch - 1, steps=[step("a", 0, 0, now)])
    fresh = RunWrite(run_id="b", epoch=runs["b"].epoch, steps=[step("b", 0, 1, now)])
    refused, ok = store.commit([stale, fresh], now)
    assert not refused.ok and ok.ok
    assert store.load_steps("a") == [] and len(store.load_steps("b")) == 1


def test_cancel_requested_comes_back_from_the_one_round_trip_commit(store: PostgresStore) -> None:
    now = time.time()
    store.create_run(run_id="r", workflow="wf", input="null", key=None, now=now)
    [run] = claim(store, now)
    store.cancel("r", now)
    [result] = store.commit(
        [RunWrite(run_id="r", epoch=run.epoch, steps=[step("r", 0, 1, now)])], now
    )
    assert result.ok and result.cancel_requested


def test_a_wake_up_names_the_run_that_became_runnable(store: PostgresStore) -> None:
    named: list[str] = []
    got = threading.Event()
    looked = threading.Event()

    def on_run(run_id: str) -> None:
        named.append(run_id)
        got.set()

    stop = store.listen(looked.set, on_run=on_run)
    assert stop is not None
    try:
        assert looked.wait(10)  # connected: it looks once for what it may have missed
        store.create_run(run_id="r1", workflow="wf", input="null", key=None, now=time.time())
        assert got.wait(10)
        assert named == ["r1"]
        [run] = claim(store, time.time(), run_id=named[0])
        assert run.id == "r1"
    finally:
        stop()
