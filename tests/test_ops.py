"""Operations: what happens to workers and leases when processes, clocks, disks and
files misbehave (issue 12, items 12, 13, 14, 18 and 19).

Real worker processes (`mainspring worker apps.ops_app:app`) where the failure needs
one; real PostgreSQL where it matters (skipped without a server, see ``pg.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pg
import pytest

import mainspring as ms
from mainspring.storage import RunWrite, SQLiteStore, Store, WriteResult, open_store

ROOT = Path(__file__).resolve().parent
WORKER = (sys.executable, "-m", "mainspring", "worker", "apps.ops_app:app")


class Workers:
    """`mainspring worker apps.ops_app:app` processes on one database."""

    def __init__(self, url: str, tmp: Path, **env: str) -> None:
        self.url = url
        self.tmp = tmp
        self.env = {
            **os.environ,
            "MAINSPRING_DATABASE_URL": url,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            **env,
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.url)
        return self._store

    def submit(self, monkeypatch: pytest.MonkeyPatch, workflow: str, *args: Any) -> str:
        """Through the very module the workers load, pointed at this test's database."""
        for name, value in self.env.items():
            if name.startswith("MAINSPRING_"):
                monkeypatch.setenv(name, value)
        import apps.ops_app

        app = importlib.reload(apps.ops_app).app
        try:
            return app.submit(workflow, *args).run_id
        finally:
            app.close()

    def start(self, name: str, *extra: str, **env: str) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [*WORKER, "--worker-id", name, *extra],
                env={**self.env, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- {w}\n{self.log(w)[-3000:]}" for w in self.procs)

    def wait_started(self, name: str) -> None:
        wait_for(f"{name} to start", lambda: " started on " in self.log(name), 60, self)

    def run(self, run_id: str) -> ms.RunRecord:
        record = self.store.get_run(run_id)
        assert record is not None
        return record

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(10)
        if self._store is not None:
            self._store.close()


def wait_for(what: str, ready: Callable[[], bool], timeout: float, w: Workers | None) -> None:
    """Poll until ``ready()``; fail naming ``what`` (with the workers' logs)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}\n{w.logs() if w else ''}")
        time.sleep(0.05)


def completed(w: Workers, run_id: str) -> int:
    return sum(r.status == "completed" for r in w.store.load_steps(run_id))


@pytest.fixture
def sqlite_workers(tmp_path: Path) -> Iterator[Callable[..., Workers]]:
    made: list[Workers] = []

    def make(**env: str) -> Workers:
        made.append(Workers(f"sqlite:///{tmp_path / 'ops.db'}", tmp_path, **env))
        return made[-1]

    yield make
    for w in made:
        w.close()


@pytest.fixture
def pg_workers(tmp_path: Path) -> Iterator[Callable[..., Workers]]:
    dsn, name = pg.create_database()
    made: list[Workers] = []

    def make(**env: str) -> Workers:
        made.append(Workers(dsn, tmp_path, **env))
        return made[-1]

    yield make
    for w in made:
        w.close()
    pg.drop_database(name)


# -- item 12: a poison run is charged for its own crashes only ----------------------------


@pytest.mark.parametrize("workers", ["sqlite_workers", "pg_workers"])
def test_a_step_that_kills_its_worker_is_dead_lettered_and_its_neighbours_succeed(
    workers: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Neighbour steps take far longer than the poison takes to kill the worker, so
    # without isolation the neighbours never progress between crashes.
    w = request.getfixturevalue(workers)(
        MAINSPRING_TEST_LEASE_S="1.0",
        MAINSPRING_TEST_STEP_S="0.3",
        MAINSPRING_TEST_MAX_RECOVERIES="3",
    )
    neighbours = [w.submit(monkeypatch, "slow", 4) for _ in range(3)]
    poison = w.submit(monkeypatch, "poison")
    killed = 0
    deadline = time.monotonic() + 180
    while not all(w.run(r).finished for r in [*neighbours, poison]):
        assert time.monotonic() < deadline, w.logs()
        proc = w.start(f"w{len(w.procs)}", "--concurrency", "4")
        while proc.poll() is None and not all(w.run(r).finished for r in [*neighbours, poison]):
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, w.logs()
        else:
            assert proc.returncode == -signal.SIGKILL, w.logs()
            killed += 1
    dead = w.run(poison)
    assert dead.status == "failed", w.logs()
    assert "dead-lettered" in json.loads(dead.error or "{}")["message"]
    assert killed == 4  # crashes 1 and 2 with the neighbours, then 3 and 4 alone
    for run_id in neighbours:
        record = w.run(run_id)
        assert (record.status, record.output) == ("succeeded", "6"), (record, w.logs())


# -- item 13: a worker frozen inside a transaction (PostgreSQL) ---------------------------


def _frozen(proc: subprocess.Popen[bytes]) -> bool:
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def _returns(call: Callable[[], Any]) -> threading.Thread:
    """Run ``call`` in a thread (it may block on a row lock); the caller joins it."""

    def run() -> None:
        with contextlib.suppress(ms.StoreUnavailable):  # past lock_timeout: an answer too
            call()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_pg_worker_frozen_inside_a_transaction_is_taken_over(
    pg_workers: Callable[..., Workers], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    freeze = tmp_path / "freeze-now"
    w = pg_workers(
        MAINSPRING_TEST_LEASE_S="1.0",
        MAINSPRING_TEST_STEP_S="0.02",
        MAINSPRING_TEST_FREEZE_FILE=str(freeze),
        MAINSPRING_TEST_IDLE_TX_S="2",
    )
    run_id = w.submit(monkeypatch, "slow", 400)
    frozen = w.start("frozen")
    wait_for("the run to progress", lambda: completed(w, run_id) >= 3, 60, w)
    w.start("taker")
    w.wait_started("taker")
    freeze.touch()
    wait_for("the worker to freeze in a commit", lambda: _frozen(frozen), 30, w)
    frozen_at = time.monotonic()
    assert not freeze.exists()
    # It froze holding its run's row: a session idle in a transaction.
    import psycopg

    with psycopg.connect(w.url, autocommit=True) as conn:
        idle = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
            " AND datname = current_database()"
        ).fetchone()
    assert idle is not None and idle[0] >= 1
    # Outside actions on that row must answer, not wait for the frozen worker.
    signalled = _returns(lambda: w.store.send_signal(run_id, "ping", "null", time.time()))
    cancelled = _returns(lambda: w.store.cancel(run_id, time.time(), "stop it"))
    signalled.join(60)
    cancelled.join(60)
    assert not signalled.is_alive() and not cancelled.is_alive(), "signal/cancel hang"
    # Another worker takes the run over (a new epoch) and carries out the cancel.
    wait_for("the taker to cancel the run", lambda: w.run(run_id).status == "cancelled", 60, w)
    print(f"cancelled by the taker {time.monotonic() - frozen_at:.1f}s after the freeze")
    assert w.run(run_id).epoch >= 2
    assert _frozen(frozen)  # still frozen: the takeover did not wait for it
    frozen.send_signal(signal.SIGCONT)  # it wakes believing it holds the run
    wait_for("the stale worker to notice", lambda: "lost" in w.log("frozen"), 60, w)
    assert w.run(run_id).status == "cancelled"
    for name in ("frozen", "taker"):
        w.procs[name].send_signal(signal.SIGTERM)
        assert w.procs[name].wait(30) == 0, w.logs()


# -- item 14: a worker whose clock runs ahead (PostgreSQL) --------------------------------


def test_pg_worker_with_a_clock_30s_ahead_does_not_steal_leases(
    pg_workers: Callable[..., Workers], monkeypatch: pytest.MonkeyPatch
) -> None:
    w = pg_workers(MAINSPRING_TEST_LEASE_S="3.0", MAINSPRING_TEST_STEP_S="0.02")
    run_id = w.submit(monkeypatch, "slow", 250)
    w.start("healthy")
    wait_for("the run to progress", lambda: completed(w, run_id) >= 3, 60, w)
    ahead = w.start("ahead", MAINSPRING_TEST_CLOCK_SKEW_S="30")
    w.wait_started("ahead")
    time.sleep(0.5)  # a few claim polls of the worker that is ahead
    assert w.run(run_id).status == "running", "the run ended first: the test proved nothing"
    wait_for("the run to succeed", lambda: w.run(run_id).status == "succeeded", 120, w)
    ahead.send_signal(signal.SIGTERM)
    assert ahead.wait(30) == 0, w.logs()
    # It never took the run from its healthy owner (by its own clock every lease had
    # run out 27 s ago), and the run's journal was written by one epoch of one owner.
    assert "worker ahead stopped: {}" in w.log("ahead"), w.logs()
    assert len({r.epoch for r in w.store.load_steps(run_id)}) == 1, w.logs()
    # Its clock is still its own where that is right: it runs new work normally.
    w.procs["healthy"].send_signal(signal.SIGTERM)
    assert w.procs["healthy"].wait(30) == 0, w.logs()
    other = w.submit(monkeypatch, "slow", 2)
    w.start("ahead-again", MAINSPRING_TEST_CLOCK_SKEW_S="30")
    wait_for("the worker ahead to run new work", lambda: w.run(other).finished, 60, w)
    assert w.run(other).status == "succeeded"


def test_pg_leases_follow_the_database_clock_when_told(pg_workers: Callable[..., Workers]) -> None:
    store = pg_workers().store
    store.create_run(run_id="r1", workflow="wf", input="[]", key=None, now=time.time())
    [mine] = store.claim(
        worker="a",
        now=time.time(),
        lease_s=30,
        limit=1,
        workflows=None,
        max_recoveries=3,
        db_clock=True,
    )
    far = time.time() + 3600  # a caller whose clock is an hour ahead
    assert (
        store.claim(
            worker="b",
            now=far,
            lease_s=30,
            limit=1,
            workflows=None,
            max_recoveries=3,
            db_clock=True,
        )
        == []
    )
    beat = store.heartbeat(runs=[("r1", mine.epoch)], now=far, lease_s=30, db_clock=True)
    assert not beat.lost
    record = store.get_run("r1")
    assert record is not None and record.lease_until is not None
    assert record.lease_until < far  # written on the server's clock, not the caller's
    # Without db_clock (FakeClock tests), the caller's time decides, as before.
    [taken] = store.claim(
        worker="b", now=far, lease_s=30, limit=1, workflows=None, max_recoveries=3
    )
    assert taken.epoch == mine.epoch + 1


# -- item 19: one heartbeat statement per beat, never blocked by the event loop ------------


def test_pg_heartbeat_is_one_statement_for_all_held_runs(
    pg_workers: Callable[..., Workers],
) -> None:
    import psycopg

    from mainspring.storage import WorkerBeat
    from mainspring.storage.postgres import PostgresStore

    class Counting(PostgresStore):
        opened = 0

        def _write(self):  # type: ignore[no-untyped-def,override]
            Counting.opened += 1
            return super()._write()

        def _autocommit(self):  # type: ignore[no-untyped-def,override]
            Counting.opened += 1
            return super()._autocommit()

    store = Counting(pg_workers().url)
    try:
        now = time.time()
        for i in range(40):
            store.create_run(run_id=f"r{i:02}", workflow="wf", input="[]", key=None, now=now)
        held = store.claim(
            worker="a", now=now, lease_s=30, limit=40, workflows=None, max_recoveries=3
        )
        epochs = {r.id: r.epoch for r in held}
        store.cancel("r05", now, "stop")
        # One of them taken over by another worker, one row locked elsewhere.
        with store._write() as cur:
            cur.execute("UPDATE ms_runs SET epoch = epoch + 1 WHERE id = 'r07'")
        Counting.opened = 0
        beat = store.heartbeat(runs=sorted(epochs.items()), now=now + 5, lease_s=30)
        assert Counting.opened == 1  # one statement, however many runs are held
        assert (beat.lost, beat.cancel) == ({"r07"}, {"r05"})
        # The worker's registration rides in that same statement (the registry).
        me = WorkerBeat(id="a", host="h", pid=1, started_at=now, lease_s=30)
        Counting.opened = 0
        beat = store.heartbeat(runs=sorted(epochs.items()), now=now + 5, lease_s=30, worker=me)
        assert Counting.opened == 1 and (beat.lost, beat.cancel) == ({"r07"}, {"r05"})
        [registered] = store.list_workers()
        assert registered.beat_at == pytest.approx(now + 5) and "r00" in registered.runs
        locker = psycopg.connect(store._dsn)
        try:
            # One row held by a transaction that stays: the others are extended anyway.
            locker.execute("SELECT 1 FROM ms_runs WHERE id = 'r09' FOR UPDATE")
            beat = store.heartbeat(runs=sorted(epochs.items()), now=now + 10, lease_s=30)
        finally:
            locker.rollback()
        assert (beat.lost, beat.cancel) == ({"r07"}, {"r05"})
        leases = {r.id: r.lease_until for r in store.list_runs(limit=100)}
        assert leases["r09"] == pytest.approx(now + 35)  # locked: not extended, not lost
        assert leases["r07"] == pytest.approx(now + 30)  # lost: not extended
        assert all(
            leases[rid] == pytest.approx(now + 40) for rid in epochs if rid not in ("r07", "r09")
        )
        # A row held for a moment (as by the worker's own group commit) is waited for.
        try:
            locker.execute("SELECT 1 FROM ms_runs WHERE id = 'r09' FOR UPDATE")
            threading.Timer(0.05, locker.rollback).start()
            beat = store.heartbeat(runs=sorted(epochs.items()), now=now + 15, lease_s=30)
        finally:
            locker.close()
        assert store.get_run("r09").lease_until == pytest.approx(now + 45)  # type: ignore[union-attr]
    finally:
        store.close()


class BlockingCommits(SQLiteStore):
    """The third commit holds its thread for a second: a slow fsync or a busy file."""

    commits = 0
    beats: list[float]
    blocked: tuple[float, float] = (0.0, 0.0)

    def commit(self, batch: Sequence[RunWrite], now: float) -> list[WriteResult]:
        BlockingCommits.commits += 1
        if BlockingCommits.commits == 3:
            start = time.monotonic()
            time.sleep(1.0)
            BlockingCommits.blocked = (start, time.monotonic())
        return super().commit(batch, now)

    def heartbeat(self, **kwargs: Any) -> Any:  # type: ignore[override]
        self.beats.append(time.monotonic())
        return super().heartbeat(**kwargs)


async def test_heartbeats_go_on_while_a_solo_commit_blocks_the_event_loop(
    tmp_path: Path,
) -> None:
    store = BlockingCommits(tmp_path / "block.db")
    store.beats = []
    app = ms.App(store, lease_s=5.0, heartbeat_s=0.1)

    def noop(i: int) -> int:
        return i

    @app.workflow
    async def wf(ctx: ms.RunContext) -> int:
        return sum([await ctx.step(noop, i) for i in range(5)])

    handle = app.submit(wf)
    worker = app.worker(concurrency=1)  # one run: its commits run inline, in the loop
    await asyncio.wait_for(worker.run(until_idle=True), 30)
    assert app.get_run(handle.run_id).status == "succeeded"
    start, end = BlockingCommits.blocked
    assert end > start
    # The loop was held for a second; the leases were still extended meanwhile.
    assert any(start < t < end for t in store.beats), (store.beats, start, end)
    app.close()


# -- item 18: SQLite operations ------------------------------------------------------------


def test_sqlite_full_disk_is_retryable(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'full.db'}")

    @app.workflow
    async def wf(ctx: ms.RunContext, blob: str) -> int:
        return len(blob)

    app.submit(wf, "small")
    store = app.store
    assert isinstance(store, SQLiteStore)
    conn = store._conn()  # this thread's connection: the one submit will use
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's own SQLITE_FULL
    with pytest.raises(ms.StoreUnavailable, match="full") as caught:
        app.submit(wf, "x" * 200_000)
    assert caught.value.retryable
    conn.execute("PRAGMA max_page_count = 1073741823")  # space freed: it goes through
    app.submit(wf, "x" * 200_000)
    app.close()


def test_sqlite_worker_started_while_the_file_is_locked_waits(
    sqlite_workers: Callable[..., Workers], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    w = sqlite_workers(MAINSPRING_TEST_STEP_S="0.01")
    run_id = w.submit(monkeypatch, "slow", 3)
    w.store.close()
    # A backup or an operator's shell holds the write lock past the busy timeout.
    holder = sqlite3.connect(tmp_path / "ops.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        proc = w.start(
            "w", MAINSPRING_DATABASE_URL=f"sqlite:///{tmp_path / 'ops.db'}?busy_timeout_ms=100"
        )
        wait_for(
            "the worker to say it waits",
            lambda: "retrying" in w.log("w") or proc.poll() is not None,
            60,
            w,
        )
        assert proc.poll() is None, w.log("w")  # waiting, not gone
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    wait_for("the run to succeed", lambda: w.run(run_id).status == "succeeded", 60, w)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, w.log("w")


def test_sqlite_database_deleted_under_a_worker_stops_it_loudly(
    sqlite_workers: Callable[..., Workers], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    w = sqlite_workers(MAINSPRING_TEST_STEP_S="0.05")
    run_id = w.submit(monkeypatch, "slow", 400)
    proc = w.start("w")
    wait_for("the run to progress", lambda: completed(w, run_id) >= 3, 60, w)
    w.store.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path / 'ops.db'}{suffix}").unlink(missing_ok=True)
    assert proc.wait(60) != 0, w.log("w")
    out = w.log("w")
    assert "was deleted" in out and str(tmp_path / "ops.db") in out, out
    assert "Traceback" not in out, out


def test_sqlite_database_replaced_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    store = SQLiteStore(path)
    store.create_run(run_id="r1", workflow="wf", input="[]", key=None, now=1.0)
    other = SQLiteStore(tmp_path / "b.db")
    other.close()
    os.replace(other.path, path)  # a backup restored over it
    with pytest.raises(ms.StoreError, match="replaced"):
        store.claim(worker="w", now=2.0, lease_s=5, limit=1, workflows=None, max_recoveries=3)
    with pytest.raises(ms.StoreError, match="replaced"):
        store.create_run(run_id="r2", workflow="wf", input="[]", key=None, now=2.0)
    store.close()


def test_pg_timeouts_are_set_on_every_connection_and_can_be_tuned(
    pg_workers: Callable[..., Workers],
) -> None:
    from mainspring.storage.postgres import PostgresStore

    url = pg_workers().url

    def settings(store: PostgresStore) -> tuple[str, str, str]:
        try:
            with store._read() as cur:
                cur.execute(
                    "SELECT current_setting('idle_in_transaction_session_timeout'),"
                    " current_setting('lock_timeout'), current_setting('statement_timeout')"
                )
                row = cur.fetchone()
                return (row[0], row[1], row[2])
        finally:
            store.close()

    assert settings(PostgresStore(url)) == ("10s", "5s", "1min")
    chosen = PostgresStore(url, lock_timeout_s=0.25, statement_timeout_s=None)
    assert settings(chosen) == ("10s", "250ms", "0")  # None: the server's (off)
    # A URL's options (what `mainspring worker` users can set) beat the defaults ...
    tuned = f"{url}?options=-c%20lock_timeout%3D2s%20-c%20idle_in_transaction_session_timeout%3D3s"
    assert settings(PostgresStore(tuned)) == ("3s", "2s", "1min")
    # ... and a value passed in code beats the URL.
    assert settings(PostgresStore(tuned, lock_timeout_s=1)) == ("3s", "1s", "1min")
    with pytest.raises(ms.ConfigError, match="lock_timeout"):
        PostgresStore(url, lock_timeout_s=-1)


async def test_a_wedged_event_loop_lets_its_leases_go(tmp_path: Path) -> None:
    """Heartbeats from a thread must not keep the runs of a stuck process forever."""
    app = ms.App(f"sqlite:///{tmp_path / 'wedged.db'}", lease_s=1.0, heartbeat_s=0.2)
    taken: list[ms.RunRecord] = []

    def take_over() -> None:  # another worker, polling while this process's loop is stuck
        store = SQLiteStore(tmp_path / "wedged.db")
        deadline = time.monotonic() + 30
        while not taken and time.monotonic() < deadline:
            taken.extend(
                store.claim(
                    worker="other",
                    now=time.time(),
                    lease_s=60,
                    limit=1,
                    workflows=None,
                    max_recoveries=5,
                )
            )
            time.sleep(0.05)
        store.close()

    thief = threading.Thread(target=take_over)

    @app.workflow
    async def wedges(ctx: ms.RunContext) -> None:
        await ctx.step(lambda: None)
        thief.start()
        while not taken and thief.is_alive():
            time.sleep(0.05)  # noqa: ASYNC251 - workflow code holding the event loop

    app.submit(wedges)
    worker = app.worker(concurrency=1)
    await asyncio.wait_for(worker.run(until_idle=True), 60)
    thief.join()
    assert taken, "the leases of a wedged loop were extended forever"
    assert worker.stats.outcomes == {"lost": 1}
    app.close()


async def test_repeated_runs_leave_no_connections_behind(tmp_path: Path) -> None:
    """Each worker run has its own heartbeat thread: its connection must go with it."""
    store = SQLiteStore(tmp_path / "conns.db")
    app = ms.App(store, lease_s=1.0, heartbeat_s=0.02)

    def pause() -> None:
        time.sleep(0.1)  # long enough for a few heartbeats

    @app.workflow
    async def wf(ctx: ms.RunContext) -> None:
        await ctx.step(pause)

    for _ in range(12):
        await app.run(wf)
    # Every open connection belongs to a live thread (the event loop's, its executor's).
    assert len(store._all) <= threading.active_count(), (
        len(store._all),
        threading.active_count(),
    )
    app.close()
