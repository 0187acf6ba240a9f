"""Runs a worker's code could not replay, left for a while to workers whose code can.

A rolling deploy runs old and new code on one database. A run that new code took past
a change (a ``ctx.patched`` marker and the new steps after it) cannot be replayed by
an old worker, nor an old run by code that dropped its branch. The executor gives such
a run back without failing it (``Store.refuse``: due at once for everyone else, no
recovery counted); the worker keeps out of its way: its claims skip the run for
``skip_s``, so the worker's code, which does not change while it lives, is not tried
on it again and again, and the others get to it first. It says so where an operator
looks: a WARNING line, and ``mainspring_replays_refused_total``.
"""

from __future__ import annotations

import asyncio
import heapq
import logging

from .._clock import Clock
from .._errors import MainspringError, StoreError, StoreUnavailable
from ..storage import RunRecord, Store
from ._host import WorkerTelemetry

__all__ = ["Refusals"]

log = logging.getLogger("mainspring.worker")

# Runs remembered at most (the oldest forgotten first): a bound on the skip list
# every claim sends.
_MAX = 1000
# Replay errors kept for app.run to raise.
_MAX_ERRORS = 100


class Refusals:
    """The runs one worker refused, each skipped until its time is up."""

    def __init__(self, skip_s: float, worker_id: str) -> None:
        self.skip_s = skip_s
        self.worker_id = worker_id
        self.errors: dict[str, MainspringError] = {}  # the last ones, with why (app.run)
        self._until: dict[str, float] = {}
        self._order: list[tuple[float, str]] = []  # (until, run id), a heap

    def add(self, run_id: str, now: float) -> None:
        """This worker's code could not replay ``run_id`` at ``now``."""
        until = now + self.skip_s
        self._until[run_id] = until
        heapq.heappush(self._order, (until, run_id))
        self._expire(now)
        while len(self._until) > _MAX:
            _, oldest = heapq.heappop(self._order)
            self._until.pop(oldest, None)

    def skipping(self, now: float) -> list[str]:
        """The runs to leave alone now."""
        self._expire(now)
        return list(self._until)

    def tell(
        self, record: RunRecord, error: MainspringError, now: float, telemetry: WorkerTelemetry
    ) -> None:
        """The executor gave ``record`` back: remember it, count it, log it."""
        self.add(record.id, now)
        self.errors[record.id] = error
        while len(self.errors) > _MAX_ERRORS:
            del self.errors[next(iter(self.errors))]
        telemetry.run_refused(record.workflow)
        log.warning(
            "event=refused worker=%s run=%s workflow=%s skip_s=%g error=%r: this code "
            "cannot replay the run; it was left for a worker whose code can (a rolling "
            "deploy: old and new code side by side), never failed",
            self.worker_id,
            record.id,
            record.workflow,
            self.skip_s,
            f"{error.step or '?'}: {error.message}"[:400],
        )

    async def hand_back(
        self, store: Store, clock: Clock, claimed: list[RunRecord], skip: list[str]
    ) -> list[RunRecord]:
        """``claimed`` but the runs in ``skip``: a claim in flight while a run was
        given back can take it again. Those go straight back as they were (no replay,
        no refusal counted)."""
        avoid = set(skip)
        for record in claimed:
            if record.id not in avoid:
                continue
            try:
                await asyncio.to_thread(
                    store.refuse,
                    record.id,
                    record.epoch,
                    clock.now(),
                    error=record.error or "{}",
                    at="",
                    worker=self.worker_id,
                    again=True,
                )
            except (StoreUnavailable, StoreError) as exc:  # its lease expires instead
                log.warning(
                    "worker %s: cannot give run %s back: %s", self.worker_id, record.id, exc
                )
        return [r for r in claimed if r.id not in avoid]

    def _expire(self, now: float) -> None:
        while self._order and self._order[0][0] <= now:
            until, run_id = heapq.heappop(self._order)
            if self._until.get(run_id) == until:
                del self._until[run_id]
