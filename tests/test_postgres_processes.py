"""Real worker processes on PostgreSQL: SIGKILL chaos, a server restart, a row lock held
elsewhere, and a wrong DSN.

Every test skips unless MAINSPRING_TEST_POSTGRES_DSN names a server (see ``pg.py``) and
works in a database of its own, dropped afterwards.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pg
import pytest

import mainspring as ms
from mainspring.storage import FINISHED, Store, open_store
from mainspring.testing import EffectLedger

ROOT = Path(__file__).resolve().parent
WORKER = (sys.executable, "-m", "mainspring", "worker", "apps.chaos_app:app")


@pytest.fixture
def pg_db() -> Iterator[str]:
    """A fresh database of its own for one test (skips without a server)."""
    dsn, name = pg.create_database()
    yield dsn
    pg.drop_database(name)


class PgCluster:
    """`mainspring worker apps.chaos_app:app` processes sharing one PostgreSQL database."""

    def __init__(self, dsn: str, tmp: Path, *, lease_s: float, step_s: float) -> None:
        self.dsn = dsn
        self.tmp = tmp
        self.ledger_path = tmp / "ledger.db"
        self.env = {
            **os.environ,
            "MAINSPRING_DATABASE_URL": dsn,
            "MAINSPRING_TEST_LEDGER": str(self.ledger_path),
            "MAINSPRING_TEST_LEASE_S": str(lease_s),
            "MAINSPRING_TEST_STEP_S": str(step_s),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        """The test's own view of the database."""
        if self._store is None:
            self._store = open_store(self.dsn)
        return self._store

    def submit(
        self, monkeypatch: pytest.MonkeyPatch, workflow: str, steps: int, keys: list[str]
    ) -> list[str]:
        """Submit runs through the very module the workers load, pointed at this test."""
        for name in (
            "MAINSPRING_DATABASE_URL",
            "MAINSPRING_TEST_LEDGER",
            "MAINSPRING_TEST_LEASE_S",
        ):
            monkeypatch.setenv(name, self.env[name])
        import apps.chaos_app

        app = importlib.reload(apps.chaos_app).app
        try:
            return [app.submit(workflow, steps, key=key).run_id for key in keys]
        finally:
            app.close()

    def start(self, worker_id: str, *extra: str) -> subprocess.Popen[bytes]:
        """Start a worker named ``worker_id`` (its name in ``ms_runs.owner``)."""
        with open(self.tmp / f"{worker_id}.log", "wb") as log:
            proc = subprocess.Popen(
                [*WORKER, "--worker-id", worker_id, *extra],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[worker_id] = proc
        return proc

    def log(self, worker_id: str) -> str:
        return (self.tmp / f"{worker_id}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- {w}\n{self.log(w)[-3000:]}" for w in self.procs)

    def wait_started(self, worker_id: str) -> None:
        """Until the worker has installed its signal handlers and begun to claim."""
        wait_for(f"{worker_id} to start", lambda: " started on " in self.log(worker_id), 30)

    def stop(self, worker_id: str) -> int:
        """SIGTERM (the worker drains) and wait; returns its exit code."""
        proc = self.procs[worker_id]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        return proc.wait(30)

    def reopen(self) -> None:
        """Drop the test's own connections (after the server restarted)."""
        if self._store is not None:
            self._store.close()
            self._store = None

    def finished(self) -> int:
        """How many runs have finished (-1 while the server cannot say)."""
        try:
            counts = self.store.count_runs()
        except ms.StoreUnavailable:  # someone restarted the server: ask again later
            return -1
        return sum(counts.get(status, 0) for status in FINISHED)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(10)
        if self._store is not None:
            self._store.close()


MakeCluster = Callable[..., PgCluster]


@pytest.fixture
def make_cluster(pg_db: str, tmp_path: Path) -> Iterator[MakeCluster]:
    """``make_cluster(lease_s=..., step_s=...)``: workers on this test's database."""
    made: list[PgCluster] = []

    def make(*, lease_s: float, step_s: float) -> PgCluster:
        made.append(PgCluster(pg_db, tmp_path, lease_s=lease_s, step_s=step_s))
        return made[-1]

    yield make
    for c in made:
        c.close()


def wait_for(
    what: str, ready: Callable[[], bool], timeout: float, c: PgCluster | None = None
) -> None:
    """Poll until ``ready()``; fail naming ``what`` (and showing the workers' logs)."""
    deadline = time.monotonic() + timeout
    while not _ready(ready):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}\n{c.logs() if c else ''}")
        time.sleep(0.05)


def _ready(ready: Callable[[], bool]) -> bool:
    try:
        return ready()
    except ms.StoreUnavailable:  # the server restarted: not ready yet
        return False


def check_effects(c: PgCluster, ids: list[str], steps: int | dict[str, int]) -> int:
    """The EffectLedger check after chaos; returns how many steps ran more than once.

    Every run succeeded; each run's journal is whole (one ended row per position);
    every at_least_once effect took place exactly once per idempotency key; no
    at_most_once step was called twice.
    """
    store = c.store
    records = {r.id: r for r in store.list_runs(limit=len(ids) * 2)}
    assert sorted(records) == sorted(ids), "a run was lost or one appeared from nowhere"
    not_ok = [(r.id, r.status, r.error) for r in records.values() if r.status != "succeeded"]
    assert not_ok == []
    ledger = EffectLedger(c.ledger_path)
    report = ledger.report()
    assert report.duplicate_effects == {}
    rerun_steps = 0
    for run_id in ids:
        n = steps if isinstance(steps, int) else steps[run_id]
        rows = store.load_steps(run_id)
        assert [(r.session, r.seq) for r in rows] == [(0, i) for i in range(n)], run_id
        for row in rows:
            key = f"{run_id}:{row.session}:{row.seq}"
            assert row.epoch <= records[run_id].epoch
            if row.name.endswith("launch"):
                assert ledger.calls(key) <= 1, f"at_most_once step {key} ran twice"
                assert row.status in ("completed", "failed")
            else:
                assert row.status == "completed", (key, row.status)
                assert ledger.applied(key) == 1, f"effect {key} applied {ledger.applied(key)}x"
            rerun_steps += ledger.calls(key) > 1 or row.attempt > 1
        result = json.loads(records[run_id].output or "{}")
        assert result["paid"] == sum(i for i in range(n) if i % 10 != 9)
    ledger.close()
    return rerun_steps


# -- 1. SIGKILL chaos --------------------------------------------------------------------


def _chaos(
    c: PgCluster,
    monkeypatch: pytest.MonkeyPatch,
    *,
    runs: int,
    steps: int,
    workers: int,
    concurrency: int,
    kill_every_s: float,
    timeout_s: float,
    seed: int,
) -> None:
    rng = random.Random(seed)
    ids = c.submit(monkeypatch, "effects", steps, [f"chaos-{i}" for i in range(runs)])
    slots = {f"w{i}": 0 for i in range(workers)}  # slot -> generation

    def name(slot: str) -> str:
        return f"{slot}-{slots[slot]}"

    args = ("--concurrency", str(concurrency))
    for slot in slots:
        c.start(name(slot), *args)
    kills = 0
    held_when_killed: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while c.finished() < runs:
        assert time.monotonic() < deadline, f"runs still unfinished after {timeout_s}s\n{c.logs()}"
        time.sleep(kill_every_s * rng.uniform(0.5, 1.5))
        slot = rng.choice(sorted(slots))
        victim = name(slot)
        c.procs[victim].kill()
        c.procs[victim].wait()
        kills += 1
        # It is dead: any run still leased to it was mid-run when the SIGKILL landed.
        held_when_killed |= {
            r.id for r in c.store.list_runs(statuses=["running"], limit=runs) if r.owner == victim
        }
        slots[slot] += 1
        c.start(name(slot), *args)
    for slot in slots:  # the survivors drain and exit cleanly
        c.wait_started(name(slot))
        assert c.stop(name(slot)) == 0, c.log(name(slot))
    print(f"{kills} kills, {len(held_when_killed)} runs held by a killed worker")
    assert held_when_killed, f"none of {kills} kills landed mid-run: the test proved nothing"
    rerun_steps = check_effects(c, ids, steps)
    assert rerun_steps > 0, "no step was ever interrupted"
    for run_id in held_when_killed:  # taken over by another worker (a new epoch)
        assert c.store.get_run(run_id).epoch >= 2  # type: ignore[union-attr]
    for worker_id in c.procs:
        assert "Traceback" not in c.log(worker_id), c.log(worker_id)


def test_pg_sigkill_chaos_loses_nothing(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = make_cluster(lease_s=1.0, step_s=0.06)
    _chaos(
        c,
        monkeypatch,
        runs=30,
        steps=20,
        workers=4,
        concurrency=3,
        kill_every_s=0.8,
        timeout_s=90,
        seed=3,
    )


@pytest.mark.slow
def test_pg_sigkill_chaos_long(make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    c = make_cluster(lease_s=3.0, step_s=0.05)
    _chaos(
        c,
        monkeypatch,
        runs=200,
        steps=20,
        workers=4,
        concurrency=2,
        kill_every_s=2.0,
        timeout_s=1200,
        seed=17,
    )


# -- 2. the server restarts under the workers ----------------------------------------------


def _accepting() -> bool:
    import psycopg

    try:
        psycopg.connect(pg.admin_dsn(), connect_timeout=1).close()
    except psycopg.Error:
        return False
    return True


def _local_cluster() -> str:
    """The version of the local `main` cluster that serves the test DSN, or skip."""
    if shutil.which("pg_ctlcluster") is None:
        pytest.skip("pg_ctlcluster is not installed: cannot restart the PostgreSQL server")
    parts = urlsplit(pg.admin_dsn())
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        pytest.skip(f"{pg.DSN_VAR} names a remote server: this test restarts a local one")
    port = parts.port or 5432
    for conf in sorted(Path("/etc/postgresql").glob("*/main/postgresql.conf")):
        found = re.search(r"^\s*port\s*=\s*(\d+)", conf.read_text(), re.MULTILINE)
        if (int(found.group(1)) if found else 5432) == port:
            return conf.parent.parent.name
    pytest.skip(f"no cluster under /etc/postgresql/*/main serves port {port}")


def _pg_ctl(version: str, action: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _completed_steps(c: PgCluster) -> int:
    return sum(r.status == "completed" for r in c.store.iter_all_steps())


@pytest.mark.exclusive  # other xdist workers' tests must not see the server go down
@pytest.mark.parametrize("outage", ["restart", "down-past-the-lease"])
def test_pg_server_restart_mid_run_loses_nothing(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch, outage: str
) -> None:
    version = _local_cluster()
    lease_s = 1.0
    c = make_cluster(lease_s=lease_s, step_s=0.05)
    steps = 30
    ids = c.submit(monkeypatch, "effects", steps, [f"before-{i}" for i in range(6)])
    workers = ("a", "b")
    for w in workers:
        c.start(w, "--concurrency", "3")
    wait_for("the runs to progress", lambda: _completed_steps(c) >= 20, 30, c)
    try:
        down_at = time.monotonic()
        if outage == "restart":
            done = _pg_ctl(version, "restart")
        else:  # down until every lease has run out
            done = _pg_ctl(version, "stop")
            if done.returncode == 0:
                time.sleep(lease_s * 1.5)
                done = _pg_ctl(version, "start")
        if done.returncode != 0:
            pytest.skip(
                f"pg_ctlcluster {version} main ({outage}) failed with {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()}"
            )
        wait_for("PostgreSQL to accept connections again", _accepting, 60)
        down_s = time.monotonic() - down_at
    finally:
        if not _accepting():  # never leave the server down for the next test
            _pg_ctl(version, "start")
            wait_for("PostgreSQL to come back", _accepting, 60)
    c.reopen()  # the test's own pool lost its connections too
    at_restart = _completed_steps(c)
    ids += c.submit(monkeypatch, "effects", steps, [f"after-{i}" for i in range(2)])
    deadline = time.monotonic() + 120
    while c.finished() < len(ids):
        assert time.monotonic() < deadline, f"runs unfinished after the restart\n{c.logs()}"
        time.sleep(0.05)
    # The same two processes lived through the outage and finished everything (which
    # of them took which run after it is up to the claims, not something to assert).
    assert all(c.procs[w].poll() is None for w in workers), c.logs()
    assert _completed_steps(c) > at_restart
    for w in workers:
        assert c.stop(w) == 0, c.log(w)
    for w in workers:  # the outage did reach them (or the test proved nothing)
        assert "LISTEN connection lost" in c.log(w), c.log(w)
    assert outage == "restart" or down_s > lease_s
    check_effects(c, ids, steps)


# -- 3. a row lock and a long transaction held elsewhere ------------------------------------


def _status(c: PgCluster, run_id: str) -> str:
    run = c.store.get_run(run_id)
    assert run is not None
    return run.status


def test_pg_row_lock_held_elsewhere_does_not_stall_other_runs(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    c = make_cluster(lease_s=1.0, step_s=0.01)
    steps = 10
    ids = c.submit(monkeypatch, "effects", steps, [f"lock-{i}" for i in range(9)])
    locked, others = ids[0], ids[1:]  # the oldest: the first a claim would take
    holder = psycopg.connect(c.dsn)  # not autocommit: the transaction stays open
    reader = psycopg.connect(c.dsn)
    reader.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        holder.execute("SELECT id FROM ms_runs WHERE id = %s FOR UPDATE", (locked,))
        reader.execute("SELECT count(*) FROM ms_runs").fetchone()  # an old snapshot, kept
        reader.execute("SELECT count(*) FROM ms_steps").fetchone()
        c.start("w", "--concurrency", "4")
        wait_for(
            "the runs nobody locked to succeed",
            lambda: all(_status(c, r) == "succeeded" for r in others),
            30,
            c,
        )
        assert _status(c, locked) == "queued"  # skipped, not waited for
    finally:
        holder.rollback()
        holder.close()
        reader.rollback()
        reader.close()
    wait_for(
        "the locked run to succeed once released", lambda: _status(c, locked) == "succeeded", 30
    )
    assert c.stop("w") == 0, c.log("w")
    check_effects(c, ids, steps)


def test_pg_row_lock_on_a_running_run_does_not_stall_the_workers_other_runs(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction elsewhere locks the row of a run a worker is executing: that run
    must wait for it, but the worker's other runs must not."""
    import psycopg

    c = make_cluster(lease_s=1.0, step_s=0.01)
    [locked] = c.submit(monkeypatch, "effects", 200, ["held"])
    steps = {locked: 200}
    c.start("w", "--concurrency", "4")
    wait_for(
        "the run to be under way",
        lambda: sum(r.status == "completed" for r in c.store.load_steps(locked)) >= 3,
        30,
        c,
    )
    holder = psycopg.connect(c.dsn)
    try:
        holder.execute("SELECT id FROM ms_runs WHERE id = %s FOR UPDATE", (locked,))
        others = c.submit(monkeypatch, "effects", 10, [f"free-{i}" for i in range(6)])
        steps |= dict.fromkeys(others, 10)
        wait_for(
            "the runs nobody locked to succeed while one run's row is locked",
            lambda: all(_status(c, r) == "succeeded" for r in others),
            15,
            c,
        )
    finally:
        holder.rollback()
        holder.close()
    wait_for(
        "the locked run to succeed once released", lambda: _status(c, locked) == "succeeded", 60
    )
    assert c.stop("w") == 0, c.log("w")
    check_effects(c, [locked, *others], steps)


# -- 4. a wrong DSN ----------------------------------------------------------------------------

PASSWORD = "s3cret-pw"
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")


def _with_password(dsn: str, **changes: str) -> str:
    """``dsn`` with PASSWORD in it (trust auth ignores it) and other parts changed."""
    parts = urlsplit(dsn)
    host = changes.get("host", f"{parts.hostname}:{parts.port or 5432}")
    netloc = f"{parts.username or 'postgres'}:{PASSWORD}@{host}"
    return urlunsplit(
        parts._replace(
            scheme=changes.get("scheme", parts.scheme),
            netloc=netloc,
            path="/" + changes.get("db", parts.path.lstrip("/")),
        )
    )


def _bad_url(dsn: str, case: str) -> tuple[str, list[str]]:
    """A URL that cannot work (``dsn`` is a good one), and what its error must name."""
    if case == "bad-port":
        return _with_password(dsn, host="127.0.0.1:1", db="postgres"), [
            "127.0.0.1:1/postgres",
            "refused",
        ]
    if case == "unknown-host":
        return _with_password(dsn, host="no-such-host.invalid:5432", db="postgres"), [
            "no-such-host.invalid",
            "/postgres",
        ]
    if case == "missing-database":
        missing = f"{urlsplit(dsn).path.lstrip('/')}_missing"
        return _with_password(dsn, db=missing), [missing, "does not exist"]
    assert case == "wrong-scheme"  # SQLAlchemy's spelling, a likely mistake
    return _with_password(dsn, scheme="postgresql+psycopg"), [
        urlsplit(dsn).path.lstrip("/"),
        "postgresql+psycopg",
    ]


def _run_worker(url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "MAINSPRING_DATABASE_URL": url,
        "MAINSPRING_TEST_LEDGER": str(tmp_path / "ledger.db"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(WORKER, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("case", ["bad-port", "unknown-host", "missing-database"])
def test_pg_worker_with_a_wrong_url_exits_with_one_clear_line(
    pg_db: str, tmp_path: Path, case: str
) -> None:
    url, names = _bad_url(pg_db, case)
    done = _run_worker(url, tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output, output
    # Besides log records, exactly one line: the error, naming what is wrong.
    lines = [line for line in output.splitlines() if line.strip() and not LOG_RECORD.match(line)]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: "), output
    assert PASSWORD not in lines[0], output
    for name in names:
        assert name in lines[0], (name, output)


def test_pg_worker_with_a_wrong_url_never_prints_the_password(pg_db: str, tmp_path: Path) -> None:
    url, _ = _bad_url(pg_db, "missing-database")
    done = _run_worker(url, tmp_path)
    assert done.returncode != 0
    assert PASSWORD not in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize("case", ["bad-port", "unknown-host", "missing-database", "wrong-scheme"])
def test_pg_app_store_with_a_wrong_url_raises_config_error(pg_db: str, case: str) -> None:
    url, names = _bad_url(pg_db, case)
    app = ms.App(url)
    with pytest.raises(ms.ConfigError) as caught:
        _ = app.store
    message = str(caught.value)
    assert PASSWORD not in message, message
    for name in names:
        assert name in message, (name, message)
    assert not caught.value.retryable


def test_pg_errors_about_a_good_url_hide_its_password(pg_db: str) -> None:
    app = ms.App(_with_password(pg_db))
    try:
        assert app.store.list_runs() == []  # the URL works: trust auth ignores the password
        with pytest.raises(ms.RunNotFound) as caught:
            app.get_run("no-such-run")
        assert PASSWORD not in str(caught.value), str(caught.value)
        assert PASSWORD not in app.store.url
    finally:
        app.close()
