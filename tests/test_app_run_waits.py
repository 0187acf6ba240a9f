"""``app.run`` never sits silently on a run that waits for a person or a signal, and
``worker().run(until_idle=True)`` does not leave behind a run that is due in a moment.

Each test bounds its awaits with ``asyncio.wait_for``: the old behaviour was a hang, and a
hang must fail here as an error, not as the suite's timeout.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import mainspring as ms
from mainspring.testing import ScriptedModel

BOUND_S = 30.0


def _agent(app: ms.App) -> ms.Workflow[[str], ms.AgentResult]:
    @app.tool(effect="irreversible")
    def purge(table: str) -> str:
        """Purge a table."""
        return f"purged {table}"

    model = ScriptedModel(
        [
            ScriptedModel.call("purge", {"table": "t"}),
            ScriptedModel.call("finish", {"answer": "purged t"}),
        ]
    )
    return app.agent("cleanup", model=model, instructions="Purge t with purge.", tools=[purge])


async def test_app_run_raises_run_waiting_that_says_how_to_answer(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'w.db'}")
    agent = _agent(app)
    with pytest.raises(ms.RunWaiting) as caught:
        await asyncio.wait_for(app.run(agent, "go", key="cleanup-1"), BOUND_S)
    waiting = caught.value
    [request] = app.requests(waiting.run_id)
    assert waiting.requests == (request.id,) and request.id.startswith("approval:")
    message = str(waiting)
    assert f"mainspring approve {waiting.run_id} {request.id}" in message
    assert f"app.answer({waiting.run_id!r}, {request.id!r}, decision='approve')" in message
    assert app.get_run(waiting.run_id).status == "waiting"  # kept, not failed

    # Answered, the same call (same key) finishes the same run.
    app.answer(waiting.run_id, request.id, decision="approve", by="ops")
    result = await asyncio.wait_for(app.run(agent, "go", key="cleanup-1"), BOUND_S)
    assert result.answer == "purged t"
    assert [r.id for r in app.list_runs()] == [waiting.run_id]
    app.close()


async def test_a_plain_signal_wait_names_the_signal(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 's.db'}")

    @app.workflow
    async def ship(ctx: ms.RunContext) -> str:
        by: str = await ctx.wait_for("ship")
        return f"shipped by {by}"

    with pytest.raises(ms.RunWaiting) as caught:
        await asyncio.wait_for(app.run(ship), BOUND_S)
    run_id = caught.value.run_id
    assert caught.value.wait_reason == "signal:ship" and caught.value.requests == ()
    assert f"mainspring signal {run_id} ship PAYLOAD-JSON" in str(caught.value)
    app.signal(run_id, "ship", "dana")
    await asyncio.wait_for(app.worker().run(until_idle=True), BOUND_S)
    assert await app.result(run_id) == "shipped by dana"
    app.close()


async def test_on_wait_wait_logs_the_wait_and_returns_once_answered(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'ww.db'}")
    agent = _agent(app)
    told: list[str] = []
    heard = asyncio.Event()

    class Reader(logging.Handler):  # what an operator reading the log sees
        def emit(self, record: logging.LogRecord) -> None:
            told.append(record.getMessage())
            heard.set()

    async def reviewer() -> None:  # answers once app.run has said what it waits for
        await heard.wait()
        [request] = app.requests()
        app.answer(request.run_id, request.id, decision="approve", by="ana")

    reader = Reader(logging.WARNING)
    logging.getLogger("mainspring").addHandler(reader)
    try:
        answering = asyncio.create_task(reviewer())
        result = await asyncio.wait_for(app.run(agent, "go", on_wait="wait"), BOUND_S)
        await answering
    finally:
        logging.getLogger("mainspring").removeHandler(reader)
    assert result.answer == "purged t"
    [line] = [m for m in told if "is waiting for" in m]
    assert "mainspring approve " in line and "on_wait='wait') waits for it" in line
    app.close()


async def test_on_wait_is_checked(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'c.db'}")
    with pytest.raises(ms.ConfigError, match="on_wait must be 'raise' or 'wait', got 'never'"):
        await app.run(_agent(app), "go", on_wait="never")  # type: ignore[arg-type]
    app.close()


async def test_until_idle_waits_for_a_run_due_in_a_moment(db_url: str) -> None:
    # inline_wait_s=0: every sleep releases the worker, as a long one would.
    app = ms.App(db_url, inline_wait_s=0)

    @app.workflow
    async def nap(ctx: ms.RunContext) -> str:
        await ctx.sleep(0.2)
        return "rested"

    run = app.submit(nap)
    await asyncio.wait_for(app.worker().run(until_idle=True), BOUND_S)
    assert app.get_run(run.run_id).status == "succeeded"
    assert await asyncio.wait_for(run.result(), BOUND_S) == "rested"

    # A sleep past the horizon does not hold it: that run is left sleeping.
    @app.workflow
    async def long_nap(ctx: ms.RunContext) -> str:
        await ctx.sleep(3600)
        return "rested"

    later = app.submit(long_nap)
    await asyncio.wait_for(app.worker().run(until_idle=True, idle_horizon_s=1.0), BOUND_S)
    assert app.get_run(later.run_id).status == "sleeping"
    app.close()


async def test_awaiting_the_result_of_a_waiting_run_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'r.db'}")

    @app.workflow
    async def ship(ctx: ms.RunContext) -> str:
        return str(await ctx.wait_for("ship"))

    run = app.submit(ship)
    await asyncio.wait_for(app.worker().run(until_idle=True), BOUND_S)
    with caplog.at_level(logging.WARNING, logger="mainspring"), pytest.raises(TimeoutError):
        await app.result(run.run_id, timeout=0.3)
    [line] = [
        r.getMessage() for r in caplog.records if "app.result keeps waiting" in r.getMessage()
    ]
    assert f"mainspring signal {run.run_id} ship" in line
    app.close()


async def test_a_worker_sweeps_before_it_calls_itself_idle(tmp_path: Path) -> None:
    """A claim of only the runs a push named (here one that is no longer runnable) finds
    nothing; the worker must still sweep for runs no push named before it stops as idle.
    (On PostgreSQL a parent woken again by NOTIFY left its queued child behind this way.)"""
    app = ms.App(f"sqlite:///{tmp_path / 'w.db'}")

    @app.workflow
    async def noop(ctx: ms.RunContext) -> str:
        return "done"

    handle = app.submit(noop)
    worker = app.worker()
    # As if a push had named a run that another worker took meanwhile, and no push
    # named the queued run (the claim of named runs is not a sweep).
    worker._named.add("run-that-someone-else-took")
    worker._sweep = False
    await asyncio.wait_for(worker.run(until_idle=True), BOUND_S)
    assert app.get_run(handle.run_id).status == "succeeded"


def test_app_methods_take_the_handle_submit_returned(tmp_path: Path) -> None:
    """``app.submit`` returns a RunHandle; passing it where a run id goes works, and a
    value of another type is a TypeError naming it, not a database error."""
    app = ms.App(f"sqlite:///{tmp_path / 'h.db'}")

    @app.workflow
    async def waits(ctx: ms.RunContext) -> object:
        return await ctx.wait_for("go")

    handle = app.submit(waits)
    assert app.get_run(handle).id == handle.run_id
    assert app.signal(handle, "go", 7) >= 0
    assert app.requests(handle) == []
    assert app.cancel(handle) in ("cancelled", "running")
    assert app.observe.steps(handle) == app.observe.steps(handle.run_id)
    with pytest.raises(TypeError, match="not by int 42"):
        app.get_run(42)  # type: ignore[arg-type]
