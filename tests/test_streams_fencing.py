"""Token streams held to the journal's bar, with real processes and a real server: a
worker frozen past its lease writes nothing more to the stream once another has taken
the run over, and a reader following it ends with the journaled reply; on PostgreSQL,
a reader never steps over a row that commits after a row with a higher id."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _stack import until

import mainspring as ms
from mainspring.storage import Store, TokenChunk, TokenPiece
from mainspring.testing import assert_invariants

ROOT = Path(__file__).resolve().parent
LEASE_S = 1.0


def assemble(events: list[ms.TokenEvent]) -> dict[tuple[int, int], str]:
    """The text of each model step as docs/streaming.md says to assemble it: the
    attempt shown last, dropped when it ends interrupted."""
    shown: dict[tuple[int, int], tuple[tuple[int, int], list[str]]] = {}
    for e in events:
        key, version = (e.session, e.seq), (e.epoch, e.attempt)
        if key not in shown or shown[key][0] != version:
            shown[key] = (version, [])
        if e.end == "interrupted":
            shown[key] = (version, [])
        elif e.kind == "text":
            shown[key][1].append(e.text)
    return {key: "".join(text) for key, (_, text) in shown.items()}


class Workers:
    """`mainspring worker apps.stream_app:app` processes on one database."""

    def __init__(self, tmp: Path, db_url: str) -> None:
        self.tmp = tmp
        self.env = {
            **os.environ,
            "MAINSPRING_DATABASE_URL": db_url,
            "MAINSPRING_TEST_LEASE_S": str(LEASE_S),
            "MAINSPRING_TEST_PACE_S": "0.05",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"worker-{len(self.procs)}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mainspring", "worker", "apps.stream_app:app"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.tmp / f"worker-{self.procs.index(proc)}.log").read_text()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(10)


@pytest.fixture
def workers(tmp_path: Path, db_url: str) -> Iterator[Workers]:
    w = Workers(tmp_path, db_url)
    yield w
    w.stop_all()


def test_a_worker_frozen_past_its_lease_writes_nothing_more_to_the_stream(
    workers: Workers, db_url: str
) -> None:
    app = ms.App(db_url)  # the test's own, as a server's would be: submits and reads

    @app.workflow(name="answer")
    async def answer(ctx: ms.RunContext, question: str) -> str:
        raise AssertionError("only the workers of apps/stream_app.py run it")

    try:
        run_id = app.submit(answer, "What is mainspring?").run_id
        stale = workers.start()
        # Mid-stream (a few batches of the 160 characters written), freeze it.
        until(lambda: len(app.store.tokens_after(run_id)) >= 3, "the first worker to stream")
        stale.send_signal(signal.SIGSTOP)
        frozen = app.store.tokens_after(run_id)
        assert frozen[-1].end is None, "the stream ended before the freeze: nothing to test"
        old = frozen[0].epoch
        time.sleep(LEASE_S + 0.5)  # its lease runs out while it is frozen
        fresh = workers.start()
        until(
            lambda: any(r.epoch > old for r in app.store.tokens_after(run_id)),
            "the second worker to take the run over and stream",
        )
        stale.send_signal(signal.SIGCONT)  # it wakes up believing it still owns the run

        def done() -> bool:
            return app.get_run(run_id).finished

        until(done, "the run to finish", timeout=60)
        for proc in (stale, fresh):
            proc.send_signal(signal.SIGTERM)
        assert stale.wait(20) == 0 and fresh.wait(20) == 0
        assert app.get_run(run_id).status == "succeeded"

        # Nothing of the stale worker's dead attempt follows the first row of the new
        # owner's: it went on streaming and was refused at the fence.
        rows = app.store.tokens_after(run_id, limit=10_000)
        first_new = min(r.pos for r in rows if r.epoch > old)
        late = [(r.pos, r.epoch, r.text) for r in rows if r.pos > first_new and r.epoch <= old]
        assert late == []
        assert "no longer running at epoch" in workers.log(stale), workers.log(stale)
        # A reader following the docs ends with exactly the journaled reply.
        follower = app.follow_tokens(run_id)
        events = follower.poll() + follower.close_open()
        [step] = [s for s in app.observe.steps(run_id) if s.role == "model"]
        assert step.attempt == 2
        text = assemble(events)[(step.session, step.seq)]
        assert text == json.loads(step.output or "{}")["text"]
        assert text == json.loads(app.get_run(run_id).output or "null") and len(text) == 160
        ends = [(e.epoch > old, e.end, e.reason) for e in events if e.end]
        assert ends == [(False, "interrupted", "abandoned"), (True, "done", None)]
        assert_invariants(app.store, run_ids=[run_id])  # stream_mismatch among them
    finally:
        app.close()


# -- PostgreSQL: a row that commits late is never stepped over --------------------------


_SLOW_COMMIT = """
CREATE OR REPLACE FUNCTION ms_test_slow_commit() RETURNS trigger AS $$
BEGIN
    IF NEW.text LIKE 'slow%' THEN PERFORM pg_sleep(0.02); END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER ms_test_slow_commit AFTER INSERT ON ms_stream_chunks
    FOR EACH ROW EXECUTE FUNCTION ms_test_slow_commit();
"""


def _race(db_url: str, rounds: int) -> None:
    """Two writers of one run (two model calls at once, or a frozen worker and its
    successor): one whose rows take 20 ms between INSERT and COMMIT (a trigger sleeps),
    one whose rows commit at once, started just after it, with a reader paging as
    fast as it can. Paging by id, the reader sees the fast row (a higher id) before the
    slow one commits, moves past it, and never sees the slow row."""
    psycopg = pytest.importorskip("psycopg")
    from mainspring.storage.postgres import PostgresStore

    stores = [PostgresStore(db_url) for _ in range(3)]
    slow, fast, reader = stores
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(_SLOW_COMMIT)
        slow.create_run(run_id="r", workflow="wf", input="{}", key=None, now=1.0)
        [run] = slow.claim(
            worker="w", now=1.0, lease_s=3600, limit=1, workflows=["wf"], max_recoveries=3
        )
        read: list[TokenChunk] = []
        stop = threading.Event()
        failed: list[BaseException] = []

        def follow() -> None:
            cursor = 0
            try:
                while True:
                    last = stop.is_set()  # before the read: it sees every commit
                    rows = reader.tokens_after("r", cursor)
                    read.extend(rows)
                    cursor = rows[-1].pos if rows else cursor
                    if last and not rows:
                        return
            except BaseException as exc:
                failed.append(exc)

        def append(store: Store, seq: int, idx: int, text: str) -> None:
            try:
                assert store.append_tokens(
                    "r",
                    epoch=run.epoch,
                    session=0,
                    seq=seq,
                    attempt=1,
                    idx=idx,
                    pieces=[TokenPiece(text=text)],
                    now=1.0,
                )
            except BaseException as exc:
                failed.append(exc)

        follower = threading.Thread(target=follow)
        follower.start()
        for i in range(rounds):
            writers = [threading.Thread(target=append, args=(slow, 0, i, f"slow {i}"))]
            writers.append(threading.Thread(target=append, args=(fast, 1, i, f"fast {i}")))
            writers[0].start()
            time.sleep(0.005)  # the slow row takes its id first
            writers[1].start()
            for w in writers:
                w.join(30)
        stop.set()
        follower.join(60)
        assert not failed, failed
        got = sorted((r.seq, r.idx) for r in read)
        missing = sorted({(s, i) for s in (0, 1) for i in range(rounds)} - set(got))
        assert missing == [] and len(got) == 2 * rounds, f"rows never read: {missing}"
        assert [r.pos for r in read] == list(range(1, 2 * rounds + 1))
    finally:
        for store in stores:
            store.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_reader_never_steps_over_a_row_that_commits_late(db_url: str) -> None:
    _race(db_url, rounds=25)


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_reader_never_steps_over_a_row_that_commits_late_long(db_url: str) -> None:
    _race(db_url, rounds=600)
