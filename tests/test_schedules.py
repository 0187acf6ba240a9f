"""Schedules: each due time starts exactly one run across workers, catch-up after
downtime both ways, pause and resume, time zones and DST, the schedules file; on
SQLite and PostgreSQL, under a FakeClock."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import mainspring as ms
from mainspring.testing import FakeClock

MONDAY_0850 = datetime(2026, 1, 5, 8, 50, tzinfo=UTC).timestamp()


def _at(y: int, mo: int, d: int, h: int, mi: int = 0, tz: str = "UTC") -> float:
    return datetime(y, mo, d, h, mi, tzinfo=ZoneInfo(tz)).timestamp()


def _app(url: str, clock: FakeClock) -> ms.App:
    app = ms.App(url, clock=clock, poll_interval_s=0.02)

    @app.workflow
    async def report(ctx: ms.RunContext, scope: str) -> str:
        return f"report of {scope}"

    return app


def _runs(app: ms.App) -> list[ms.RunRecord]:
    return sorted(app.store.list_runs(limit=1000), key=lambda r: r.key or "")


@pytest.fixture
def pair(db_url: str) -> Any:
    """Two Apps (as two workers would hold) on one database and one FakeClock."""
    clock = FakeClock(start=MONDAY_0850)
    apps = [_app(db_url, clock), _app(db_url, clock)]
    for app in apps:
        app.schedules.add("standup", "0 9 * * 1-5", "report", "team")
    yield clock, apps
    for app in apps:
        app.close()


def test_each_due_time_starts_one_run_across_two_workers(pair: Any) -> None:
    clock, (a, b) = pair
    assert a.schedules.tick() == [] and b.schedules.tick() == []  # 08:50: nothing due
    clock.advance(600)  # 09:00 Monday
    first = a.schedules.tick() + b.schedules.tick()
    assert len(first) == 1
    clock.advance(86_400)  # 09:00 Tuesday: the other worker ticks first this time
    second = b.schedules.tick() + a.schedules.tick()
    assert len(second) == 1
    runs = _runs(a)
    assert [r.key for r in runs] == [
        "schedule:standup:2026-01-05T09:00:00Z",
        "schedule:standup:2026-01-06T09:00:00Z",
    ]
    assert {r.workflow for r in runs} == {"report"}
    assert {r.schedule for r in runs} == {"standup"}
    assert a.get_run(a.submit("report", "by hand").run_id).schedule is None
    row = a.schedules.get("standup")
    assert row.last_run == second[0] and row.next_at == _at(2026, 1, 7, 9)
    assert row.last_at == _at(2026, 1, 6, 9)


def test_ticks_racing_in_threads_start_one_run(pair: Any) -> None:
    clock, apps = pair
    for app in apps:
        app.schedules.tick()  # both synced before the race
    clock.advance(600)
    started: list[str] = []
    barrier = threading.Barrier(4)

    def tick(app: ms.App) -> None:
        barrier.wait()
        for _ in range(5):
            started.extend(app.schedules.tick())

    threads = [threading.Thread(target=tick, args=(app,)) for app in apps * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(started) == 1
    assert len(_runs(apps[0])) == 1


def test_worker_loops_start_and_finish_the_run(pair: Any) -> None:
    clock, (a, b) = pair
    a.schedules.tick()  # synced: next due 09:00
    clock.advance(600)

    async def work() -> None:
        await asyncio.gather(a.worker().run(until_idle=True), b.worker().run(until_idle=True))

    asyncio.run(work())
    (run,) = _runs(a)
    assert run.status == "succeeded"
    assert a.get_run(run.id).output is not None
    assert asyncio.run(a.result(run.id)) == "report of team"


def test_skip_starts_nothing_for_missed_times(pair: Any) -> None:
    clock, (a, b) = pair
    a.schedules.tick()
    clock.advance(600 + 3 * 86_400 + 1800)  # no worker from Monday 08:50 to Thursday 09:30
    assert a.schedules.tick() == [] and b.schedules.tick() == []
    assert _runs(a) == []
    assert a.schedules.get("standup").next_at == _at(2026, 1, 9, 9)  # Friday
    clock.advance(86_400 - 1800)  # Friday 09:00: back on time
    assert len(b.schedules.tick()) == 1


def test_skip_runs_a_time_that_is_only_a_little_late(pair: Any) -> None:
    clock, (a, _) = pair
    a.schedules.tick()
    clock.advance(600 + 30)  # 09:00:30: within the grace
    (run_id,) = a.schedules.tick()
    assert a.get_run(run_id).key == "schedule:standup:2026-01-05T09:00:00Z"


def test_once_starts_one_run_for_the_most_recent_missed_time(db_url: str) -> None:
    clock = FakeClock(start=MONDAY_0850)
    a, b = _app(db_url, clock), _app(db_url, clock)
    try:
        for app in (a, b):
            app.schedules.add("standup", "0 9 * * 1-5", "report", "team", catch_up="once")
        a.schedules.tick()
        clock.advance(600 + 3 * 86_400 + 1800)  # Thursday 09:30
        started = a.schedules.tick() + b.schedules.tick()
        assert len(started) == 1
        assert [r.key for r in _runs(a)] == ["schedule:standup:2026-01-08T09:00:00Z"]
        assert a.schedules.tick() == []
        assert a.schedules.get("standup").next_at == _at(2026, 1, 9, 9)
    finally:
        a.close()
        b.close()


def test_pause_and_resume(pair: Any) -> None:
    clock, (a, b) = pair
    a.schedules.tick()
    assert b.schedules.pause("standup").paused
    clock.advance(600)  # 09:00 Monday, paused
    assert a.schedules.tick() == [] and b.schedules.tick() == []
    clock.advance(3600)
    resumed = a.schedules.resume("standup")
    assert not resumed.paused
    assert resumed.next_at == _at(2026, 1, 6, 9)  # Monday's time passed while paused
    clock.advance(86_400 - 3600)
    assert len(b.schedules.tick()) == 1
    assert a.schedules.resume("standup").next_at == _at(2026, 1, 7, 9)  # not paused: unchanged
    with pytest.raises(ms.ScheduleNotFound, match="no schedule named 'nope'"):
        a.schedules.pause("nope")
    with pytest.raises(ms.ScheduleNotFound):
        a.schedules.resume("nope")


def test_time_zone_and_the_dst_change(db_url: str) -> None:
    # New York springs forward on Sunday 2026-03-08 (02:00 -> 03:00).
    clock = FakeClock(start=_at(2026, 3, 6, 12, tz="America/New_York"))
    app = _app(db_url, clock)
    try:
        app.schedules.add("nine", "0 9 * * *", "report", "ny", tz="America/New_York")
        app.schedules.add("half-two", "30 2 * * *", "report", "gap", tz="America/New_York")
        app.schedules.tick()
        assert app.schedules.get("nine").next_at == _at(2026, 3, 7, 9, tz="America/New_York")
        # 09:00 in New York is 14:00 UTC before the change and 13:00 UTC after it.
        nine = app.schedules.get("nine")
        assert datetime.fromtimestamp(nine.next_at, UTC).hour == 14
        clock.advance(nine.next_at - clock.now())
        app.schedules.tick()
        after = app.schedules.get("nine").next_at
        assert datetime.fromtimestamp(after, UTC).hour == 13
        assert after - nine.next_at == 23 * 3600  # the day of the change has 23 hours
        # 02:30 does not exist on 2026-03-08: it runs at 03:30 EDT, the same instant.
        gap = app.schedules.get("half-two").next_at
        assert gap == _at(2026, 3, 8, 3, 30, tz="America/New_York")
        clock.advance(gap - clock.now())
        (run_id,) = app.schedules.tick()
        assert app.get_run(run_id).key == "schedule:half-two:2026-03-08T07:30:00Z"
    finally:
        app.close()


def test_fall_back_runs_a_repeated_wall_time_once(db_url: str) -> None:
    # New York falls back on Sunday 2026-11-01 (02:00 EDT -> 01:00 EST): 01:00-01:59 twice.
    clock = FakeClock(start=_at(2026, 11, 1, 0, 45, tz="America/New_York"))
    app = _app(db_url, clock)
    try:
        app.schedules.add("half-hourly", "*/30 * * * *", "report", "ny", tz="America/New_York")
        app.schedules.add("half-one", "30 1 * * *", "report", "once", tz="America/New_York")
        app.schedules.tick()
        keys: list[str] = []
        for _ in range(12):  # every 15 minutes, 01:00 EDT to 02:45 EST (05:00Z to 07:45Z)
            clock.advance(900)
            keys += [app.get_run(r).key or "" for r in app.schedules.tick()]
        assert sorted(keys) == [
            "schedule:half-hourly:2026-11-01T05:00:00Z",  # 01:00 EDT
            "schedule:half-hourly:2026-11-01T05:30:00Z",  # 01:30 EDT
            # 01:00 and 01:30 EST, the repeated hour, start nothing
            "schedule:half-hourly:2026-11-01T07:00:00Z",  # 02:00 EST
            "schedule:half-hourly:2026-11-01T07:30:00Z",  # 02:30 EST
            "schedule:half-one:2026-11-01T05:30:00Z",  # 01:30 EDT, the first one
        ]
        assert app.schedules.get("half-one").next_at == _at(
            2026, 11, 2, 1, 30, tz="America/New_York"
        )
    finally:
        app.close()


def test_a_changed_definition_starts_afresh_and_an_unchanged_one_keeps_its_state(
    db_url: str,
) -> None:
    clock = FakeClock(start=MONDAY_0850)
    a = _app(db_url, clock)
    a.schedules.add("standup", "0 9 * * 1-5", "report", "team")
    a.schedules.tick()
    a.schedules.pause("standup")
    a.close()
    b = _app(db_url, clock)  # a redeploy with the same definition: still paused
    b.schedules.add("standup", "0 9 * * 1-5", "report", "team")
    b.schedules.tick()
    assert b.schedules.get("standup").paused
    b.close()
    c = _app(db_url, clock)  # a new time: rewritten, next due at the new time
    c.schedules.add("standup", "30 8 * * *", "report", "team")
    c.schedules.tick()
    row = c.schedules.get("standup")
    assert row.cron == "30 8 * * *" and row.next_at == _at(2026, 1, 6, 8, 30)
    c.close()


def test_decorator_and_file(tmp_path: Path) -> None:
    clock = FakeClock(start=MONDAY_0850)
    app = ms.App(f"sqlite:///{tmp_path / 'db.sqlite'}", clock=clock)

    @app.schedules.add("*/15 * * * *", tz="Europe/Paris", catch_up="once")
    @app.workflow
    async def poll(ctx: ms.RunContext) -> None:
        return None

    @app.workflow
    async def digest(ctx: ms.RunContext, who: str, *, short: bool = False) -> str:
        return who

    toml = tmp_path / "schedules.toml"
    toml.write_text(
        '[[schedule]]\nname = "digest"\ncron = "0 20 * * *"\nworkflow = "digest"\n'
        'args = ["ops"]\nkwargs = {short = true}\ntz = "Asia/Tokyo"\n',
        encoding="utf-8",
    )
    (loaded,) = app.schedules.load(toml)
    assert loaded.tz == "Asia/Tokyo" and loaded.catch_up == "skip"
    assert set(app.schedules.declared) == {"poll", "digest"}
    assert app.schedules.declared["poll"].catch_up == "once"
    app.schedules.tick()
    assert [s.name for s in app.schedules.list()] == ["digest", "poll"]
    clock.advance(600)
    (run_id,) = app.schedules.tick()
    assert app.get_run(run_id).workflow == "poll"
    app.close()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda app: app.schedules.add("x", "0 9 * *", "report"), "not a cron expression of five"),
        (lambda app: app.schedules.add("x", "0 25 * * *", "report"), "not a cron expression"),
        (lambda app: app.schedules.add("x", "0 9 * * *", "report", tz="Mars/Base"), "unknown time"),
        (
            lambda app: app.schedules.add("x", "0 9 * * *", "report", catch_up="all"),
            "catch_up must",
        ),
        (lambda app: app.schedules.add("x", "0 9 * * *", "nope"), "no workflow named 'nope'"),
        (lambda app: app.schedules.add("x", "0 9 * * *"), "name the workflow it starts"),
        (lambda app: app.schedules.add("0 9 * * *", tz="UTC", x=1), "as a decorator takes only"),
        (lambda app: app.schedules.add("0 9 * * *")(lambda ctx: None), "decorates a workflow"),
        (lambda app: app.schedules.add("x", "0 9 * * *", "report", 1, 2), "argument"),
    ],
)
def test_bad_declarations_say_what_is_wrong(tmp_path: Path, call: Any, message: str) -> None:
    app = _app(f"sqlite:///{tmp_path / 'db.sqlite'}", FakeClock())
    with pytest.raises(ms.MainspringError, match=message):
        call(app)


def test_a_bad_schedules_file_names_the_entry_and_field(tmp_path: Path) -> None:
    app = _app(f"sqlite:///{tmp_path / 'db.sqlite'}", FakeClock())
    bad = tmp_path / "s.json"
    bad.write_text('{"schedule": [{"name": "a", "cron": "0 9 * * *", "workflw": "r"}]}')
    with pytest.raises(ms.ConfigError, match=r"entry 1: unknown field\(s\) \['workflw'\]"):
        app.schedules.load(bad)
    bad.write_text('{"schedule": [{"name": "a", "cron": "0 9 * * *", "workflow": "report"}]}')
    with pytest.raises(ms.ConfigError, match=r"entry 1: .*argument"):
        app.schedules.load(bad)
    with pytest.raises(ms.ConfigError, match="cannot read it"):
        app.schedules.load(tmp_path / "missing.toml")


@pytest.mark.slow
def test_many_due_times_raced_by_four_workers_start_one_run_each(db_url: str) -> None:
    clock = FakeClock(start=MONDAY_0850)
    apps = [_app(db_url, clock) for _ in range(4)]
    try:
        for app in apps:
            app.schedules.add("minutely", "* * * * *", "report", "all")
            app.schedules.tick()
        started: list[str] = []
        lock = threading.Lock()
        for _ in range(60):
            clock.advance(60)
            barrier = threading.Barrier(len(apps))

            def tick(app: ms.App, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                ids = app.schedules.tick()
                with lock:
                    started.extend(ids)

            threads = [threading.Thread(target=tick, args=(app,)) for app in apps]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
        keys = [r.key for r in _runs(apps[0])]
        assert len(started) == len(keys) == 60 == len(set(keys))
    finally:
        for app in apps:
            app.close()
