"""The worker's log says, one structured INFO line each, what it did with every run:
claims and takeovers, retries, waits and sleeps, successes and failures."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import mainspring as ms


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("event=")]


def test_claims_retries_waits_and_outcomes_are_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'log.db'}")
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("reset by peer")
        return "ok"

    @app.workflow
    async def waits(ctx: ms.RunContext) -> str:
        await ctx.step(flaky, retry=ms.RetryPolicy(max_attempts=2, initial_s=0.01))
        return str(await ctx.wait_for("go"))

    @app.workflow
    async def breaks(ctx: ms.RunContext) -> None:
        raise ValueError("no such table")

    async def main() -> str:
        run = app.submit(waits)
        broken = app.submit(breaks)
        await app.worker().run(until_idle=True)
        app.signal(run.run_id, "go", "now")
        await app.worker().run(until_idle=True)
        assert app.get_run(broken.run_id).status == "failed"
        return run.run_id

    with caplog.at_level(logging.INFO, logger="mainspring"):
        run_id = asyncio.run(main())
    lines = _lines(caplog)
    assert any("event=claim " in x and f"run={run_id}" in x for x in lines), lines
    [retry] = [x for x in lines if x.startswith("event=retry")]
    assert f"run={run_id}" in retry and "attempt=1" in retry and "reset by peer" in retry
    [waiting] = [x for x in lines if x.startswith("event=waiting")]
    assert f"run={run_id}" in waiting and "reason='signal:go'" in waiting
    assert any(x.startswith("event=succeeded") and f"run={run_id}" in x for x in lines)
    [failed] = [x for x in lines if x.startswith("event=failed")]
    assert "ValueError: no such table" in failed
    app.close()


def test_a_takeover_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = ms.FakeClock()
    app = ms.App(f"sqlite:///{tmp_path / 'take.db'}", clock=clock, lease_s=15)

    @app.workflow
    async def job(ctx: ms.RunContext) -> str:
        return "done"

    run = app.submit(job)
    # A worker that claimed the run and died: its lease runs out.
    app.store.claim(
        worker="ghost", now=clock.now(), lease_s=15, limit=1, workflows=["job"], max_recoveries=5
    )
    clock.advance(16)
    with caplog.at_level(logging.INFO, logger="mainspring"):
        asyncio.run(app.worker().run(until_idle=True))
    [takeover] = [x for x in _lines(caplog) if x.startswith("event=takeover")]
    assert f"run={run.run_id}" in takeover and "recoveries=1" in takeover
    app.close()
