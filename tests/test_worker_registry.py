"""The worker registry (``ms_workers``) on SQLite and PostgreSQL: a worker registers
from its heartbeat (in the same transaction as its leases), is marked stopped when it
stops, reads as dead once silent for longer than its lease, and is forgotten a day
later; the server's ``/metrics`` reports it from the store."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import mainspring as ms
from mainspring.storage import WorkerBeat, open_store
from mainspring.testing import Fault, FaultyStore


def _beat(worker: str, *, at: float, forget_before: float | None = None) -> dict[str, Any]:
    return {
        "runs": [],
        "now": at,
        "lease_s": 15.0,
        "worker": WorkerBeat(
            id=worker, host="host-a", pid=41, started_at=at - 60, lease_s=15.0,
            forget_before=forget_before,
        ),
    }  # fmt: skip


async def _until(check: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_worker_registers_holds_runs_and_stops(db_url: str) -> None:
    app = ms.App(db_url, heartbeat_s=0.05, poll_interval_s=0.02, inline_wait_s=0.0)
    release = asyncio.Event()

    @app.workflow
    async def held(ctx: ms.RunContext) -> str:
        async def hold() -> str:
            await release.wait()
            return "done"

        return await ctx.step(hold, name="hold")

    run_id = app.submit(held).run_id
    worker = app.worker()
    task = asyncio.create_task(worker.run(until_idle=True))
    try:
        [me] = await _until(
            lambda: [w for w in app.store.list_workers() if w.runs == (run_id,)],
            "the worker to register holding the run",
        )
        assert me.id == worker.worker_id and me.stopped_at is None
        assert me.state(time.time()) == "alive"
        assert me.lease_until is not None and me.lease_until > me.beat_at
        first = me.beat_at
        await _until(
            lambda: app.store.list_workers()[0].beat_at > first, "a later heartbeat"
        )  # every beat moves it
        assert app.get_run(run_id).owner == worker.worker_id
    finally:
        release.set()
        await task
    [gone] = app.store.list_workers()
    assert gone.stopped_at is not None and gone.runs == ()
    assert gone.state(time.time()) == "stopped"
    app.close()


def test_dead_workers_are_marked_then_forgotten(db_url: str) -> None:
    store = open_store(db_url)
    store.migrate()
    now = time.time()
    store.heartbeat(**_beat("alive-1", at=now))
    store.heartbeat(**_beat("dead-1", at=now - 120))  # silent for longer than its lease
    store.heartbeat(**_beat("dead-2", at=now - 2 * 86_400))  # silent for two days
    states = {w.id: w.state(now) for w in store.list_workers()}
    assert states == {"alive-1": "alive", "dead-1": "dead", "dead-2": "dead"}
    # A live worker's beat now and then forgets the workers silent for a day.
    store.heartbeat(**_beat("alive-1", at=now + 1, forget_before=now - 86_400))
    assert sorted(w.id for w in store.list_workers()) == ["alive-1", "dead-1"]
    # A dead worker that beats again is alive again; a stopped one says so.
    store.heartbeat(**_beat("dead-1", at=now + 2))
    store.worker_stopped("alive-1", now + 3)
    states = {w.id: w.state(now + 3) for w in store.list_workers()}
    assert states == {"alive-1": "stopped", "dead-1": "alive"}
    store.close()


def test_the_servers_metrics_report_workers_from_the_store(db_url: str) -> None:
    pytest.importorskip("prometheus_client")
    app = ms.App(db_url)
    now = time.time()
    app.store.heartbeat(**_beat("alive-1", at=now))
    app.store.heartbeat(**_beat("dead-1", at=now - 120))
    app.store.heartbeat(**_beat("long-dead", at=now - 7200))  # dropped from the gauges
    app.store.heartbeat(**_beat("stopped-1", at=now))
    app.store.worker_stopped("stopped-1", now)
    body, _ = app.observe.metrics().render()
    text = body.decode()
    assert 'mainspring_workers{state="alive"} 1.0' in text
    assert 'mainspring_workers{state="dead"} 1.0' in text
    ages = {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mainspring_store_worker_heartbeat_age_seconds{")
    }
    assert set(ages) == {"alive-1", "dead-1"}  # bounded: no stopped or long-dead worker
    assert ages["dead-1"] >= 120 and ages["alive-1"] < 60
    app.close()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_busy_store_delays_registration_and_stops_nothing(db_url: str) -> None:
    """An idle worker whose registration meets a busy store logs it and registers at a
    later beat; its stop is recorded once, and it never lists workers itself."""
    inner = open_store(db_url)
    idle_beat = Fault(kind="busy", method="heartbeat", times=3, when=lambda a, k: not k["runs"])
    store = FaultyStore(inner, [idle_beat])
    app = ms.App(store, heartbeat_s=0.02, poll_interval_s=0.02)
    worker = app.worker()
    task = asyncio.create_task(worker.run())
    try:
        await _until(inner.list_workers, "the worker to register after the busy beats")
        assert idle_beat.hits == 3
    finally:
        worker.request_stop()
        await task
    [me] = inner.list_workers()
    assert me.stopped_at is not None
    assert store.count("worker_stopped") == 1
    assert store.count("list_workers") == 0 and store.count("forget_workers") == 0
    app.close()
