"""Run keys the system derives, and why no client may use them.

A run's ``key`` makes its submission idempotent: the same key names the same run.
Two kinds of run are keyed by mainspring itself, from where they come from:

* a schedule's run for one due time: ``schedule:<name>:<due time, UTC>``, so that
  however many workers fire the schedule, the due time names one run;
* a child run: ``child:<parent id>:<session>:<seq>`` (its start's journal position),
  or ``child:<parent id>:<session>:key:<key>`` for ``ctx.child(..., key=...)``, so
  that a parent that replays finds the child it started.

A client that could submit a run under such a key would take that run's place: at
the due time the schedule would start nothing (the key names the client's run), and
the parent would find a run that is not its child. So these prefixes are reserved
(DESIGN §11): :func:`check_client_key` refuses them on every path a client submits
by (``app.submit``, ``app.run``, ``POST /runs``, ``mainspring submit``).
"""

from __future__ import annotations

from datetime import UTC, datetime

from ._errors import ConfigError

__all__ = [
    "CHILD_KEY_PREFIX",
    "RESERVED_KEY_PREFIXES",
    "SCHEDULE_KEY_PREFIX",
    "check_client_key",
    "child_key",
    "schedule_key",
    "schedule_key_due",
]

SCHEDULE_KEY_PREFIX = "schedule:"
CHILD_KEY_PREFIX = "child:"
RESERVED_KEY_PREFIXES: tuple[str, ...] = (SCHEDULE_KEY_PREFIX, CHILD_KEY_PREFIX)


_ISO = "%Y-%m-%dT%H:%M:%SZ"


def schedule_key(name: str, due_at: float) -> str:
    """The key of the run schedule ``name`` starts for ``due_at``:
    ``schedule:<name>:<due time, UTC, ISO 8601>``."""
    return f"{SCHEDULE_KEY_PREFIX}{name}:{datetime.fromtimestamp(due_at, UTC).strftime(_ISO)}"


def schedule_key_due(key: str, name: str) -> float | None:
    """The due time :func:`schedule_key` wrote into ``key`` for schedule ``name``
    (``None``: not such a key)."""
    head = f"{SCHEDULE_KEY_PREFIX}{name}:"
    if not key.startswith(head):
        return None
    try:
        return datetime.strptime(key[len(head) :], _ISO).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def child_key(parent: str, session: int, seq: int, key: str | None = None) -> str:
    """The key of the child run that ``parent`` starts at ``session:seq``; with the
    caller's ``key``, of the child that key names in that session (a key names one
    child per session: ``continue_as_new`` starts afresh)."""
    if key is None:
        return f"{CHILD_KEY_PREFIX}{parent}:{session}:{seq}"
    return f"{CHILD_KEY_PREFIX}{parent}:{session}:key:{key}"


def check_client_key(key: str | None) -> None:
    """Raise :class:`ConfigError` if a client may not submit a run under ``key``
    (it starts with a prefix the system derives keys under)."""
    if key is None:
        return
    for prefix in RESERVED_KEY_PREFIXES:
        if key.startswith(prefix):
            raise ConfigError(
                f"key {key!r} starts with {prefix!r}, a prefix reserved for the keys "
                f"mainspring derives (reserved: {', '.join(map(repr, RESERVED_KEY_PREFIXES))}); "
                "choose a key that does not start with one of them"
            )
