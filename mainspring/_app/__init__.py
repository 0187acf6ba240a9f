"""``App``: the registry of workflows over one store, and the way to start runs.

``_core`` holds the App itself (its core verbs: registration, runs, looking and
steering) and ``_runtime`` the one value its parts share; the parts are ``_admin``
(``app.admin``: API keys and webhooks), ``_agents``, ``_children``, ``_lineage`` (forks
and retries), ``_mcp`` (``app.mcp``), ``_observe`` (``app.observe``), ``_queues``
(``app.queues``), ``_replay_check`` (the replay gate), ``_schedules``
(``app.schedules``: cron schedules), ``_shadow`` (the shadow lab: ``_shadow_journal``,
``_shadow_verdict``, ``_shadow_app``) and ``_streams``.
"""

from ._core import DEFAULT_URL, App
from ._handle import RunHandle
from ._lineage import local_user
from ._queues import Queue
from ._replay_check import ReplayReport, RunCheck
from ._schedules import Schedule
from ._shadow_journal import RecordedRun
from ._shadow_verdict import ArgumentChange, ShadowReport, ShadowRun, ShadowSide, StubAnswer
from ._streams import TokenEvent, TokenFollower

__all__ = [
    "DEFAULT_URL",
    "App",
    "ArgumentChange",
    "Queue",
    "RecordedRun",
    "ReplayReport",
    "RunCheck",
    "RunHandle",
    "Schedule",
    "ShadowReport",
    "ShadowRun",
    "ShadowSide",
    "StubAnswer",
    "TokenEvent",
    "TokenFollower",
    "local_user",
]
