"""Workers: claim runs, keep leases, execute many runs at once."""

from ._worker import Worker, WorkerStats

__all__ = ["Worker", "WorkerStats"]
