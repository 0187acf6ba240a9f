"""Child runs: a workflow starts another workflow (or an agent) as a durable run of
its own, and waits for its result.

A child is started by one journal row, ``step`` ``child:<workflow>``, whose output is
the child's run id. The child's idempotency key is derived from that row's place
(``"child:{parent}:{session}:{seq}"``, or ``"child:{parent}:{session}:key:{key}"`` for
a caller's ``key``: a key names one child per session, so a ``continue_as_new`` loop
starts a new child in each session), and the store finds a child by its parent and
start position before it creates one, so however often the parent replays or crashes
before that row is committed, the store creates the child once and hands back the
same run (a child started under an earlier version's key, too). Starting is synchronous
(no step function, no thread): each ``start_child`` and the wait of its ``result``
take their positions in the order the workflow calls them, so that ``gather`` of
children replays in the order it first ran.

Waiting for a child is a durable wait for the signal the store stores, in the
transaction that ends the child, for its parent (``child:<child id>``, payload: the
child's status, output and error as its row holds them): a child that ended before
its parent waits has left the signal already; one that ends later wakes the parent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, Generic, TypeVar, get_args

from .._errors import ChildCancelled, ChildFailed, ConfigError, StoreError, StoreUnavailable
from .._keys import child_key
from .._serde import dumps, loads
from ..storage import ParentClose, child_signal
from ._cursor import Cursor
from ._engine import ChildStarter
from ._waits import Waits
from ._workflow import Workflow

__all__ = ["ChildHandle", "ChildStarter", "start_child"]

R = TypeVar("R")
_UNSET: Any = object()


class ChildHandle(Generic[R]):
    """A child run started with ``ctx.start_child``: ``await handle.result()`` (or
    ``await handle``) waits durably for its result.

    Attributes:
        run_id: the child run's id.
        workflow: the child's workflow name.
    """

    def __init__(self, waits: Waits, workflow: Workflow[Any, R], run_id: str) -> None:
        self.run_id = run_id
        self.workflow = workflow.name
        self._waits = waits
        self._wf = workflow
        self._value: Any = _UNSET
        self._error: ChildFailed | None = None
        self._in_flight = False
        self._shared: asyncio.Future[R] | None = None

    def __repr__(self) -> str:
        return f"ChildHandle(run_id={self.run_id!r}, workflow={self.workflow!r})"

    def __await__(self) -> Generator[Any, None, R]:
        return self.result().__await__()

    async def result(self) -> R:
        """Wait (durably: the parent suspends, holding no worker) until the child
        ends, and return its result. Awaiting again returns the same result.

        Raises:
            ChildFailed: the child failed (its error is ``.error``).
            ChildCancelled: the child was cancelled.
        """
        if self._error is not None:
            raise self._error
        if self._value is not _UNSET:
            value: R = self._value
            return value
        if self._in_flight:  # awaited twice at once: the first wait answers both
            if self._shared is None:
                self._shared = asyncio.get_running_loop().create_future()
            shared: R = await self._shared
            return shared
        # The wait takes its journal position here, in the caller's task, before
        # anything can yield: so ``gather`` of children replays in its first order.
        self._in_flight = True
        try:
            value = await self._wait()
        except ChildFailed as exc:
            if self._shared is not None and not self._shared.done():
                self._shared.set_exception(exc)
            raise
        except BaseException:
            if self._shared is not None and not self._shared.done():
                self._shared.cancel()
            raise
        finally:
            self._in_flight = False
        if self._shared is not None and not self._shared.done():
            self._shared.set_result(value)
        return value

    async def _wait(self) -> R:
        name = child_signal(self.run_id)
        ended = await self._waits._wait(name, timeout=None, reason=f"child:{self.run_id}")
        status = ended.get("status")
        if status != "succeeded":
            error = ended.get("error") or {}
            kind = ChildCancelled if status == "cancelled" else ChildFailed
            self._error = kind(
                f"child run {self.run_id} of {self.workflow!r} {status}: "
                f"{error.get('type', '?')}: {error.get('message', '')}",
                child_id=self.run_id,
                status=str(status),
                error=error,
                run_id=self._waits.cur.run_id,
            )
            raise self._error
        value: R = self._wf.decode_output(dumps(ended.get("output")))
        self._value = value
        return value


def start_child(
    cur: Cursor,
    waits: Waits,
    target: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    key: str | None,
    on_parent_close: ParentClose = "cancel",
) -> ChildHandle[Any]:
    """Start (or, on replay, find) the child run; see the module's docstring."""
    starter = cur.engine.children
    if starter is None:
        raise ConfigError(
            "ctx.child needs an engine that can start runs: run the workflow with an App "
            "(app.run, app.submit and a worker)",
            run_id=cur.run_id,
        )
    if key is not None and (not isinstance(key, str) or not key):
        raise ConfigError(f"a child's key must be a non-empty string, got {key!r}")
    if on_parent_close not in get_args(ParentClose):
        raise ConfigError(
            f"on_parent_close must be 'cancel' or 'abandon', got {on_parent_close!r}",
            run_id=cur.run_id,
        )
    workflow = starter.child_workflow(target)
    name = f"child:{workflow.name}"
    cur.life.boundary()
    seq = cur.take("step", name)
    rec = cur.journal.get(seq) or cur.pending.get(seq)
    if rec is not None and rec.status == "completed":
        return ChildHandle(waits, workflow, str(loads(rec.output)["run_id"]))
    ident = child_key(cur.run_id, cur.session, seq, key)
    try:
        child_id = starter.start_child(
            workflow,
            args,
            kwargs,
            key=ident,
            parent=cur.run_id,
            parent_step=f"{cur.session}:{seq}",
            on_parent_close=on_parent_close,
        )
    except (StoreUnavailable, StoreError) as exc:
        raise cur.life.fail(exc) from exc
    now = cur.now()
    output = dumps({"run_id": child_id})
    row = cur.new(seq, "step", name, status="completed", output=output, finished_at=now)
    row.role = "child"
    cur.put(row)
    cur.life.touch()
    return ChildHandle(waits, workflow, child_id)
