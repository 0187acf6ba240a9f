"""Effect classes, the context a tool sees when it runs, and the dependencies it
may ask for."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal

from typing_extensions import TypeVar

from .._errors import ConfigError

__all__ = ["DEFAULT_TIMEOUT_S", "EFFECTS", "Effect", "ToolContext", "ToolDeps", "current_deps"]

DepsT = TypeVar("DepsT", default=Any)

Effect = Literal["read", "write", "irreversible"]
"""What a tool does to the world, which decides how it may be repeated.

* ``"read"``: no side effect; safe to run again at any time.
* ``"write"``: a side effect that is safe to repeat *with the idempotency key*: the tool
  passes ``ctx.idempotency_key`` to the outside world, which recognises a repeat.
* ``"irreversible"``: a side effect that cannot be repeated or undone (a payment without
  idempotency, a deletion). Needs approval by default and is never re-run blindly.
"""

EFFECTS: Final[tuple[Effect, ...]] = ("read", "write", "irreversible")

# Per-attempt timeouts: reads should be quick; slower effects get more room, because
# abandoning a half-done write costs more than waiting a little longer for it.
DEFAULT_TIMEOUT_S: Final[dict[Effect, float]] = {
    "read": 30.0,
    "write": 60.0,
    "irreversible": 120.0,
}


class ToolDeps:
    """An agent's dependencies (a database pool, an API client): built by ``factory``
    on the first :attr:`ToolContext.deps` of the process, then shared by every call of
    every run of the agent in it. Never journaled: each worker process builds its own,
    and a replayed or retried call sees the one of the process it runs in.

    A factory that raises builds nothing: the call fails (and is retried like any
    failure of the tool), and the next call tries again.
    """

    def __init__(
        self, agent: str, factory: Callable[[], Any] | None, expected: type | None = None
    ) -> None:
        owner = f"agent {agent!r}"
        if factory is not None and not callable(factory):
            raise ConfigError(
                f"{owner}: deps must be a function that builds the dependencies (called "
                f"once per worker process), got {factory!r}; write deps=lambda: {factory!r}"
            )
        if expected is not None and factory is None:
            raise ConfigError(f"{owner}: deps_type={expected!r} needs deps=<a factory>")
        if expected is not None and not isinstance(expected, type):
            raise ConfigError(f"{owner}: deps_type must be a class, got {expected!r}")
        self.agent = agent
        self.owner = owner
        self.factory = factory
        self.expected = expected
        self._lock = threading.Lock()  # sync tools run in threads
        self._built = False
        self._value: Any = None

    def get(self, tool: str) -> Any:
        """The dependencies, built on first use (``tool`` names the asker in errors).

        Raises:
            ConfigError: there are none, or the factory built the wrong type.
        """
        if self._built:
            return self._value
        if self.factory is None:
            raise ConfigError(
                f"tool {tool!r} asked for ctx.deps, but {self.owner} has no deps: pass "
                "deps=<a function that builds them> to app.agent(...)"
            )
        with self._lock:
            if not self._built:
                value = self.factory()
                if self.expected is not None and not isinstance(value, self.expected):
                    raise ConfigError(
                        f"{self.owner}: its deps factory built a {type(value).__name__}, "
                        f"not the deps_type {self.expected.__name__}"
                    )
                self._value, self._built = value, True
        return self._value

    @contextlib.contextmanager
    def bound(self) -> Iterator[None]:
        """Make these the deps of the tool calls made inside the block (and in the
        tasks and threads it starts)."""
        token = _DEPS.set(self)
        try:
            yield
        finally:
            _DEPS.reset(token)


_DEPS: ContextVar[ToolDeps | None] = ContextVar("mainspring_tool_deps", default=None)


def current_deps() -> ToolDeps | None:
    """The deps bound by the agent running now (``None`` outside an agent)."""
    return _DEPS.get()


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext(Generic[DepsT]):
    """What a tool knows about the call it is serving.

    A tool receives it through a keyword-only parameter annotated ``ToolContext``
    (conventionally ``*, ctx: ToolContext``); that parameter is not part of the tool's
    schema and the model never sees it.

    Attributes:
        run_id: the run the call belongs to.
        session: the run's session number.
        seq: the step's position in the session.
        attempt: 1 on the first attempt, then 2, 3, ... on retries and after crashes.
        idempotency_key: ``"{run_id}:{session}:{seq}"``, the same on every attempt and
            after every crash: pass it to the outside world so a repeated call is
            recognised as the same call.
        tool: the tool's name.
        effect: the tool's effect class.
        agent: the agent that made the call (``None`` for a tool run as a plain step).
        deps: the agent's dependencies (see :attr:`deps`).
    """

    run_id: str
    session: int
    seq: int
    attempt: int
    idempotency_key: str
    tool: str
    effect: Effect
    agent: str | None = None
    deps_source: ToolDeps | None = field(default=None, repr=False, compare=False)

    @property
    def deps(self) -> DepsT:
        """The dependencies of the agent that made the call: what its ``deps=`` factory
        built, once per worker process (annotate ``ctx: ToolContext[MyDeps]`` for the
        type). Never journaled.

        Raises:
            ConfigError: the agent has no ``deps=``, or the tool was not called by an
                agent; the message names both.
        """
        if self.deps_source is None:
            raise ConfigError(
                f"tool {self.tool!r} asked for ctx.deps, but it was not called by an agent "
                "with deps= (deps reach tools only through app.agent(..., deps=...))"
            )
        value: DepsT = self.deps_source.get(self.tool)
        return value
