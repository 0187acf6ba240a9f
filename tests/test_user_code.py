"""Hostile user code and engine failures (issue 12, items 3, 4, 9, 11, 15, 17).

User code can raise anything; only mainspring's own control flow passes through a
step. Engine failures are not the workflow's to catch. Concurrent waits wake on any
of their names and at the earliest deadline. A finished run's leftover tasks are
stopped before its outcome is committed. Rendering an error never fails.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from _helpers import drain

import mainspring as ms
from mainspring.storage import RunTransition, RunWrite, SQLiteStore, WriteResult, open_store
from mainspring.storage._records import join_wait_signals

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def clock() -> ms.FakeClock:
    return ms.FakeClock()


@pytest.fixture
def fapp(db_url: str, clock: ms.FakeClock) -> ms.App:
    return ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0)


def error_of(app: ms.App, run_id: str) -> dict[str, Any]:
    record = app.get_run(run_id)
    return dict(json.loads(record.error or "{}"))


# -- item 3: BaseException from user code -------------------------------------------------


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt", "CancelledError"])
async def test_a_step_raising_a_base_exception_is_a_failed_attempt(app: ms.App, kind: str):
    attempts: list[int] = []

    async def hostile() -> str:
        attempts.append(ms.current_step().attempt)
        if len(attempts) == 1:
            if kind == "SystemExit":
                sys.exit(2)  # argparse or click inside a tool does this
            if kind == "KeyboardInterrupt":
                raise KeyboardInterrupt
            raise asyncio.CancelledError  # nobody cancelled this task
        return "done"

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        return await ctx.step(hostile, retry=ms.RetryPolicy(initial_s=0, max_attempts=2))

    assert await app.run(wf) == "done"
    assert attempts == [1, 2]
    [row] = app.observe.steps(app.list_runs()[0].id)
    assert row.status == "completed" and row.attempt == 2
    assert kind in json.loads(row.error or "{}")["type"]  # why attempt 1 failed


async def test_a_step_that_exits_for_good_fails_the_step_not_the_worker(app: ms.App):
    def cli_tool() -> None:
        sys.exit("usage: tool [-h]")

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        try:
            await ctx.step(cli_tool, retry=ms.RetryPolicy.never())
        except ms.StepFailed as exc:
            return f"{exc.error_type}: {exc.message}"
        return "no"

    result = await app.run(wf)
    assert result.startswith("builtins.SystemExit: step ")
    assert "usage: tool [-h]" in result


@pytest.mark.parametrize("where", ["workflow", "its own task"])
@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt"])
async def test_workflow_code_raising_a_base_exception_fails_the_run(
    app: ms.App, kind: str, where: str
):
    async def hostile() -> None:
        await pause()
        if kind == "SystemExit":
            sys.exit(3)
        raise KeyboardInterrupt

    async def pause() -> None:
        await asyncio.sleep(0)

    @app.workflow
    async def wf(ctx: ms.RunContext) -> None:
        await ctx.step(lambda: 1, name="first")
        if where == "workflow":
            await hostile()
        else:  # asyncio re-raises these out of the event loop when they end a task
            await asyncio.gather(hostile(), ctx.step(lambda: 2, name="second"))

    with pytest.raises(ms.RunFailed) as info:
        await app.run(wf)
    assert info.value.status == "failed"
    assert info.value.error["type"] == f"builtins.{kind}"


async def test_a_cancellation_nobody_asked_for_is_never_committed_as_a_cancel(
    fapp: ms.App, clock: ms.FakeClock
):
    executions: list[int] = []

    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> str:
        await ctx.step(lambda: 1, name="first")
        executions.append(1)
        if len(executions) == 1:
            raise asyncio.CancelledError  # e.g. awaiting a task that something cancelled
        return "ok"

    handle = fapp.submit(wf)
    await drain(fapp)
    record = fapp.get_run(handle.run_id)
    assert record.status == "running"  # left to recovery, not `cancelled` for good
    clock.advance(fapp.lease_s + 1)
    await drain(fapp)
    assert fapp.get_run(handle.run_id).status == "succeeded"
    assert await handle.result() == "ok"


def until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def test_sys_exit_in_one_run_leaves_the_worker_and_its_other_runs_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("MAINSPRING_DATABASE_URL", f"sqlite:///{tmp_path / 'hostile.db'}")
    monkeypatch.setenv("MAINSPRING_TEST_GATE", str(gate))
    monkeypatch.syspath_prepend(str(TESTS))
    import apps.hostile_app

    app = importlib.reload(apps.hostile_app).app
    patient = [app.submit("patient", i).run_id for i in range(4)]
    quitter = app.submit("quitter", len(patient)).run_id
    app.close()
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "mainspring", "worker", "apps.hostile_app:app"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    store = SQLiteStore(tmp_path / "hostile.db")
    try:

        def status(run_id: str) -> str:
            record = store.get_run(run_id)
            assert record is not None
            return record.status

        # Every patient run holds its step while the quitter's step calls sys.exit, twice.
        until(
            lambda: worker.poll() is not None or status(quitter) in ("failed", "cancelled"),
            "the quitter ends",
        )
        assert worker.poll() is None, log.read_text()
        assert [status(r) for r in patient] == ["running"] * len(patient)
        (gate / "open").touch()
        until(lambda: all(status(r) != "running" for r in patient), "the patient runs end")
        assert [status(r) for r in patient] == ["succeeded"] * len(patient)
        assert worker.poll() is None, log.read_text()
        record = store.get_run(quitter)
        assert record is not None and record.status == "failed"
        error = json.loads(record.error or "{}")
        assert error["type"] == "mainspring._errors.StepFailed"
        assert "failed after 2 attempt(s): SystemExit: 2" in error["message"]
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        store.close()


# -- item 4: engine failures are not catchable by `except Exception` ------------------------


def flaky_commits(store: ms.Store, *, fail: int, how: str) -> None:
    """Make the next ``fail`` commits of the intent of step ``charge`` fail: the
    database unavailable, or the fence refusing them (a lease lost)."""
    real = store.commit
    failed = [0]

    def commit(batch: Sequence[RunWrite], now: float) -> list[WriteResult]:
        rows = [r for w in batch for r in w.steps]
        if failed[0] < fail and any(r.name == "charge" and r.status == "started" for r in rows):
            failed[0] += 1
            if how == "outage":
                raise ms.StoreUnavailable("database is locked (injected)")
            return [WriteResult(ok=False) for _ in batch]
        return real(batch, now)

    store.commit = commit  # type: ignore[method-assign]


@pytest.mark.parametrize("how", ["outage", "lease"])
@pytest.mark.parametrize("catch", ["Exception", "BaseException"])
async def test_engine_failures_do_not_reach_except_exception(
    db_url: str, how: str, catch: str
) -> None:
    store = open_store(db_url)
    app = ms.App(store, lease_s=0.6, poll_interval_s=0.02)
    charged: list[str] = []

    def charge() -> str:
        charged.append(ms.current_step().idempotency_key)
        return "charged"

    caught = Exception if catch == "Exception" else BaseException

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        try:
            return await ctx.step(charge, name="charge")
        except caught:
            return "took the failure branch"

    # Every attempt of the intent commit fails (the store stays down past the retries),
    # or the fence refuses it once.
    attempts = 6 if how == "outage" else 1
    flaky_commits(store, fail=attempts, how=how)
    assert await asyncio.wait_for(app.run(wf), 60) == "charged"
    assert len(charged) == 1
    app.close()


async def test_nondeterminism_stops_the_run_even_if_the_workflow_catches_it(
    fapp: ms.App,
) -> None:
    version = {"name": "a"}

    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> str:
        try:
            await ctx.step(lambda: 1, name=version["name"])
        except Exception:
            return "swallowed"
        await ctx.wait_for("go")
        return "done"

    handle = fapp.submit(wf)
    await drain(fapp)
    version["name"] = "b"  # the code changed under the waiting run
    fapp.signal(handle.run_id, "go")
    await drain(fapp)
    record = fapp.get_run(handle.run_id)
    # Not "swallowed": the run is left for a worker whose code can replay it.
    assert (record.status, record.wait_reason, record.output) == ("sleeping", "replay", None)
    assert error_of(fapp, handle.run_id)["type"] == "mainspring._errors.NondeterminismError"


# -- item 9: an at_most_once step that timed out is never attempted again ------------------


async def test_at_most_once_timeout_is_interrupted_never_retried(app: ms.App):
    release = threading.Event()
    calls: list[int] = []

    def launch() -> str:
        calls.append(ms.current_step().attempt)
        release.wait(10)  # hangs past the timeout; its thread cannot be killed
        return "launched"

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        try:
            await ctx.step(
                launch,
                mode="at_most_once",
                timeout=0.05,
                retry=ms.RetryPolicy(max_attempts=3, initial_s=0),
            )
        except ms.StepInterrupted as exc:
            return f"unknown outcome: {exc.message}"
        return "no"

    try:
        result = await app.run(wf)
    finally:
        release.set()
    assert result.startswith("unknown outcome: at_most_once step ")
    assert calls == [1]
    [row] = app.observe.steps(app.list_runs()[0].id)
    assert row.status == "failed"
    assert json.loads(row.error or "{}")["type"] == "mainspring._errors.StepInterrupted"


# -- item 11: concurrent waits ---------------------------------------------------------------


async def test_first_completed_of_two_waits_wakes_on_either(fapp: ms.App, clock: ms.FakeClock):
    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> list[str]:
        approve = asyncio.ensure_future(ctx.wait_for("approve"))
        reject = asyncio.ensure_future(ctx.wait_for("reject"))
        done, pending = await asyncio.wait([approve, reject], return_when="FIRST_COMPLETED")
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        first = "approve" if approve in done else f"reject {reject.result()}"
        return [first, str(await ctx.wait_for("next"))]

    handle = fapp.submit(wf)
    await drain(fapp)
    record = fapp.get_run(handle.run_id)
    assert record.status == "waiting"
    assert record.wait_reason == "signal:approve | signal:reject"
    fapp.signal(handle.run_id, "reject", {"cancelled": True})  # any payload at all
    await drain(fapp)
    record = fapp.get_run(handle.run_id)
    assert (record.status, record.wait_reason) == ("waiting", "signal:next")
    # The loser's signal comes late: replay must not let it win now.
    fapp.signal(handle.run_id, "approve")
    fapp.signal(handle.run_id, "next", "n")
    await drain(fapp)
    assert await handle.result() == ["reject {'cancelled': True}", "n"]


async def test_gathered_waits_wake_at_the_earliest_deadline(fapp: ms.App, clock: ms.FakeClock):
    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> list[Any]:
        return list(
            await asyncio.gather(
                ctx.wait_for("a", timeout=3600),
                ctx.wait_for("b", timeout=1, default="b timed out"),
            )
        )

    start = clock.now()
    handle = fapp.submit(wf)
    await drain(fapp)
    record = fapp.get_run(handle.run_id)
    assert record.status == "waiting"
    assert record.wake_at == pytest.approx(start + 1)  # not an hour later
    clock.advance(1.5)
    await drain(fapp)
    record = fapp.get_run(handle.run_id)
    assert (record.status, record.wait_reason) == ("waiting", "signal:a")
    assert record.wake_at == pytest.approx(start + 3600)
    fapp.signal(handle.run_id, "a", "A")
    await drain(fapp)
    assert await handle.result() == ["A", "b timed out"]


async def test_gathered_waits_wake_on_the_second_name(fapp: ms.App):
    @fapp.workflow
    async def wf(ctx: ms.RunContext) -> list[Any]:
        return list(await asyncio.gather(ctx.wait_for("a"), ctx.wait_for("b")))

    handle = fapp.submit(wf)
    await drain(fapp)
    fapp.signal(handle.run_id, "b", 2)  # the second wait's name wakes the run
    await drain(fapp)
    record = fapp.get_run(handle.run_id)
    assert (record.status, record.wait_reason) == ("waiting", "signal:a")
    assert [(r.name, r.status) for r in fapp.observe.steps(handle.run_id)] == [
        ("a", "started"),
        ("b", "completed"),  # it woke, and took its signal
    ]
    fapp.signal(handle.run_id, "a", 1)
    await drain(fapp)
    assert await handle.result() == [1, 2]


def test_a_store_wakes_a_run_waiting_for_several_names_on_any_of_them(db_url: str) -> None:
    store = open_store(db_url)
    t0 = 1_000.0
    waits = RunTransition(
        kind="suspend", status="waiting", wait_signal=join_wait_signals(["a", "b"])
    )

    def claim(now: float) -> list[str]:
        runs = store.claim(
            worker="w", now=now, lease_s=10, limit=5, workflows=["wf"], max_recoveries=3
        )
        return [r.id for r in runs]

    for run_id in ("r1", "r2"):
        store.create_run(
            run_id=run_id, workflow="wf", input='{"args":[],"kwargs":{}}', key=None, now=t0
        )
    runs = {
        r.id: r
        for r in store.claim(
            worker="w", now=t0, lease_s=10, limit=5, workflows=["wf"], max_recoveries=3
        )
    }
    store.send_signal("r2", "b", "1", t0)  # before its suspend: the suspend sees it
    for run_id in ("r1", "r2"):
        store.commit([RunWrite(run_id=run_id, epoch=runs[run_id].epoch, transition=waits)], t0)
    assert claim(t0 + 1) == ["r2"]
    store.send_signal("r1", "c", "1", t0)  # not one of its names
    assert claim(t0 + 1) == []
    store.send_signal("r1", "b", "1", t0)  # the second name wakes it
    assert claim(t0 + 1) == ["r1"]
    store.close()


# -- item 15: a finished run's leftover steps ------------------------------------------------


async def test_sibling_steps_are_stopped_before_the_outcome_is_committed(app: ms.App):
    stopped = asyncio.Event()
    never = asyncio.Event()

    async def fails() -> None:
        raise ValueError("no")

    async def slow() -> str:
        try:
            await never.wait()
        except asyncio.CancelledError:
            stopped.set()
            raise
        return "late"

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        async def slow_then_more() -> None:
            await ctx.step(slow, name="slow")
            await ctx.step(lambda: "after", name="after")

        sibling = asyncio.ensure_future(slow_then_more())
        try:
            await asyncio.gather(
                ctx.step(fails, name="fails", retry=ms.RetryPolicy.never()), sibling
            )
        except ms.StepFailed:
            return "gave up"
        return "no"

    assert await app.run(wf) == "gave up"
    assert stopped.is_set()  # cancelled before `succeeded` was committed
    run_id = app.list_runs()[0].id
    never.set()
    for _ in range(20):
        await asyncio.sleep(0)
    assert sorted(r.name for r in app.observe.steps(run_id)) == ["fails", "slow"]  # no "after"
    assert app.get_run(run_id).status == "succeeded"


@pytest.mark.parametrize("mode", ["at_least_once", "at_most_once"])
async def test_a_run_suspends_only_after_its_running_steps_end(app: ms.App, mode: ms.StepMode):
    calls: list[int] = []

    async def launch() -> str:
        calls.append(ms.current_step().attempt)
        for _ in range(20):  # still running when the wait parks
            await asyncio.sleep(0)
        return "launched"

    @app.workflow
    async def wf(ctx: ms.RunContext) -> list[Any]:
        return list(
            await asyncio.gather(ctx.step(launch, name="launch", mode=mode), ctx.wait_for("go"))
        )

    handle = app.submit(wf)
    await drain(app)
    record = app.get_run(handle.run_id)
    assert (record.status, record.wait_reason) == ("waiting", "signal:go")
    assert [(r.name, r.status) for r in app.observe.steps(handle.run_id)] == [
        ("launch", "completed"),
        ("go", "started"),
    ]
    app.signal(handle.run_id, "go", 1)
    await drain(app)
    assert await handle.result() == ["launched", 1]  # not StepInterrupted
    assert calls == [1]  # not run again either


# -- item 17: an exception whose str() raises -------------------------------------------------


class Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this error fails")


async def test_a_step_error_whose_str_raises_is_retried_and_reported(app: ms.App):
    attempts: list[int] = []

    def step() -> None:
        attempts.append(1)
        raise Hostile

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        try:
            await ctx.step(step, retry=ms.RetryPolicy(max_attempts=2, initial_s=0))
        except ms.StepFailed as exc:
            return exc.error_type
        return "no"

    assert await app.run(wf) == f"{__name__}.Hostile"
    assert len(attempts) == 2


async def test_a_workflow_error_whose_str_raises_fails_the_run_with_it(app: ms.App):
    @app.workflow
    async def wf(ctx: ms.RunContext) -> None:
        raise Hostile

    with pytest.raises(ms.RunFailed) as info:
        await app.run(wf)
    assert info.value.status == "failed"
    assert info.value.error["type"] == f"{__name__}.Hostile"
    assert "str() raised builtins.RuntimeError" in info.value.error["message"]


def test_rendering_a_hostile_error_never_fails() -> None:
    from mainspring._describe import safe_repr, safe_str, safe_traceback
    from mainspring.tools._render import render_error

    class NotText(Exception):
        def __str__(self) -> Any:
            return 42

        def __repr__(self) -> str:
            raise ValueError("repr fails")

    hostile = f"<{__name__}.Hostile whose str() raised builtins.RuntimeError>"
    assert safe_str(Hostile()) == hostile
    assert safe_str(NotText()).endswith("NotText whose str() raised builtins.TypeError>")
    assert safe_repr(NotText()).endswith("NotText whose repr() raised builtins.ValueError>")
    assert "Hostile" in safe_traceback(Hostile())
    assert render_error(Hostile()) == f"Hostile: {hostile}"  # what the model is told
