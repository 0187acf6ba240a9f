"""The suspended executions a sticky worker keeps, to resume them without a replay.

A run that suspends (a short sleep, a wait) on a sticky worker leaves its live
execution here; when the same worker claims the run again it resumes that
execution instead of replaying the journal. Any worker may claim the run
meanwhile: the keeper's copy then no longer matches the run's epoch, and the
sweep drops it. Bounded by count and by a rough size, least recently kept first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from ..journal import Execution

__all__ = ["Kept"]


class Kept:
    """Kept executions by run id, oldest first, within ``runs`` and ``bytes``."""

    def __init__(self, *, runs: int, bytes: int) -> None:
        self.runs = max(0, runs)
        self.bytes = max(0, bytes)
        self._by_run: OrderedDict[str, Execution] = OrderedDict()
        self._size = 0
        self.swept_at = 0.0

    def __bool__(self) -> bool:
        return bool(self._by_run)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_run)

    def items(self) -> list[tuple[str, Execution]]:
        return list(self._by_run.items())

    def get(self, run_id: str) -> Execution | None:
        return self._by_run.get(run_id)

    def keep(self, ex: Execution) -> None:
        """Keep ``ex`` (the newest), dropping the oldest beyond the bounds."""
        if self.runs == 0:
            ex.drop()
            return
        old = self._by_run.pop(ex.run_id, None)
        if old is not None and old is not ex:
            self._forget(old)
        self._by_run[ex.run_id] = ex
        ex.kept_bytes = ex.size
        self._size += ex.kept_bytes
        while self._by_run and (len(self._by_run) > self.runs or self._size > self.bytes):
            _, oldest = self._by_run.popitem(last=False)
            self._forget(oldest)

    def take(self, run_id: str) -> Execution | None:
        """The execution kept for ``run_id``, no longer kept (the caller resumes it)."""
        ex = self._by_run.pop(run_id, None)
        if ex is not None:
            self._size -= ex.kept_bytes
        return ex

    def drop_all(self) -> None:
        while self._by_run:
            _, ex = self._by_run.popitem()
            self._forget(ex)
        self._size = 0

    def drop_gone(self, seen: list[tuple[str, Execution]], gone: list[str]) -> None:
        """Drop the executions of ``gone`` runs, if still the ones ``seen`` (a run kept
        again meanwhile holds a newer execution, which stays)."""
        was = dict(seen)
        for run_id in gone:
            ex = self._by_run.get(run_id)
            if ex is not None and was.get(run_id) is ex:
                self._forget(self._by_run.pop(run_id))

    def due(self, now: float) -> list[str]:
        """Kept runs whose wake time has come."""
        return [r for r, ex in self._by_run.items() if ex.wake_at is not None and ex.wake_at <= now]

    def next_wake(self, now: float, within: float) -> float:
        """Seconds until the first kept run is due, at most ``within``."""
        wait = within
        for ex in self._by_run.values():
            if ex.wake_at is not None:
                wait = min(wait, max(0.0, ex.wake_at - now))
        return wait

    def _forget(self, ex: Execution) -> None:
        self._size -= ex.kept_bytes
        ex.drop()
