"""What a worker needs of the application it works for.

The worker sits below :class:`~mainspring.App`: it knows the App only through this
protocol (the store, the clock, the workflows by name, the lease settings, where to
report, and the engine that executes steps), so ``App`` is one host among possible
others and the worker never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Any, Protocol

from .._clock import Clock
from ..journal import Committer, Engine, Workflow
from ..storage import RunRecord, Store

__all__ = ["ScheduleTicker", "WorkerHost", "WorkerTelemetry"]


class WorkerTelemetry(Protocol):
    """Where a worker reports its load and the runs it holds (live metrics)."""

    def worker_load(self, worker_id: str, active: int, concurrency: int | None) -> None:
        """``active`` runs of ``concurrency`` in hand; ``concurrency=None``: stopped."""

    def worker_alive(self, worker_id: str, now: float) -> None:
        """The worker's heartbeat succeeded at ``now`` (called from its heartbeat thread)."""

    def run_claimed(self, record: RunRecord) -> None:
        """The worker claimed ``record``."""

    def run_dead_lettered(self, workflow: str) -> None:
        """A claim of the worker dead-lettered a run of ``workflow``."""

    def run_refused(self, workflow: str) -> None:
        """The worker's code could not replay a run of ``workflow``: it left the run
        for a worker whose code can."""

    def run_released(self, run_id: str) -> None:
        """The worker let go of ``run_id`` (finished, suspended, given back or lost)."""

    def flush(self) -> None:
        """Export what is still batched (the worker is stopping)."""


class ScheduleTicker(Protocol):
    """The host's schedules, as a worker fires them (``app.schedules``)."""

    def tick(self) -> list[str]:
        """Fire the schedules that are due now (at most one run per due time across
        every worker); the ids of the runs this call started."""


class WorkerHost(Protocol):
    """What a :class:`~mainspring.worker.Worker` executes runs with
    (:class:`~mainspring.App` is one)."""

    @property
    def store(self) -> Store:
        """The store, opened (and migrated) on first use; may raise ``StoreUnavailable``."""

    @property
    def clock(self) -> Clock:
        """Time for leases, wake-ups and the journal."""

    @property
    def workflows(self) -> Mapping[str, Workflow[Any, Any]]:
        """The workflows this worker may claim runs of, by name."""

    @property
    def version(self) -> str | None:
        """The code version of the host's workflows (``None``: none declared): its
        workers claim runs of this version and runs with no version by default."""

    @property
    def lease_s(self) -> float:
        """How long a claim lasts without a heartbeat."""

    @property
    def heartbeat_s(self) -> float:
        """How often leases are extended."""

    @property
    def max_recoveries(self) -> int:
        """Recoveries in a row without progress before a run is dead-lettered."""

    @property
    def poll_interval_s(self) -> float:
        """How often an idle worker looks for runnable runs."""

    @property
    def telemetry(self) -> WorkerTelemetry:
        """Where the worker reports its load and the runs it holds."""

    @property
    def schedules(self) -> ScheduleTicker:
        """The host's schedules, which the worker ticks about once a second."""

    def engine(self, committer: Committer, threads: Executor) -> Engine:
        """The engine that executes steps for a worker committing through ``committer``
        and running synchronous steps on ``threads`` (randomness, retry policy,
        redaction and step interceptors are the host's)."""
