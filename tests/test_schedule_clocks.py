"""Schedules follow the database's clock, not each worker's: workers whose clocks
are 150 s off fire each due time once, never early, and skip none; and the
invariant "one run per due time, none early, none skipped" says when that breaks.
On SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import mainspring as ms
from mainspring._clock import SystemClock
from mainspring._cron import next_due
from mainspring.storage import open_store
from mainspring.testing import FakeClock, check_invariants

SKEW_S = 150.0
CRON = "* * * * *"


class SkewedClock(SystemClock):
    """The real clock of a machine whose time is ``offset`` seconds off."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset


def _app(url: str, offset: float) -> ms.App:
    app = ms.App(url, clock=SkewedClock(offset), poll_interval_s=0.02)

    @app.workflow
    async def report(ctx: ms.RunContext) -> str:
        return "report"

    app.schedules.add("minutely", CRON, report)
    return app


@pytest.fixture
def workers(db_url: str) -> Iterator[dict[str, ms.App]]:
    """Workers on one database: 150 s ahead of the true time, on it, 150 s behind."""
    apps = {"ahead": _app(db_url, SKEW_S), "on_time": _app(db_url, 0.0)}
    apps["behind"] = _app(db_url, -SKEW_S)
    yield apps
    for app in apps.values():
        app.close()


def _kinds(app: ms.App) -> list[str]:
    return [v.kind for v in check_invariants(app.store)]


def _due_soon(app: ms.App) -> float:
    """Make the schedule due about a second from now (the next minute may be a
    minute away): within the minute, so that the time after it is still its cron's."""
    now = time.time()
    due = min(now + 1.0, next_due(CRON, "UTC", now))
    assert app.store.set_schedule_paused("minutely", False, now=now, next_at=due)
    return due


def _until(moment: float) -> None:
    """Sleep until the true time has passed ``moment``."""
    while time.time() <= moment:
        time.sleep(max(0.01, moment - time.time() + 0.01))


def test_workers_whose_clocks_differ_fire_each_due_time_once_never_early(
    workers: dict[str, ms.App],
) -> None:
    ahead, on_time, behind = workers["ahead"], workers["on_time"], workers["behind"]
    ahead.schedules.sync()  # the fast one stores it first: it must not place it ahead
    for app in (on_time, behind):
        app.schedules.sync()
    assert ahead.schedules.get("minutely").next_at <= next_due(CRON, "UTC", time.time())
    assert _kinds(ahead) == []

    due = _due_soon(ahead)
    # Due in a second of true time; 149 s ago by the fast worker's clock.
    assert [app.schedules.tick() for app in (ahead, on_time, behind)] == [[], [], []]
    assert _kinds(ahead) == [] and ahead.list_runs() == []
    _until(due)
    started = ahead.schedules.tick() + on_time.schedules.tick() + behind.schedules.tick()
    assert len(started) == 1
    run = ahead.get_run(started[0])
    assert run.schedule == "minutely" and run.created_at >= due
    # Moved on to the first time after the one it fired: none jumped over.
    assert ahead.schedules.get("minutely").next_at == next_due(CRON, "UTC", due)
    assert _kinds(ahead) == []


def test_a_worker_whose_clock_is_behind_still_fires_on_time(workers: dict[str, ms.App]) -> None:
    behind = workers["behind"]
    behind.schedules.sync()
    due = _due_soon(behind)
    _until(due)
    [started] = behind.schedules.tick()  # 149 s before the due time by its own clock
    assert behind.get_run(started).created_at >= due
    assert _kinds(behind) == []


def test_the_database_clock_is_the_servers_or_the_machines(db_url: str) -> None:
    store = open_store(db_url)
    try:
        before = time.time()
        read = store.database_now()
        after = time.time()
        # SQLite reads this machine's clock (to the millisecond); the PostgreSQL test
        # server runs on this machine too.
        assert before - 0.002 <= read <= after + 0.002
    finally:
        store.close()


def test_the_invariant_catches_early_and_skipped_due_times(db_url: str) -> None:
    clock = FakeClock(start=1_767_603_000.0)  # 2026-01-05T08:50:00Z
    app = ms.App(db_url, clock=clock)

    @app.workflow
    async def report(ctx: ms.RunContext) -> str:
        return "report"

    app.schedules.add("daily", "0 9 * * *", report)
    try:
        app.schedules.sync()
        assert [v.kind for v in check_invariants(app.store, now=clock.now())] == []
        nine = app.schedules.get("daily").next_at
        # What a worker 20 minutes ahead did: fired 09:00 at 08:50, moved on a day.
        app.store.fire_schedule(
            name="daily",
            seen_next_at=nine,
            next_at=nine + 86_400,
            due_at=nine,
            run_id="early",
            key="schedule:daily:2026-01-05T09:00:00Z",
            version=None,
            now=clock.now() + 1200,
        )
        found = check_invariants(app.store, now=clock.now())
        assert [(v.kind, v.run_id) for v in found] == [
            ("schedule_early", "early"),  # 09:00's run exists at 08:50
            ("schedule_skipped", "early"),  # and 09:00 Tuesday would start nothing
        ]
        # Jumped a due time: next due Wednesday while Tuesday's 09:00 is still to come.
        app.store.set_schedule_paused("daily", False, now=clock.now(), next_at=nine + 2 * 86_400)
        clock.advance(3600)  # 09:50 Monday: the early run is no longer early
        found = check_invariants(app.store, now=clock.now())
        assert [v.kind for v in found] == ["schedule_skipped"]
        assert "past" in found[0].detail
    finally:
        app.close()
