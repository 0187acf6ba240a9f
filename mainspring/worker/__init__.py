"""Workers: claim runs, keep leases, execute many runs at once."""

from ._host import WorkerHost, WorkerTelemetry
from ._offload import Offload as Offload
from ._worker import Worker, WorkerStats
from ._worker import accepted_versions as accepted_versions

__all__ = ["Worker", "WorkerHost", "WorkerStats", "WorkerTelemetry"]

# For the floors above (see docs/architecture.md, "Layers"), never for users:
__internal__ = ("Offload", "accepted_versions")
