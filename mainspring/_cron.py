"""Cron times: when a schedule is due, as pure functions of a cron expression, a
time zone and a time (docs/schedules-and-queues.md).

Cron times are wall times in the schedule's zone, computed by ``croniter`` on naive
local times and placed in the zone by ``zoneinfo`` with ``fold=0``: a wall time that
a spring-forward skips happens at the same instant as the time one hour later (02:30
runs at 03:30 the day clocks go from 02:00 to 03:00); a wall time that a fall-back
repeats happens once, at its first occurrence.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from ._errors import ConfigError

__all__ = ["check_cron", "check_zone", "iso", "next_due", "previous_due"]

_SEARCH = 100_000  # cron times tried before giving up (a schedule that never fires)


def check_zone(tz: str, where: str) -> ZoneInfo:
    """The zone ``tz`` names; ConfigError (saying ``where``) if none."""
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"{where}: unknown time zone {tz!r}; use an IANA name such as 'UTC' or 'Europe/Paris'"
        ) from None


def check_cron(cron: str, where: str) -> None:
    """Raise ConfigError unless ``cron`` is a five-field cron expression."""
    if not isinstance(cron, str) or len(cron.split()) != 5 or not croniter.is_valid(cron):
        raise ConfigError(
            f"{where}: {cron!r} is not a cron expression of five fields (minute hour "
            "day-of-month month day-of-week), e.g. '0 9 * * 1-5'"
        )


def _local(ts: float, zone: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(ts, zone).replace(tzinfo=None)


def _instant(wall: datetime, zone: ZoneInfo) -> float:
    return wall.replace(tzinfo=zone, fold=0).timestamp()


def next_due(cron: str, tz: str, after: float) -> float:
    """The first time ``cron`` names in zone ``tz`` strictly after ``after``."""
    zone = check_zone(tz, f"cron {cron!r}")
    times = croniter(cron, _local(after, zone))
    for _ in range(_SEARCH):
        due = _instant(times.get_next(datetime), zone)
        if due > after:
            return due
    raise ConfigError(f"cron {cron!r} in {tz}: no time after {iso(after)}")


def previous_due(cron: str, tz: str, at: float) -> float:
    """The last time ``cron`` names in zone ``tz`` at or before ``at``."""
    zone = check_zone(tz, f"cron {cron!r}")
    times = croniter(cron, _local(at, zone) + timedelta(seconds=1))
    for _ in range(_SEARCH):
        due = _instant(times.get_prev(datetime), zone)
        if due <= at:
            return due
    raise ConfigError(f"cron {cron!r} in {tz}: no time before {iso(at)}")


def iso(ts: float) -> str:
    """``ts`` in UTC, ISO 8601 to the second."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
