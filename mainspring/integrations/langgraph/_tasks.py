"""The results of ``@task`` calls inside a node, kept in mainspring's database so that
a node run again (a retry of its step, or a replay after a crash) does not run the
tasks it had completed.

A node is one journaled step; the ``@task`` calls it makes run inside that step. Each
one's result is kept as soon as it completes, through LangGraph's own cache interface
(a graph-wide :class:`~langgraph.types.CachePolicy` whose key is the call's place, and
a :class:`~langgraph.cache.base.BaseCache` over the database): the key is the node
step's idempotency key, the call's number within the node's attempt and a digest of
its arguments, so the same call at the same place finds its result, and a call that
changed (other arguments, other order) runs.

The cache LangGraph queries hashes the key itself; a node's own lookup (the graph-wide
policy applies to nodes too) is not a task call and finds nothing: only the keys this
module made for task calls of the current execution are read or written.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from langgraph.cache.base import BaseCache, FullKey, Namespace
from langgraph.types import CachePolicy
from xxhash import xxh3_128_hexdigest

from ... import RunContext, StoreError, StoreUnavailable, current_step
from ...storage import CheckpointWrite
from ._serde import decode_typed, encode_typed

__all__ = ["TASKS_NS", "TaskCalls", "TaskResults", "task_policy"]

#: The checkpoint namespace that holds a run's task results (thread: the run's id).
TASKS_NS = "__mainspring_tasks__"

# The key of a lookup that is neither a task call of a run nor the graph's own: never
# read or written (LangGraph sees it hashed).
_NEVER = "mainspring:uncached"
_NEVER_HASHED = xxh3_128_hexdigest(_NEVER.encode())


class TaskCalls:
    """One execution's task calls: the number of the next call in each node attempt,
    and the cache keys made for them (LangGraph's hashes: the only ones read or
    written)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.run_id = ctx.run_id
        self._next: dict[str, int] = {}
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    def attempt(self, step_key: str) -> None:
        """A node's step starts an attempt: its task calls count from 0 again, and so
        meet the results of the attempts before."""
        with self._lock:
            self._next[step_key] = 0

    def key(self, step_key: str, args_digest: str) -> str:
        with self._lock:
            n = self._next.get(step_key, 0)
            self._next[step_key] = n + 1
            key = f"{step_key}|{n}|{args_digest}"
            self._keys.add(xxh3_128_hexdigest(key.encode()))
        return key

    def known(self, hashed: str) -> bool:
        with self._lock:
            return hashed in self._keys


def task_policy(calls: Any, graphs: CachePolicy[Any] | None = None) -> CachePolicy[Any]:
    """The graph-wide cache policy: a task call inside a node step is keyed by its
    place; anything else (a node, a call outside mainspring) by the graph's own
    policy (``graphs``) if it had one, else by a key never kept.

    Args:
        calls: a function returning the current execution's :class:`TaskCalls` (or
            ``None`` outside a run).
    """

    def key(*args: Any, **kwargs: Any) -> str | bytes:
        found: TaskCalls | None = calls()
        info = _step()
        if found is None or info is None:
            return graphs.key_func(*args, **kwargs) if graphs is not None else _NEVER
        try:
            digest = hashlib.sha256(encode_typed((args, kwargs)).encode()).hexdigest()
        except (TypeError, ValueError):  # arguments LangGraph's serde cannot write
            return _NEVER
        return found.key(info, digest)

    return CachePolicy(key_func=key, ttl=graphs.ttl if graphs is not None else None)


def _step() -> str | None:
    try:
        return current_step().idempotency_key
    except RuntimeError:  # not inside a step: a node's own lookup
        return None


class TaskResults(BaseCache[Any]):
    """Task results in the run's database, under the run's thread (a run's pruning
    deletes them with its checkpoints), written fenced by the execution's epoch.

    Args:
        calls: a function returning the current execution's :class:`TaskCalls` (or
            ``None`` outside a run).
    """

    def __init__(self, calls: Any, inner: BaseCache[Any] | None = None) -> None:
        super().__init__()
        self.calls = calls
        self.inner = inner  # the graph's own cache: every other key goes there

    def _split(self, keys: Sequence[FullKey]) -> tuple[TaskCalls | None, list[FullKey]]:
        """The execution's task calls, and the keys that are not theirs."""
        found: TaskCalls | None = self.calls()
        others = [k for k in keys if k[1] != _NEVER_HASHED]
        return found, [k for k in others if found is None or not found.known(k[1])]

    def get(self, keys: Sequence[FullKey]) -> dict[FullKey, Any]:
        found, others = self._split(keys)
        out: dict[FullKey, Any] = dict(self.inner.get(others)) if self.inner and others else {}
        if found is None:
            return out
        for full in keys:
            if not found.known(full[1]):
                continue
            rows = found.ctx.store.checkpoint_writes(found.run_id, TASKS_NS, full[1])
            if rows:
                out[full] = [(r.channel, decode_typed(r.value)) for r in rows]
        return out

    async def aget(self, keys: Sequence[FullKey]) -> dict[FullKey, Any]:
        return await asyncio.to_thread(self.get, keys)

    def set(self, pairs: Mapping[FullKey, tuple[Any, int | None]]) -> None:
        found, others = self._split(list(pairs))
        if self.inner is not None and others:
            self.inner.set({k: pairs[k] for k in others})
        if found is None:
            return
        for full, (writes, _ttl) in pairs.items():
            if not found.known(full[1]):
                continue
            rows = [
                CheckpointWrite(
                    task_id=full[0][-1] if full[0] else "", idx=i, channel=channel,
                    value=encode_typed(value), task_path="",
                )
                for i, (channel, value) in enumerate(writes)
            ]  # fmt: skip
            try:
                # Refused when the run moved on (another worker holds it): its own
                # execution keeps the results then.
                # The epoch now: an execution that suspended and woke on this worker
                # goes on at its new claim's epoch.
                found.ctx.store.put_checkpoint_writes(
                    found.run_id, TASKS_NS, full[1], rows, replace=False,
                    fence_run=found.run_id, fence_epoch=found.ctx.epoch,
                )  # fmt: skip
            except (StoreError, StoreUnavailable):
                return  # not kept: a node run again runs the task again, as before

    async def aset(self, pairs: Mapping[FullKey, tuple[Any, int | None]]) -> None:
        await asyncio.to_thread(self.set, pairs)

    def clear(self, namespaces: Sequence[Namespace] | None = None) -> None:
        """The graph's own cache's: a run's task results go with its checkpoints."""
        if self.inner is not None:
            self.inner.clear(namespaces)

    async def aclear(self, namespaces: Sequence[Namespace] | None = None) -> None:
        await asyncio.to_thread(self.clear, namespaces)
