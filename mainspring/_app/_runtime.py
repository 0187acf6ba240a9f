"""What every part of an App works with, built once in ``App.__init__``.

An App is a handful of plain parts (admin, agents, children, lineage, MCP servers,
observation, queues, schedules, streams), each an object over one shared
:class:`Runtime`: the store, the clock and randomness, redaction, rate limits, the
worker settings and the registries of workflows, tools and agents. A part reads the
runtime's names through :class:`Part` (``self._store``, ``self._clock``: private, so
that a part offered as a namespace shows only its own methods). The App offers some
parts as namespaces (``app.schedules``), lends itself a few of their methods
(:class:`Via`) and keeps the methods that moved into a namespace for one release under
their old names (:class:`Moved`), so that one object is shared by reference and nothing
is created lazily by whichever method runs first.
"""

from __future__ import annotations

import inspect
import os
import random
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from .._clock import Clock
from .._errors import ConfigError, RunNotFound, UnknownWorkflow
from ..agent import Agent
from ..journal import RetryPolicy, StepInterceptor, Workflow
from ..limits import Price, RateLimit, RateLimits, load_rate_limits
from ..observability import Redactor, Telemetry
from ..storage import RunRecord, Store, open_store, redact_url
from ..tools import ToolRegistry
from ._handle import RunHandle, run_id_of

__all__ = [
    "DEFAULT_URL",
    "Moved",
    "Part",
    "Runtime",
    "Via",
    "deprecated",
    "rate_limits_of",
    "takes_options_of",
]

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")

DEFAULT_URL = "sqlite:///mainspring.db"


@dataclass(kw_only=True, eq=False)
class Runtime:
    """An App's shared state and settings (see :class:`~mainspring.App`'s arguments).

    Built once; every part holds this same object. Its registries grow as workflows,
    tools and agents are registered, and the worker settings (``lease_s``,
    ``heartbeat_s``, ``max_recoveries``) may be set again before a worker starts (the
    CLI's ``--lease-s``); nothing else is replaced after construction.
    """

    database: InitVar[str | Store | None]
    clock: Clock
    rng: random.Random
    lease_s: float
    heartbeat_s: float
    max_recoveries: int
    inline_wait_s: float
    default_retry: RetryPolicy
    poll_interval_s: float
    redactor: Redactor | None
    rate_limits: RateLimits | None
    interceptors: tuple[StepInterceptor, ...]
    version: str | None
    workflows: dict[str, Workflow[Any, Any]] = field(default_factory=dict)
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    agents: dict[str, Agent] = field(default_factory=dict)
    # what this process's workers execute, counted as it happens (see observability)
    telemetry: Telemetry = field(init=False)
    _url: str | None = field(init=False)
    _store: Store | None = field(init=False)

    def __post_init__(self, database: str | Store | None) -> None:
        # None: MAINSPRING_DATABASE_URL (or the default), read when the store opens, so
        # a module-level App follows the environment of the process that uses it.
        self._url = database.url if isinstance(database, Store) else database
        self._store = database if isinstance(database, Store) else None
        self.telemetry = Telemetry(self.clock, prices=self.prices)
        self.telemetry.catalog = self.metric_catalog  # counters at 0 before they move

    @property
    def url(self) -> str:
        """The database URL (resolved from the environment if none was given)."""
        if self._url is None:
            return os.environ.get("MAINSPRING_DATABASE_URL", DEFAULT_URL)
        return self._url

    @property
    def store(self) -> Store:
        """The store, opened (and migrated) on first use."""
        if self._store is None:
            self._url = self.url
            self._store = open_store(self._url)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    def register(self, fn: Callable[..., Awaitable[Any]], name: str | None) -> Workflow[Any, Any]:
        """Register ``fn`` as the workflow ``name`` (its function's name by default)."""
        wf: Workflow[Any, Any] = Workflow.create(fn, name)
        if wf.name in self.workflows and self.workflows[wf.name].fn is not fn:
            raise ConfigError(f"a workflow named {wf.name!r} is already registered")
        self.workflows[wf.name] = wf
        return wf

    def get_workflow(self, workflow: Workflow[Any, Any] | str) -> Workflow[Any, Any]:
        name = workflow if isinstance(workflow, str) else workflow.name
        found = self.workflows.get(name)
        if found is None:
            known = ", ".join(sorted(self.workflows)) or "none"
            raise UnknownWorkflow(
                f"no workflow named {name!r} is registered in this App (registered: {known})"
            )
        return found

    def get_run(self, run_id: str | RunHandle) -> RunRecord:
        run_id = run_id_of(run_id)
        record = self.store.get_run(run_id)
        if record is None:
            raise RunNotFound(f"no run {run_id!r} in {redact_url(self.url)!r}")
        return record

    def redact(self, text: str) -> str:
        """JSON text as it may be stored (and so served): secrets redacted."""
        return text if self.redactor is None else self.redactor.redact_json(text)

    def prices(self, workflow: str) -> dict[str, Price] | None:
        """The prices of the agent ``workflow`` runs, if it is one that declared some."""
        spec = self.agents.get(workflow)
        return spec.prices if spec is not None else None

    def metric_catalog(self) -> tuple[list[str], list[tuple[str, str]]]:
        """The workflows and agents' ``(workflow, logical model)`` whose counters a
        scrape reports at 0 before their first event."""
        agents = [
            (name, f"{a.resolved_model.provider}:{a.resolved_model.model_id}")
            for name, a in self.agents.items()
        ]
        return list(self.workflows), agents


class Part:
    """Base of an App's parts: the runtime they share, and the names of it their
    methods read. Private, so that a part offered as a namespace (``app.schedules``)
    shows only its own methods."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @property
    def _store(self) -> Store:
        return self._runtime.store

    @property
    def _clock(self) -> Clock:
        return self._runtime.clock

    @property
    def _redactor(self) -> Redactor | None:
        return self._runtime.redactor

    @property
    def _version(self) -> str | None:
        return self._runtime.version

    def _get_run(self, run_id: str | RunHandle) -> RunRecord:
        return self._runtime.get_run(run_id)

    def _get_workflow(self, workflow: Workflow[Any, Any] | str) -> Workflow[Any, Any]:
        return self._runtime.get_workflow(workflow)

    def _redact(self, text: str) -> str:
        return self._runtime.redact(text)


class Via(Generic[P, R]):
    """A method of the App that is a method of one of its parts: ``app.x(...)`` calls
    ``app.<part>.x(...)``. Read on the class it is the part's function, so ``help``,
    ``inspect.signature`` and the documentation show its signature and docstring; type
    checkers and editors see the part's parameters through ``P``."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self._part = part
        self._method = method
        self.__doc__ = method.__doc__
        self.__wrapped__ = method

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self._method.__name__:
            raise TypeError(f"{owner.__name__}.{name} delegates to {self._method.__name__}")

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Callable[Concatenate[Any, P], R]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, obj: object, owner: type | None = None) -> Callable[..., R]:
        if obj is None:
            return self._method
        bound: Callable[P, R] = self._method.__get__(getattr(obj, self._part))
        return bound


class Moved(Generic[P, R]):
    """An App method that moved under a namespace (the App's ``pause_schedule`` is now
    ``app.schedules.pause``): kept for one release, it warns with the new spelling
    each time it is read and then is the new method, parameters and all.

    ``namespace`` is the App attribute the method moved to; ``instead`` replaces the
    advice when the method left the public API (the engine's plumbing)."""

    def __init__(
        self, namespace: str, method: Callable[Concatenate[Any, P], R], *, instead: str = ""
    ) -> None:
        self._namespace = namespace
        self._method = method
        self._new = f"app.{namespace}.{method.__name__}"
        self._instead = instead or f"use {self._new}"
        self.__wrapped__ = method

    def __set_name__(self, owner: type, name: str) -> None:
        self._old = f"app.{name}"
        self.__doc__ = f"Deprecated: {self._instead} ({self._old} goes in the next release)."

    @property
    def old(self) -> str:
        """The old spelling (``"app.pause_schedule"``, deprecated)."""
        return self._old

    @property
    def new(self) -> str:
        """The new spelling (``app.schedules.pause``)."""
        return self._new

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Moved[P, R]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, obj: object, owner: type | None = None) -> Moved[P, R] | Callable[P, R]:
        if obj is None:
            return self
        deprecated(f"{self._old} is deprecated: {self._instead}")
        bound: Callable[P, R] = self._method.__get__(getattr(obj, self._namespace))
        return bound


def deprecated(message: str, *, stacklevel: int = 2) -> None:
    """Warn of a spelling that goes in the next release (``DeprecationWarning``: shown
    by default in ``__main__`` and under pytest, and an error under ``-W error``).
    ``stacklevel`` as :func:`warnings.warn`'s in the caller: 2 names its caller."""
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel + 1)


def takes_options_of(
    make: Callable[P, Any],
) -> Callable[[Callable[Concatenate[S, ...], R]], Callable[Concatenate[S, P], R]]:
    """A method whose parameters are ``make``'s (a constructor: ``app.mcp.add`` takes
    :class:`~mainspring.tools.MCPToolset`'s), so that they are declared once: type
    checkers see ``make``'s parameters, ``help`` and ``inspect.signature`` show them."""

    def decorate(method: Callable[Concatenate[S, ...], R]) -> Callable[Concatenate[S, P], R]:
        signature = inspect.signature(make)
        this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
        method.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[this, *signature.parameters.values()],
            return_annotation=inspect.signature(method).return_annotation,
        )
        return method

    return decorate


def rate_limits_of(
    given: Sequence[RateLimit] | RateLimits | str | os.PathLike[str] | bool | None,
) -> RateLimits | None:
    """``App(rate_limits=...)`` as the limits its agents book against."""
    if given is None or given is False:
        return None
    if given is True:
        return RateLimits()  # learned from the providers' headers
    if isinstance(given, RateLimits):
        return given
    if isinstance(given, str | os.PathLike):
        return RateLimits(load_rate_limits(given))
    return RateLimits(given)
