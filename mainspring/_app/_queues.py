"""Queues as an App declares them (docs/schedules-and-queues.md), and what a run
submitted to one tells the store: ``app.queues``, a part of :class:`~mainspring.App`
(whose ``submit`` takes ``queue=``); the store enforces the limits
(``storage/_queues.py``)."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError
from ..storage import QueueRecord, check_queue_limits
from ._runtime import Part, Runtime, deprecated

__all__ = ["Queue", "Queues"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Queue:
    """A named queue and its limits, enforced across every worker of the store.

    Attributes:
        name: what runs are submitted to (``app.submit(wf, queue="emails")``).
        concurrency: runs of the queue running at once (``None``: no limit).
        per_key: runs of one ``queue_key`` running at once (``1``: one at a time per
            customer; ``None``: no limit).
        rate: starts per second (``None``: no limit); up to ``burst`` may start back
            to back.
    """

    name: str
    concurrency: int | None = None
    per_key: int | None = None
    rate: float | None = None
    burst: int = 1


class Queues(Part):
    """``app.queues``: declaring queues (:meth:`add`) and listing them (:meth:`list`)."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        self._declared: dict[str, Queue] = {}  # by name, as this App declares them
        self._written: set[str] = set()  # whose limits this process wrote to the store

    def __call__(self) -> builtins.list[QueueRecord]:
        """Deprecated: ``app.queues()`` is ``app.queues.list()``."""
        deprecated("app.queues() is deprecated: use app.queues.list()")
        return self.list()

    @property
    def declared(self) -> dict[str, Queue]:
        """The queues declared in this App, by name."""
        return dict(self._declared)

    def add(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        per_key: int | None = None,
        rate: float | None = None,
        burst: int = 1,
    ) -> Queue:
        """Declare the queue ``name`` with its limits (``app.queues.add("emails",
        concurrency=2)``); submit to it with ``app.submit(wf, ..., queue=name)``.

        The limits are written to the store with the first run submitted to the
        queue from this process (the store keeps the last declaration written), and
        every worker of the store enforces them: a run in the queue starts only when
        the queue has fewer than ``concurrency`` runs running, its ``queue_key`` fewer
        than ``per_key``, and the rate admits a start. Only running runs hold a slot;
        a sleeping or waiting run gives its slot back until it wakes.

        Raises:
            ConfigError: a limit is not valid, or the name was declared with other
                limits.
        """
        check_queue_limits(name, concurrency, per_key, rate, burst)
        declared = Queue(
            name=name, concurrency=concurrency, per_key=per_key, rate=rate, burst=burst
        )
        known = self._declared.get(name)
        if known is not None and known != declared:
            raise ConfigError(f"queue {name!r} is already declared with other limits: {known!r}")
        self._declared[name] = declared
        return declared

    def list(self) -> builtins.list[QueueRecord]:
        """Every queue in the store with its limits and how many of its runs are
        running, queued and sleeping or waiting."""
        return self._store.queues()

    def _fields(self, queue: str | None, queue_key: str | None, priority: int) -> dict[str, Any]:
        """What :meth:`Store.create_run` is told of a run's queue, once the queue is
        known to be declared and its limits written."""
        if queue is None:
            if queue_key is not None or priority:
                raise ConfigError(
                    f"queue_key={queue_key!r} and priority={priority!r} need a queue: "
                    "submit(..., queue=...)"
                )
            return {}
        declared = self._declared.get(queue)
        if declared is None:
            raise ConfigError(
                f"queue {queue!r} is not declared in this App; declare it first with "
                f"app.queues.add({queue!r}, concurrency=..., per_key=..., rate=...)"
            )
        if queue_key is not None and (not isinstance(queue_key, str) or len(queue_key) > 200):
            raise ConfigError(
                f"queue_key must be a string of at most 200 characters, not {queue_key!r}"
            )
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > 2**31 - 1:
            raise ConfigError(f"priority must be an int (higher starts first), not {priority!r}")
        if queue not in self._written:
            self._store.declare_queue(
                queue,
                concurrency=declared.concurrency,
                per_key=declared.per_key,
                rate=declared.rate,
                burst=declared.burst,
                now=self._clock.now(),
            )
            self._written.add(queue)
        return {"queue": queue, "queue_key": queue_key, "priority": priority}
