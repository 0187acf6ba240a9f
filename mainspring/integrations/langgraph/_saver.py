"""``MainspringSaver``: a LangGraph checkpointer over mainspring's database.

A full ``BaseCheckpointSaver`` (it passes LangGraph's own conformance suite), usable by
any graph. For a graph run on mainspring (:func:`~.durable`), the thread is the run's
id: the run's executions mirror their checkpoints into it, fenced by the run's epoch,
so that ``graph.get_state`` / ``get_state_history`` read a run's state from anywhere.
Writes from outside to the thread of an unfinished run are refused (its executions own
that state: answer its requests, or fork it).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)

from ... import App, RunConflict, Store
from ...storage import CheckpointRow, CheckpointWrite
from ._serde import decode_typed, encode_typed

__all__ = ["MainspringSaver", "RunFence"]

RunFence = tuple[str, int]
"""``(run_id, epoch)``: write only while that run is running at that epoch."""


class MainspringSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpoints in mainspring's database (SQLite or PostgreSQL).

    Use it as any checkpointer (``builder.compile(checkpointer=MainspringSaver(app))``),
    or read the state of graph runs: their thread id is the run id::

        graph = builder.compile(checkpointer=MainspringSaver(app))
        graph.get_state({"configurable": {"thread_id": run.run_id}})

    Args:
        app: the App (or its :class:`~mainspring.Store`) whose database holds them.
        fence: ``(run_id, epoch)``: every write is made only while that run is
            ``running`` at that epoch (what a run's own execution passes; a worker that
            lost the run writes nothing). Without it, a write to the thread of an
            unfinished run raises :class:`~mainspring.RunConflict`.
    """

    def __init__(self, app: App | Store, *, fence: RunFence | None = None) -> None:
        super().__init__()
        self.store: Store = app.store if isinstance(app, App) else app
        self.fence = fence
        self._clock = app.clock if isinstance(app, App) else None

    # -- writes ------------------------------------------------------------------------

    def _fenced(self, thread_id: str) -> dict[str, Any]:
        if self.fence is not None:
            return {"fence_run": self.fence[0], "fence_epoch": self.fence[1]}
        return {"fence_run": thread_id, "fence_epoch": None}

    def _refused(self, thread_id: str) -> RunConflict:
        if self.fence is not None:
            return RunConflict(
                f"run {self.fence[0]!r} is no longer running at epoch {self.fence[1]}: "
                "its checkpoint was not written",
                run_id=self.fence[0],
            )
        return RunConflict(
            f"thread {thread_id!r} is an unfinished mainspring run: its executions own "
            "its state. Answer its requests, or fork the run to change its course",
            run_id=thread_id,
        )

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.put_at(config, checkpoint, metadata, new_versions, position=None)

    def put_at(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        *,
        position: int | None,
        parent_id: str | None = None,
    ) -> RunnableConfig:
        """:meth:`put`, numbered ``position`` among a run's mirrored checkpoints, with
        an explicit parent (a run's replay knows its checkpoints by other ids)."""
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        stored = dict(checkpoint)
        values: dict[str, Any] = stored.pop("channel_values", {})  # type: ignore[assignment]
        blobs = [
            (channel, str(version), encode_typed(values[channel]) if channel in values else "")
            for channel, version in new_versions.items()
        ]
        row = CheckpointRow(
            thread_id=thread_id,
            checkpoint_ns=ns,
            checkpoint_id=checkpoint["id"],
            parent_id=parent_id if parent_id is not None else conf.get("checkpoint_id"),
            position=position,
            checkpoint=encode_typed(stored),
            metadata=encode_typed(get_checkpoint_metadata(config, metadata)),
            created_at=self._now(),
        )
        if not self.store.put_checkpoint(row, blobs, **self._fenced(thread_id)):
            raise self._refused(thread_id)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        rows = [
            CheckpointWrite(
                task_id=task_id,
                idx=WRITES_IDX_MAP.get(channel, i),
                channel=channel,
                value=encode_typed(value),
                task_path=task_path,
            )
            for i, (channel, value) in enumerate(writes)
        ]
        # LangGraph's special channels (errors, interrupts, resumes) replace what a
        # task wrote there before; any other write is kept as first written.
        replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        ok = self.store.put_checkpoint_writes(
            thread_id, ns, str(conf["checkpoint_id"]), rows, replace=replace,
            **self._fenced(thread_id),
        )  # fmt: skip
        if not ok:
            raise self._refused(thread_id)

    def delete_thread(self, thread_id: str) -> None:
        self.store.delete_checkpoints(str(thread_id))

    # -- reads -------------------------------------------------------------------------

    def _tuple(self, row: CheckpointRow) -> CheckpointTuple:
        checkpoint: dict[str, Any] = decode_typed(row.checkpoint)
        versions = {k: str(v) for k, v in checkpoint.get("channel_versions", {}).items()}
        blobs = self.store.checkpoint_blobs(row.thread_id, row.checkpoint_ns, versions)
        checkpoint["channel_values"] = {k: decode_typed(v) for k, v in blobs.items() if v}
        writes = self.store.checkpoint_writes(row.thread_id, row.checkpoint_ns, row.checkpoint_id)
        where = {"thread_id": row.thread_id, "checkpoint_ns": row.checkpoint_ns}
        return CheckpointTuple(
            config={"configurable": {**where, "checkpoint_id": row.checkpoint_id}},
            checkpoint=checkpoint,  # type: ignore[arg-type]
            metadata=decode_typed(row.metadata),
            parent_config=(
                {"configurable": {**where, "checkpoint_id": row.parent_id}}
                if row.parent_id
                else None
            ),
            pending_writes=[(w.task_id, w.channel, decode_typed(w.value)) for w in writes],
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        row = self.store.get_checkpoint(
            str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")), get_checkpoint_id(config)
        )
        return None if row is None else self._tuple(row)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        conf = config["configurable"] if config else {}
        thread = conf.get("thread_id")
        ns = conf.get("checkpoint_ns")
        wanted = get_checkpoint_id(config) if config else None
        rows = self.store.list_checkpoints(
            thread_id=None if thread is None else str(thread),
            checkpoint_ns=None if ns is None else str(ns),
            before=get_checkpoint_id(before) if before else None,
            # With a metadata filter, rows that do not match do not count.
            limit=limit if not filter and not wanted else None,
        )
        left = limit
        for row in rows:
            if wanted and row.checkpoint_id != wanted:
                continue
            if filter:
                metadata = decode_typed(row.metadata)
                if not all(metadata.get(k) == v for k, v in filter.items()):
                    continue
            if left is not None:
                if left <= 0:
                    return
                left -= 1
            yield self._tuple(row)

    def get_next_version(self, current: str | None, channel: None) -> str:
        # InMemorySaver's scheme: a counter, then noise, so that versions sort by age.
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- async: the same, off the event loop ------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    # -- helpers -----------------------------------------------------------------------

    def _now(self) -> float:
        return self._clock.now() if self._clock is not None else time.time()

    def __repr__(self) -> str:
        return f"MainspringSaver({self.store.url!r}, fence={self.fence!r})"
