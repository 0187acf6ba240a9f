"""SQLite's write-ahead log under a reader that stays open (an operator's ``sqlite3``
shell holding a read transaction): SQLite cannot checkpoint past its snapshot, so the
``-wal`` file grows with every commit. It is seen (worker log, ``mainspring db
status``, ``mainspring_store_wal_bytes``), and bounded once the reader has gone: the
next checkpoint truncates it to ``journal_size_limit``, and a worker that finds it
past the limit truncates it at once. A real second connection holds the reader."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.storage import SQLiteStore

# The test's journal_size_limit: above what the log reaches in steady use (SQLite's
# automatic checkpoint runs at 1,000 pages, 8 MiB), as the default (64 MiB) is.
LIMIT = 12 << 20


def blob(i: int) -> str:
    return f"{i:06d}" + "x" * 40_000  # a step's output: five pages of the log


@pytest.fixture
def app(tmp_path: Path) -> Iterator[ms.App]:
    store = SQLiteStore(tmp_path / "wal.db", wal_limit_bytes=LIMIT, synchronous="NORMAL")
    application = ms.App(store, redact=None)  # (scanning 40 KB outputs for secrets is slow)

    @application.workflow
    async def fill(ctx: ms.RunContext, n: int) -> int:
        for i in range(n):
            await ctx.step(blob, i)
        return n

    yield application
    application.close()


def _reader(path: str) -> sqlite3.Connection:
    """An operator's shell: a read transaction that stays open (its snapshot pins the log)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("SELECT count(*) FROM ms_runs").fetchall()
    return conn


async def test_a_reader_left_open_grows_the_log_which_is_seen_and_bounded_once_it_ends(
    app: ms.App, caplog: pytest.LogCaptureFixture
) -> None:
    store = app.store
    assert isinstance(store, SQLiteStore)
    await app.run("fill", 300)  # the log in steady use
    usual, limit = store.wal_size()
    assert limit == LIMIT and usual <= LIMIT
    reader = _reader(store.path)
    await app.run("fill", 1000)  # every commit appends: nothing can be checkpointed
    grown, _ = store.wal_size()
    assert grown > 3 * LIMIT
    # Seen where an operator looks: the worker's log, db status, the gauge.
    worker = app.worker()
    worker.wal.every_s = 0.0
    with caplog.at_level(logging.WARNING, logger="mainspring.worker"):
        await worker.run(until_idle=True)
    [warning] = [
        r.getMessage()
        for r in caplog.records
        if f"event=wal_large worker={worker.worker_id}" in r.getMessage()
    ]
    assert "read transaction" in warning and "limit_mb=12.6" in warning
    status = CliRunner().invoke(cli, ["db", "status", "--db", store.url])
    assert "past its limit, a read transaction left open" in status.output
    text = app.observe.metrics().render()[0].decode()
    [gauge] = [line for line in text.splitlines() if line.startswith("mainspring_store_wal_bytes")]
    assert float(gauge.split()[-1]) >= grown
    # The reader ends; the next checkpoint lets the log start over, at the limit
    # (journal_size_limit; these submits are commits with no worker to look).
    reader.execute("COMMIT")
    reader.close()
    for _ in range(5):
        app.submit("fill", 0)
    after, _ = store.wal_size()
    mb = [f"{n / 1e6:.2f}" for n in (usual, grown, after)]
    print(f"WAL (MB): usual {mb[0]}, with the reader {mb[1]}, once it ended {mb[2]}")
    assert after <= LIMIT


async def test_a_worker_truncates_a_grown_log_once_nothing_holds_it(
    app: ms.App, caplog: pytest.LogCaptureFixture
) -> None:
    store = app.store
    assert isinstance(store, SQLiteStore)
    reader = _reader(store.path)
    await app.run("fill", 1000)
    assert store.wal_size()[0] > 3 * LIMIT
    assert store.checkpoint()[0] > 3 * LIMIT  # held: nothing lost, nothing truncated
    reader.execute("COMMIT")
    reader.close()
    # Nothing written since: the log keeps its size until a worker looks at it.
    assert store.wal_size()[0] > 3 * LIMIT
    worker = app.worker()
    worker.wal.every_s = 0.0
    with caplog.at_level(logging.INFO, logger="mainspring.worker"):
        await worker.run(until_idle=True)
    assert store.wal_size()[0] == 0
    assert any("event=wal_truncated" in r.getMessage() for r in caplog.records)
    assert await app.result(app.list_runs()[0].id) == 1000  # nothing was lost


def test_db_checkpoint_truncates_the_log_or_says_who_holds_it(app: ms.App) -> None:
    store = app.store
    assert isinstance(store, SQLiteStore)
    import asyncio

    reader = _reader(store.path)
    asyncio.run(app.run("fill", 400))
    runner = CliRunner()
    held = runner.invoke(cli, ["db", "checkpoint", "--db", f"{store.url}?busy_timeout_ms=100"])
    assert held.exit_code == 1 and "a read transaction still uses it" in held.output
    reader.execute("COMMIT")
    reader.close()
    done = runner.invoke(cli, ["db", "checkpoint", "--db", store.url, "--json"])
    assert done.exit_code == 0, done.output
    assert '"wal_bytes": 0' in done.output
    assert store.wal_size()[0] == 0


def test_the_wal_limit_is_an_option_of_the_url(tmp_path: Path) -> None:
    store = SQLiteStore.from_url(f"sqlite:///{tmp_path / 'o.db'}?wal_limit_mb=16")
    try:
        assert store.wal_size() == (store.wal_size()[0], 16 << 20)
        conn = store._conn()
        assert conn.execute("PRAGMA journal_size_limit").fetchone()[0] == 16 << 20
    finally:
        store.close()
    with pytest.raises(ms.ConfigError, match="wal_limit_mb must be an integer"):
        SQLiteStore.from_url(f"sqlite:///{tmp_path / 'p.db'}?wal_limit_mb=lots")
