"""``FaultyStore``: any :class:`~mainspring.storage.Store` with faults injected at
chosen calls, and a record of every call made.

A store fails in three ways that matter to the engine, and each has its own
obligation:

* **busy**: nothing was done (a lock held past the busy timeout, a row lock, a pool
  with no free connection). The caller must wait and try again.
* **ambiguous**: the call did everything, COMMIT included, and then the caller saw an
  error (the connection dropped before the answer came back). Whatever the caller
  re-sends must be idempotent.
* **delay**: the call is slow (a GC pause, a stalled disk, a frozen process). Time,
  including a :class:`~mainspring.testing.FakeClock`'s, may move meanwhile: a lease can
  expire and another worker take the run over before the write lands.

The wrapper is a ``Store`` itself, so it goes wherever a store goes:
``App(FaultyStore(inner, ...))``, and through the App to its workers, their
batch committer and the HTTP server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal

from .._errors import StoreUnavailable
from ..storage import Cursor, RunWrite, Store, WriteResult

__all__ = ["Fault", "FaultKind", "FaultyStore", "StoreCall", "commits_with"]

FaultKind = Literal["busy", "locked", "ambiguous", "delay"]
FAULT_KINDS: tuple[FaultKind, ...] = ("busy", "locked", "ambiguous", "delay")
# Recorded but never faulted: ``listen`` only starts a thread whose connection
# failures it handles itself (a fault aimed at it arms at the next call instead).
UNFAULTED = frozenset({"listen"})


@dataclass(slots=True, kw_only=True)
class Fault:
    """One fault to inject.

    The fault arms at the first call that matches (``at`` and ``method``, or the
    ``nth`` call of ``method``) and then hits ``times`` matching calls in a row.

    Attributes:
        kind: ``"busy"``: raise :class:`~mainspring.StoreUnavailable` before anything
            is done. ``"locked"``: like busy, but a ``commit`` answers each write
            ``WriteResult(ok=False, busy=True)`` (what a row held by another
            transaction gives on PostgreSQL) instead of raising. ``"ambiguous"``:
            make the call (it commits), then raise ``StoreUnavailable``. ``"delay"``:
            sleep ``delay_s`` (and run ``during``) before making the call.
        at: index of the call in the store's whole call sequence (0-based).
        method: only calls of this method (``"commit"``, ``"claim"``, ...).
        nth: with ``method`` and no ``at``: the ``nth`` matching call (0-based).
        when: only calls whose ``(args, kwargs)`` it accepts (a commit that carries a
            ``next_session`` transition, a claim of one run, ...).
        times: how many matching calls to hit (busy for longer than the caller's
            retries, for instance).
        delay_s: real seconds a ``delay`` waits.
        during: called inside the faulty call: before the error of ``busy`` and
            ``locked``, after the committed call of ``ambiguous``, after the sleep of
            ``delay``. Advance a fake clock here to make a stall outlive a lease, or
            act from outside (send a signal, cancel) at exactly this moment.
    """

    kind: FaultKind
    at: int | None = None
    method: str | None = None
    nth: int = 0
    times: int = 1
    delay_s: float = 0.05
    during: Callable[[], object] | None = None
    when: Callable[[tuple[Any, ...], dict[str, Any]], bool] | None = None
    hits: int = field(default=0, init=False)
    _seen: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {FAULT_KINDS!r}, got {self.kind!r}")
        if self.at is None and self.method is None and self.when is None:
            raise ValueError("a Fault needs `at` (a call index), `method` or `when`")
        if self.times < 1:
            raise ValueError(f"times must be >= 1, got {self.times!r}")

    def _matches(
        self, index: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> bool:
        if self.hits >= self.times or method in UNFAULTED:
            return False
        if self.method is not None and method != self.method:
            return False
        if self.when is not None and not self.when(args, kwargs):
            return False
        if self.hits:  # armed: every further matching call until `times` is spent
            return True
        if self.at is not None:
            return index >= self.at
        self._seen += 1
        return self._seen > self.nth


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreCall:
    """One call made through a :class:`FaultyStore`.

    Attributes:
        index: its position in the store's call sequence (0-based).
        method: the Store method called.
        fault: the fault injected into it, if any.
        error: the exception's class name when the call raised (injected or real).
        thread: the calling thread's name (the committer, a worker's claim, ...).
    """

    index: int
    method: str
    fault: FaultKind | None
    error: str | None
    thread: str


class FaultyStore(Store):
    """Wraps a store; injects :class:`Fault` s at chosen calls; records every call.

    Example::

        inner = SQLiteStore(tmp / "t.db")
        store = FaultyStore(inner, [Fault(kind="ambiguous", method="commit", nth=3)])
        app = ms.App(store, clock=clock)
        ...
        assert store.injected[0].method == "commit"

    Args:
        inner: the real store (:class:`~mainspring.storage.SQLiteStore`, ``PostgresStore``).
        faults: faults to inject; more can be added later with :meth:`inject`.
        after_call: called as ``after_call(method, args, kwargs, result)`` after each
            call that did not raise, in the caller's thread (an invariant recorder
            that reads what a commit wrote, for instance).

    Commits are easiest to aim at with :func:`commits_with`.

    Every public Store method goes through the wrapper; anything else (``dialect``,
    ``path``, ...) is the inner store's.
    """

    def __init__(
        self,
        inner: Store,
        faults: Iterable[Fault] = (),
        *,
        after_call: Callable[[str, tuple[Any, ...], dict[str, Any], Any], None] | None = None,
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self.faults: list[Fault] = list(faults)
        self.after_call = after_call
        self.calls: list[StoreCall] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # Only reached for what this class lacks: the dialect and its own attributes.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- what tests read -----------------------------------------------------------

    def inject(self, fault: Fault) -> Fault:
        """Add a fault (it counts calls from now on for ``nth``)."""
        with self._lock:
            self.faults.append(fault)
        return fault

    @property
    def injected(self) -> list[StoreCall]:
        """The calls that had a fault injected."""
        with self._lock:
            return [c for c in self.calls if c.fault is not None]

    def count(self, method: str | None = None) -> int:
        """How many calls were made (of ``method`` only, when given)."""
        with self._lock:
            return sum(1 for c in self.calls if method is None or c.method == method)

    def methods(self) -> list[str]:
        """The method of every call, in order."""
        with self._lock:
            return [c.method for c in self.calls]

    # -- the interception ----------------------------------------------------------

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self._lock:
            index = len(self.calls)
            fault = next((f for f in self.faults if f._matches(index, method, args, kwargs)), None)
            if fault is not None:
                fault.hits += 1
            # Reserve the index now: calls from other threads get the next ones.
            self.calls.append(_record(index, method, fault, None))
        try:
            result = self._perform(method, args, kwargs, fault)
        except BaseException as exc:
            with self._lock:
                self.calls[index] = _record(index, method, fault, type(exc).__name__)
            raise
        if self.after_call is not None:
            self.after_call(method, args, kwargs, result)
        return result

    def _perform(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], fault: Fault | None
    ) -> Any:
        target = getattr(self.inner, method)
        if fault is None:
            return target(*args, **kwargs)
        what = f"injected {fault.kind} fault at store call {method!r}"
        if fault.kind in ("busy", "locked"):
            if fault.during is not None:
                fault.during()
            if fault.kind == "locked" and method == "commit":
                batch: list[RunWrite] = list(kwargs.get("batch", args[0] if args else []))
                return [WriteResult(ok=False, busy=True) for _ in batch]
            raise StoreUnavailable(f"{what}: nothing was done")
        if fault.kind == "delay":
            time.sleep(fault.delay_s)
            if fault.during is not None:
                fault.during()
            return target(*args, **kwargs)
        target(*args, **kwargs)  # ambiguous: it happened, committed and all
        if fault.during is not None:
            fault.during()
        raise StoreUnavailable(f"{what}: the call succeeded but its answer was lost")

    # -- the Store's own hooks: the inner store's --------------------------------

    def _write(self) -> AbstractContextManager[Cursor]:
        return self.inner._write()

    def _read(self) -> AbstractContextManager[Cursor]:
        return self.inner._read()

    def _autocommit(self) -> AbstractContextManager[Cursor]:
        return self.inner._autocommit()

    def _notify(self, cur: Cursor, run_id: str | None = None) -> None:
        self.inner._notify(cur, run_id)

    def close(self) -> None:
        self.inner.close()

    def release_thread(self) -> None:
        self.inner.release_thread()  # never faulted: it reaches no database


def commits_with(
    transition: str | None = None, *, step_status: str | None = None
) -> Callable[[tuple[Any, ...], dict[str, Any]], bool]:
    """A ``Fault.when`` that picks commits carrying a ``transition`` kind
    (``"finish"``, ``"suspend"``, ``"next_session"``) and/or a journal row of
    ``step_status`` (``"completed"``, ...)."""

    def when(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        batch = kwargs.get("batch", args[0] if args else None)
        if not isinstance(batch, list | tuple):
            return False  # not a commit
        return any(
            isinstance(w, RunWrite)
            and (
                transition is None or (w.transition is not None and w.transition.kind == transition)
            )
            and (step_status is None or any(r.status == step_status for r in w.steps))
            for w in batch
        )

    return when


def _record(index: int, method: str, fault: Fault | None, error: str | None) -> StoreCall:
    return StoreCall(
        index=index,
        method=method,
        fault=None if fault is None else fault.kind,
        error=error,
        thread=threading.current_thread().name,
    )


def _public_methods() -> Iterator[str]:
    for name in sorted(dir(Store)):
        # Housekeeping of the wrapper's own connections, not a call to the database.
        if name.startswith("_") or name in ("close", "release_thread"):
            continue
        if callable(getattr(Store, name)):
            yield name


def _intercepted(name: str) -> Callable[..., Any]:
    def method(self: FaultyStore, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, args, kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = getattr(Store, name).__doc__
    return method


# Every public method, present and future, goes through `_call`: a method added to
# Store later is intercepted without anyone remembering to add it here.
STORE_METHODS: tuple[str, ...] = tuple(_public_methods())
for _name in STORE_METHODS:
    setattr(FaultyStore, _name, _intercepted(_name))
