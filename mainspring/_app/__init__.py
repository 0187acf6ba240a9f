"""``App``: the registry of workflows over one store, and the way to start runs.

``_core`` holds the App itself (registration, runs, looking and steering), ``_admin``
its API keys and webhooks, ``_lineage`` forks and retries.
"""

from ._core import DEFAULT_URL, App
from ._handle import RunHandle
from ._lineage import local_user
from ._queues import Queue

__all__ = ["DEFAULT_URL", "App", "Queue", "RunHandle", "local_user"]
