"""Keys the system derives: a keyed child in a ``continue_as_new`` loop gets a child
per session (never a wait for an end consumed long ago), a key reused in one session
fails at once, a child started under an earlier version's key is found again, and
no client may submit a run under a derived key (``schedule:``, ``child:``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from _helpers import drain

import mainspring as ms
from mainspring.testing import FakeClock, assert_invariants

MONDAY_0850 = 1_767_603_000.0  # 2026-01-05T08:50:00Z


@pytest.fixture
def fapp(db_url: str) -> Iterator[ms.App]:
    app = ms.App(db_url, clock=FakeClock(), poll_interval_s=0.01, inline_wait_s=0.0)
    yield app
    app.close()


async def test_a_keyed_child_in_a_continue_as_new_loop_starts_one_child_per_session(
    fapp: ms.App,
) -> None:
    @fapp.workflow
    async def job(ctx: ms.RunContext, scope: str) -> str:
        return f"{scope} done in {ctx.run_id[:4]}"

    @fapp.workflow
    async def nightly(ctx: ms.RunContext) -> list[str]:
        done: list[str] = list(ctx.handoff or [])
        # The same key and the same input every night: each session is a new night.
        done.append(await ctx.child(job, "all", key="nightly"))
        if len(done) < 3:
            ctx.continue_as_new(done)
        return done

    handle = fapp.submit(nightly)
    await drain(fapp)
    record = fapp.get_run(handle.run_id)
    assert (record.status, record.session) == ("succeeded", 2), record.wait_reason
    kids = fapp.children(handle.run_id)
    assert [k.parent_step for k in kids] == ["0:0", "1:0", "2:0"]
    assert len({k.id for k in kids}) == 3
    assert await handle.result() == [f"all done in {k.id[:4]}" for k in kids]
    assert [fapp.get_run(k.id).key for k in kids] == [
        f"child:{handle.run_id}:{n}:key:nightly" for n in range(3)
    ]
    assert_invariants(fapp.store, now=fapp.clock.now(), settled=True)


async def test_a_key_reused_in_one_session_fails_at_once(fapp: ms.App) -> None:
    @fapp.workflow
    async def job(ctx: ms.RunContext) -> str:
        return "done"

    @fapp.workflow
    async def twice(ctx: ms.RunContext) -> list[str]:
        first = await ctx.child(job, key="k")
        return [first, await ctx.child(job, key="k")]

    handle = fapp.submit(twice)
    await drain(fapp)
    record = fapp.get_run(handle.run_id)
    assert record.status == "failed", (record.status, record.wait_reason)  # never a hang
    with pytest.raises(ms.RunFailed, match="a key names one child per session") as failed:
        await handle.result()
    assert f"child:{handle.run_id}:0:key:k" in str(failed.value)
    assert "at step 0:0" in str(failed.value)
    assert len(fapp.children(handle.run_id)) == 1


async def test_a_child_started_under_an_earlier_key_is_found_on_replay(fapp: ms.App) -> None:
    """The parent died after an earlier version created its child (under that
    version's key) and before the start was journaled: the replay finds that child
    by its position, and never starts a second one."""

    @fapp.workflow
    async def job(ctx: ms.RunContext, n: int) -> int:
        return n + 1

    @fapp.workflow
    async def parent(ctx: ms.RunContext) -> int:
        return await ctx.child(job, 1) + await ctx.child(job, 2, key="two")

    handle = fapp.submit(parent)
    now = fapp.clock.now()
    for step, key, n in (
        ("0:0", f"{handle.run_id}:0:0", 1),
        ("0:2", f"{handle.run_id}:child:two", 2),
    ):
        fapp.store.create_run(
            run_id=f"old-{n}",
            workflow="job",
            input=fapp.get_workflow("job").encode_input((n,), {}),
            key=key,
            now=now,
            parent=handle.run_id,
            parent_step=step,
        )
    await drain(fapp)
    assert await handle.result() == 5
    assert [k.id for k in fapp.children(handle.run_id)] == ["old-1", "old-2"]
    assert_invariants(fapp.store, now=fapp.clock.now(), settled=True)


# -- reserved keys --------------------------------------------------------------------


@pytest.fixture
def sched(db_url: str) -> Iterator[ms.App]:
    app = ms.App(db_url, clock=FakeClock(start=MONDAY_0850), poll_interval_s=0.01)

    @app.workflow
    async def report(ctx: ms.RunContext) -> str:
        return "report"

    app.schedules.add("daily", "0 9 * * *", report)
    app.schedules.sync()
    yield app
    app.close()


def test_a_schedule_key_cannot_be_squatted_by_submit(sched: ms.App) -> None:
    squat = "schedule:daily:2026-01-05T09:00:00Z"  # the key of its next due time
    with pytest.raises(ms.ConfigError, match="'schedule:', a prefix reserved"):
        sched.submit("report", key=squat)
    with pytest.raises(ms.ConfigError, match="'child:', a prefix reserved"):
        sched.submit("report", key="child:abc:0:0")
    assert sched.list_runs() == []
    sched.clock.advance(600)  # 09:00: the schedule starts its own run under that key
    [started] = sched.schedules.tick()
    assert sched.get_run(started).key == squat and sched.get_run(started).schedule == "daily"


async def test_app_run_refuses_a_reserved_key_too(sched: ms.App) -> None:
    with pytest.raises(ms.ConfigError, match="reserved"):
        await sched.run("report", key="schedule:daily:whenever")
    assert sched.list_runs() == []


def test_post_runs_with_a_reserved_key_is_a_422_naming_the_prefix(sched: ms.App) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mainspring.server import create_app

    token = sched.store.create_api_key("ops", ["admin"], time.time())[1]
    with TestClient(create_app(sched, webhooks=False)) as client:
        for key, prefix in (
            ("schedule:daily:2026-01-05T09:00:00Z", "schedule:"),
            ("child:x", "child:"),
        ):
            response = client.post(
                "/runs", json={"workflow": "report", "key": key}, headers={"X-API-Key": token}
            )
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error["type"] == "invalid_input" and repr(prefix) in error["message"]
        ok = client.post(
            "/runs", json={"workflow": "report", "key": "daily:mine"}, headers={"X-API-Key": token}
        )
        assert ok.status_code == 202, ok.text
    assert [r.key for r in sched.list_runs()] == ["daily:mine"]
