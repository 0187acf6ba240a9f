"""Schedules: cron expressions that start runs of a workflow, fired by whichever
worker ticks first (docs/schedules-and-queues.md). ``app.schedules``, a part of
:class:`~mainspring.App`.

A schedule is declared in code (``app.schedules.add``) or in a file
(``app.schedules.load``); a worker writes the declarations to the store's
``ms_schedules`` table at its first tick and then, at every tick, fires the due
schedules through :meth:`~mainspring.storage.Store.fire_schedule` (one worker wins
each due time; the run's key is ``schedule:<name>:<due time in UTC>``). Cron times
are computed in ``_cron.py``; due times are compared with the database's clock
(:meth:`Schedules.now`).
"""

from __future__ import annotations

import builtins
import logging
import os
from collections.abc import Callable, ItemsView, Iterator, KeysView, ValuesView
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, overload

from .._clock import SystemClock
from .._config import config_entries
from .._cron import check_cron, check_zone, iso, next_due, previous_due
from .._errors import ConfigError, ScheduleNotFound
from .._keys import schedule_key
from ..journal import Workflow
from ..storage import CatchUp, ScheduleRecord
from ._lineage import new_id
from ._queues import Queue, Queues
from ._runtime import Part, Runtime, deprecated

__all__ = [
    "SKIP_GRACE_S",
    "Schedule",
    "Schedules",
    "next_due",
    "previous_due",
    "schedule_key",
]

log = logging.getLogger("mainspring")

SKIP_GRACE_S = 60.0
"""Under ``catch_up="skip"``, how late a due time may be and still start its run."""

_CATCH_UPS: tuple[CatchUp, ...] = ("skip", "once")

W = TypeVar("W", bound=Workflow[Any, Any])


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """A schedule as declared: ``workflow`` started with ``args``/``kwargs`` at every
    time ``cron`` (five fields: minute hour day-of-month month day-of-week) names in
    zone ``tz``, in ``queue`` (within its limits) if one is named."""

    name: str
    cron: str
    workflow: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    tz: str = "UTC"
    catch_up: CatchUp = "skip"
    queue: str | None = None


class Schedules(Part):
    """``app.schedules``: declaring (:meth:`add`, :meth:`load`), firing (:meth:`sync`,
    :meth:`tick`, what workers call), listing and pausing schedules.

    For one release it is also the mapping of the declared schedules that
    ``app.schedules`` was (``app.schedules["nightly"]``), with a ``DeprecationWarning``:
    read :attr:`declared` instead.
    """

    def __init__(self, runtime: Runtime, queues: Queues) -> None:
        super().__init__(runtime)
        self._queues = queues  # the queues a schedule may start its runs in
        self._declared: dict[str, Schedule] = {}  # by name, as this App declares them
        self._synced = False  # written to the store since the last declaration

    @overload
    def add(
        self,
        cron: str,
        /,
        *,
        name: str | None = None,
        tz: str = "UTC",
        catch_up: CatchUp = "skip",
        queue: Queue | str | None = None,
    ) -> Callable[[W], W]: ...

    @overload
    def add(
        self,
        name: str,
        cron: str,
        workflow: Workflow[Any, Any] | str,
        /,
        *args: Any,
        tz: str = "UTC",
        catch_up: CatchUp = "skip",
        queue: Queue | str | None = None,
        **kwargs: Any,
    ) -> Schedule: ...

    def add(
        self,
        name_or_cron: str,
        cron: str | None = None,
        workflow: Workflow[Any, Any] | str | None = None,
        /,
        *args: Any,
        name: str | None = None,
        tz: str = "UTC",
        catch_up: CatchUp = "skip",
        queue: Queue | str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Start ``workflow(*args, **kwargs)`` at every time a cron expression names.

        Two forms::

            app.schedules.add("nightly", "0 3 * * *", report, "all", tz="Europe/Paris")

            @app.schedules.add("0 9 * * 1-5", tz="America/New_York")  # named after it
            @app.workflow
            async def standup(ctx): ...

        Args:
            tz: the IANA zone the cron's times are wall times of.
            catch_up: what a worker does with due times missed while no worker ran:
                ``"skip"`` starts none of them (only a time at most 60 seconds
                late runs); ``"once"`` starts one run, for the
                most recent. Either way the schedule then resumes at its next time.
            queue: a queue declared with ``app.queues.add`` (or its name): the runs the
                schedule starts wait their turn there, within its limits.

        Raises:
            ConfigError: a bad cron expression, zone, catch-up or name, or a queue
                this App did not declare.
            UnknownWorkflow: the workflow is not registered in this App.
        """
        if cron is None:
            if workflow is not None or args or kwargs:
                raise ConfigError(
                    "app.schedules.add(cron) as a decorator takes only the cron expression "
                    "and name=, tz=, catch_up=, queue=; to pass arguments, call "
                    "app.schedules.add(name, cron, workflow, *args)"
                )
            cron_expr = name_or_cron

            def decorate(target: Any) -> Any:
                if not isinstance(target, Workflow):
                    raise ConfigError(
                        "@app.schedules.add(...) decorates a workflow: put it above @app.workflow"
                    )
                self._declare(name or target.name, cron_expr, target, (), {}, tz, catch_up, queue)
                return target

            return decorate
        if workflow is None:
            raise ConfigError(f"schedule {name_or_cron!r}: name the workflow it starts")
        if name is not None:
            raise ConfigError("app.schedules.add(name, cron, workflow): name= is for the decorator")
        return self._declare(name_or_cron, cron, workflow, args, kwargs, tz, catch_up, queue)

    def _declare(
        self,
        name: str,
        cron: str,
        workflow: Workflow[Any, Any] | str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        tz: str,
        catch_up: str,
        queue: Queue | str | None = None,
    ) -> Schedule:
        where = f"schedule {name!r}"
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise ConfigError(f"{where}: a schedule's name is a non-empty string")
        check_cron(cron, where)
        check_zone(tz, where)
        if catch_up not in _CATCH_UPS:
            raise ConfigError(f"{where}: catch_up must be 'skip' or 'once', not {catch_up!r}")
        queue_name = queue.name if isinstance(queue, Queue) else queue
        if queue_name is not None and queue_name not in self._queues.declared:
            raise ConfigError(
                f"{where}: queue {queue_name!r} is not declared in this App; declare it first "
                f"with app.queues.add({queue_name!r}, concurrency=...)"
            )
        found = self._get_workflow(workflow)
        found.encode_input(tuple(args), dict(kwargs))  # arguments it cannot take fail now
        declared = Schedule(
            name=name,
            cron=cron,
            workflow=found.name,
            args=tuple(args),
            kwargs=dict(kwargs),
            tz=tz,
            catch_up=catch_up,  # checked above
            queue=queue_name,
        )
        self._declared[name] = declared
        self._synced = False
        return declared

    def load(self, path: str | os.PathLike[str]) -> builtins.list[Schedule]:
        """Declare the schedules a TOML or JSON file lists.

        TOML::

            [[schedule]]
            name = "nightly-report"
            cron = "0 3 * * *"
            workflow = "report"          # a registered workflow's name
            args = ["all"]               # optional
            kwargs = {}                  # optional
            tz = "Europe/Paris"          # optional, default UTC
            catch_up = "once"            # optional, default skip
            queue = "reports"            # optional: a queue the App declares

        JSON: ``{"schedule": [{"name": ..., "cron": ..., "workflow": ...}]}``.

        Raises:
            ConfigError: the file is missing, unreadable, or an entry is wrong (the
                message names the file, the entry and the field).
        """
        file = Path(path)
        entries = config_entries(file, what="schedules", key="schedule")
        out: builtins.list[Schedule] = []
        fields = {"name", "cron", "workflow", "args", "kwargs", "tz", "catch_up", "queue"}
        for i, entry in enumerate(entries, 1):
            where = f"schedules file {str(file)!r}, entry {i}"
            if not isinstance(entry, dict):
                raise ConfigError(f"{where}: expected a table of fields")
            if unknown := sorted(set(entry) - fields):
                raise ConfigError(f"{where}: unknown field(s) {unknown}; known: {sorted(fields)}")
            for needed in ("name", "cron", "workflow"):
                if not isinstance(entry.get(needed), str):
                    raise ConfigError(f"{where}: {needed!r} is required (a string)")
            if not isinstance(entry.get("queue", ""), str):
                raise ConfigError(f"{where}: 'queue' is a queue's name (a string)")
            args, kwargs = entry.get("args", []), entry.get("kwargs", {})
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise ConfigError(f"{where}: 'args' is a list and 'kwargs' a table")
            try:
                out.append(
                    self._declare(
                        entry["name"],
                        entry["cron"],
                        entry["workflow"],
                        tuple(args),
                        kwargs,
                        str(entry.get("tz", "UTC")),
                        str(entry.get("catch_up", "skip")),
                        entry.get("queue"),
                    )
                )
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
        return out

    def now(self) -> float:
        """The time schedules are due by: the database's clock
        (:meth:`~mainspring.storage.Store.database_now`) when this App runs on the
        real clock, so that workers whose clocks disagree still fire each due time
        once, never early and never skipping one; the App's own clock when it is a
        fake one (tests move it by hand)."""
        if isinstance(self._clock, SystemClock):
            return self._store.database_now()
        return self._clock.now()

    @property
    def declared(self) -> dict[str, Schedule]:
        """The schedules declared in this App, by name."""
        return dict(self._declared)

    def sync(self) -> None:
        """Write this App's declared schedules to the store (a worker does at its
        first tick). A new schedule, or one whose definition changed, is next due at
        its first time after now; an unchanged one keeps its state."""
        now = self.now()
        for declared in self._declared.values():
            found = self._get_workflow(declared.workflow)
            encoded = self._redact(found.encode_input(declared.args, declared.kwargs))
            if declared.queue is not None:
                # The queue's declared limits, in the store before its first run.
                self._queues._fields(declared.queue, None, 0)
            _, changed = self._store.put_schedule(
                name=declared.name,
                cron=declared.cron,
                tz=declared.tz,
                workflow=declared.workflow,
                input=encoded,
                catch_up=declared.catch_up,
                next_at=next_due(declared.cron, declared.tz, now),
                now=now,
                queue=declared.queue,
            )
            if changed:
                log.info("schedule %s: %s in %s", declared.name, declared.cron, declared.tz)
        self._synced = True

    def tick(self) -> builtins.list[str]:
        """Fire the schedules due now: for each, start at most one run (see
        ``catch_up``) and move it to its next time. Safe from any number of workers
        at once: each due time starts one run. Returns the ids of the runs this call
        started."""
        if not self._synced:
            self.sync()
        now = self.now()
        started: builtins.list[str] = []
        for row in self._store.due_schedules(now):
            try:
                latest = max(previous_due(row.cron, row.tz, now), row.next_at)
                due = latest if row.catch_up == "once" or now - latest <= SKIP_GRACE_S else None
                run = self._store.fire_schedule(
                    name=row.name,
                    seen_next_at=row.next_at,
                    next_at=next_due(row.cron, row.tz, now),
                    due_at=due,
                    run_id=new_id(),
                    key=schedule_key(row.name, latest),
                    version=self._version,
                    now=now,
                )
            except ConfigError as exc:  # a row another version wrote that this one cannot read
                log.warning("schedule %s: cannot fire it: %s", row.name, exc)
                continue
            if run is not None:
                started.append(run)
                log.info("schedule %s: started run %s for %s", row.name, run, iso(latest))
        return started

    def list(self) -> builtins.list[ScheduleRecord]:
        """Every schedule in the store (those some worker has synced), by name."""
        return self._store.list_schedules()

    def get(self, name: str) -> ScheduleRecord:
        """The stored schedule ``name``.

        Raises:
            ScheduleNotFound: no schedule has that name in the store.
        """
        found = self._store.get_schedule(name)
        if found is None:
            raise ScheduleNotFound(f"no schedule named {name!r}")
        return found

    def pause(self, name: str) -> ScheduleRecord:
        """Stop ``name`` from starting runs (on every worker) until resumed.

        Raises:
            ScheduleNotFound: no schedule has that name in the store.
        """
        if not self._store.set_schedule_paused(name, True, now=self.now()):
            raise ScheduleNotFound(f"no schedule named {name!r}")
        return self.get(name)

    def resume(self, name: str) -> ScheduleRecord:
        """Let ``name`` start runs again, from its next time after now: the times
        that passed while it was paused start nothing, whatever its catch-up.

        Raises:
            ScheduleNotFound: no schedule has that name in the store.
        """
        row = self.get(name)
        now = self.now()
        if row.paused:
            self._store.set_schedule_paused(
                name, False, now=now, next_at=next_due(row.cron, row.tz, now)
            )
        return self.get(name)

    # -- the mapping app.schedules was, for one release ------------------------------

    def _as_mapping(self) -> dict[str, Schedule]:
        deprecated(
            "app.schedules as a mapping of the declared schedules is deprecated: "
            "use app.schedules.declared",
            stacklevel=3,
        )
        return self._declared

    def __getitem__(self, name: str) -> Schedule:
        return self._as_mapping()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self._as_mapping()))

    def __len__(self) -> int:
        return len(self._as_mapping())

    def __contains__(self, name: object) -> bool:
        return name in self._as_mapping()

    def keys(self) -> KeysView[str]:
        return dict(self._as_mapping()).keys()

    def values(self) -> ValuesView[Schedule]:
        return dict(self._as_mapping()).values()

    def items(self) -> ItemsView[str, Schedule]:
        return dict(self._as_mapping()).items()
