"""Workers: claim runs, keep leases, execute many runs at once."""

from ._host import WorkerHost, WorkerTelemetry
from ._worker import Worker, WorkerStats

__all__ = ["Worker", "WorkerHost", "WorkerStats", "WorkerTelemetry"]
