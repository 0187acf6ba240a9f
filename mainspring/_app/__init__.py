"""``App``: the registry of workflows over one store, and the way to start runs.

``_core`` holds the App itself (registration, runs, looking and steering), ``_admin``
its API keys and webhooks, ``_lineage`` forks and retries, ``_schedules`` cron
schedules.
"""

from ._core import DEFAULT_URL, App
from ._handle import RunHandle
from ._lineage import local_user
from ._queues import Queue
from ._schedules import Schedule
from ._streams import TokenEvent, TokenFollower

__all__ = [
    "DEFAULT_URL",
    "App",
    "Queue",
    "RunHandle",
    "Schedule",
    "TokenEvent",
    "TokenFollower",
    "local_user",
]
