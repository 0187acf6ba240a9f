"""A rolling deploy: old-code and new-code workers on one database, the new code with
a ``ctx.patched`` branch. A worker whose code cannot replay a run (the new code took
the patch; an old worker claims it) leaves the run for one whose code can: no run is
failed for it. Real worker processes, both stores; with code versions declared on both
fleets too, for runs submitted before versions existed (both fleets claim those)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _stack import until
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.storage import Store, open_store
from mainspring.testing import FakeClock

ROOT = Path(__file__).resolve().parent


class Fleets:
    """`mainspring worker apps.deploy_old:app` and `apps.deploy_new:app` processes."""

    def __init__(self, tmp: Path, db_url: str, version: bool) -> None:
        self.tmp = tmp
        self.version = version
        self.env = {
            **os.environ,
            "MAINSPRING_DATABASE_URL": db_url,
            "MAINSPRING_TEST_PAUSE_S": "1.0",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, code: str) -> subprocess.Popen[bytes]:
        env = {**self.env, "MAINSPRING_TEST_VERSION": code.upper() if self.version else ""}
        with open(self.tmp / f"{code}-{len(self.procs)}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mainspring", "worker", f"apps.deploy_{code}:app"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append((code, proc))
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)

    def refusals(self, code: str) -> int:
        return sum(
            (self.tmp / f"{c}-{i}.log").read_text().count("event=refused")
            for i, (c, _) in enumerate(self.procs)
            if c == code
        )

    def close(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def fleets(tmp_path: Path, db_url: str, request: pytest.FixtureRequest) -> Iterator[Fleets]:
    f = Fleets(tmp_path, db_url, version=request.param)
    yield f
    f.close()


@pytest.fixture
def submit(db_url: str) -> Iterator[Callable[[int], str]]:
    """Submit an ``order`` run with no code version (as before versions existed)."""
    app = ms.App(db_url)

    @app.workflow(name="order")
    async def order(ctx: ms.RunContext, i: int) -> list[str]:  # executed by the fleets
        raise NotImplementedError

    yield lambda i: app.submit("order", i).run_id
    app.close()


def _kinds(store: Store, run_id: str) -> list[str]:
    return [s.kind for s in store.load_steps(run_id)]


# Versions declared on both fleets (runs submitted with none: both claim them) take the
# same path: under -m slow.
@pytest.mark.parametrize(
    "fleets",
    [False, pytest.param(True, marks=pytest.mark.slow)],
    ids=["unversioned", "versioned"],
    indirect=True,
)
def test_a_rolling_deploy_that_adds_a_patch_fails_no_run(
    fleets: Fleets, submit: Callable[[int], str], db_url: str
) -> None:
    store = open_store(db_url)
    try:
        # New code first: every run takes the patch (a marker, then check_stock).
        runs = [submit(i) for i in range(12)]
        new = fleets.start("new")
        until(lambda: all("patch" in _kinds(store, r) for r in runs), "the patch taken", 60)
        fleets.stop(new)
        # Old code alone: it meets the new step in every one of them, and leaves it.
        old = fleets.start("old")
        until(lambda: all(_met_by_old(store, r) for r in runs), "old code meeting them", 60)
        failed = [r for r in runs if store.get_run(r).status == "failed"]  # type: ignore[union-attr]
        print(f"old code alone: {len(failed)} of {len(runs)} runs failed")
        assert failed == []
        # Both fleets side by side (the deploy rolling on), and more runs meanwhile.
        fleets.start("new")
        more = [submit(i) for i in range(12, 24)]
        done = until(
            lambda: all(_finished(store, r) for r in runs + more) or None, "every run done", 90
        )
        assert done
        records = [store.get_run(r) for r in runs + more]
        failed = [(r.id, _message(r.error)) for r in records if r and r.status != "succeeded"]
        print(
            f"runs failed: {len(failed)} of {len(records)}; refusals: old code "
            f"{fleets.refusals('old')}, new code {fleets.refusals('new')}"
        )
        assert failed == []
        for r in runs:  # the runs that took the patch kept it
            assert json.loads(store.get_run(r).output or "[]")[1].startswith("in stock")  # type: ignore[union-attr]
        assert old.poll() is None  # refusing runs never stopped the old worker
    finally:
        store.close()


def _met_by_old(store: Store, run_id: str) -> bool:
    """The old code met the run: it left it (refused) or failed it (before the fix)."""
    record = store.get_run(run_id)
    assert record is not None
    return record.status == "failed" or "refused" in json.loads(record.error or "{}")


def _finished(store: Store, run_id: str) -> bool:
    record = store.get_run(run_id)
    return record is not None and record.finished


def _message(error: str | None) -> Any:
    return (json.loads(error) if error else {}).get("message")


# -- a run no worker can replay: skipped, then parked where an operator sees it ----------

NOW = 1_767_225_600.0


def a() -> str:
    return "a"


def b() -> str:
    return "b"


def _two_codes(db_url: str, clock: FakeClock) -> tuple[ms.App, ms.App]:
    """The code that wrote the journal (``v1``: step a, wait for "go") and code that
    cannot replay it (``v2``: step b where the journal has a)."""
    v1 = ms.App(db_url, clock=clock, poll_interval_s=0.01)
    v2 = ms.App(db_url, clock=clock, poll_interval_s=0.01)

    @v1.workflow(name="flow")
    async def flow_v1(ctx: ms.RunContext) -> str:
        return await ctx.step(a, name="a") + str(await ctx.wait_for("go"))

    @v2.workflow(name="flow")
    async def flow_v2(ctx: ms.RunContext) -> str:
        return await ctx.step(b, name="b") + str(await ctx.wait_for("go"))

    return v1, v2


async def test_a_run_no_worker_can_replay_is_skipped_then_parked_never_failed(
    db_url: str,
) -> None:
    clock = FakeClock(NOW)
    v1, v2 = _two_codes(db_url, clock)
    try:
        run_id = v1.submit("flow").run_id
        await v1.worker().run(until_idle=True)  # step a, then waits for "go"
        v2.signal(run_id, "go", 1)
        worker = v2.worker(refused_skip_s=300)
        await worker.run(until_idle=True)
        record = v2.get_run(run_id)
        assert (record.status, record.wait_reason, record.wake_at) == ("sleeping", "replay", 0.0)
        assert _refused(record)["count"] == 1
        await worker.run(until_idle=True)  # due for everyone, but this worker keeps away
        assert _refused(v2.get_run(run_id))["count"] == 1
        assert worker.stats.claimed == 1
        clock.advance(301)
        await worker.run(until_idle=True)  # tried again once its skip is over
        assert _refused(v2.get_run(run_id))["count"] == 2
        clock.advance(301)  # ten minutes of refusals and nobody could: parked
        await worker.run(until_idle=True)
        record = v2.get_run(run_id)
        assert (record.status, record.wait_reason) == ("waiting", "replay")
        assert record.wake_at == pytest.approx(clock.now() + 600)
        refused = _refused(record)
        assert (refused["count"], refused["parked"], refused["worker"]) == (
            3,
            True,
            worker.worker_id,
        )
        assert worker.stats.outcomes == {"refused": 3}
        # Seen where an operator looks: metrics, show, doctor.
        text = v2.observe.metrics().render()[0].decode()
        assert 'mainspring_runs_waiting{reason="replay"} 1.0' in text
        assert 'mainspring_replays_refused_total{workflow="flow"} 3.0' in text
        shown = CliRunner().invoke(cli, ["show", run_id, "--db", db_url])
        assert "left for a worker whose code can replay it: refused 3 time(s)" in shown.output
        assert "parked" in shown.output and "'a'" in shown.output
        [finding] = [f for f in v2.observe.diagnose(run_id).findings if f.kind == "nondeterminism"]
        assert "now parked" in finding.evidence[1]
        # The code that wrote the journal comes back: it finishes the run at its retry.
        clock.advance(600 + 1)
        await v1.worker().run(until_idle=True)
        assert await v1.result(run_id) == "a1"
    finally:
        v1.close()
        v2.close()


async def test_app_run_says_its_code_cannot_replay_the_run_and_leaves_it(db_url: str) -> None:
    clock = FakeClock(NOW)
    v1, v2 = _two_codes(db_url, clock)
    try:
        with pytest.raises(ms.RunWaiting) as waiting:
            await v1.run("flow", key="k")
        v2.signal(waiting.value.run_id or "", "go", 2)
        with pytest.raises(ms.NondeterminismError, match="left unfinished for a worker"):
            await v2.run("flow", key="k")
        assert await v1.run("flow", key="k") == "a2"  # nothing failed: v1 still can
    finally:
        v1.close()
        v2.close()


def test_refuse_is_fenced_and_a_cancel_wins(db_url: str) -> None:
    app = ms.App(db_url)

    @app.workflow
    async def wf(ctx: ms.RunContext) -> None:
        return None

    store = app.store
    try:
        run_id = app.submit(wf).run_id
        [claimed] = store.claim(
            worker="w", now=NOW, lease_s=5, limit=1, workflows=None, max_recoveries=3
        )
        args: dict[str, Any] = {
            "error": '{"type": "x.NondeterminismError", "message": "m"}',
            "at": "0:3",
            "worker": "w",
            "park_after_s": 600,
            "retry_s": 600,
        }
        assert store.refuse(run_id, claimed.epoch + 1, NOW, **args) is None  # not its holder
        app.cancel(run_id)
        assert store.refuse(run_id, claimed.epoch, NOW, **args) == "sleeping"
        record = app.get_run(run_id)
        assert (record.wake_at, record.cancel_requested) == (0.0, True)
        assert "refused" not in json.loads(record.error or "{}")  # the cancel's reason stays
        # Skipped by the worker that refused it, claimed by any other.
        assert store.claim(
            worker="w", now=NOW, lease_s=5, limit=5, workflows=None, max_recoveries=3,
            skip=[run_id],
        ) == []  # fmt: skip
        assert store.next_wake(skip=[run_id]) is None
        [again] = store.claim(
            worker="v", now=NOW, lease_s=5, limit=5, workflows=None, max_recoveries=3
        )
        assert (again.id, again.recoveries) == (run_id, 0)  # no recovery counted
    finally:
        app.close()


def _refused(record: ms.RunRecord) -> dict[str, Any]:
    error = json.loads(record.error or "{}")
    assert error["type"] == "mainspring._errors.NondeterminismError"
    refused: dict[str, Any] = error["refused"]
    return refused
