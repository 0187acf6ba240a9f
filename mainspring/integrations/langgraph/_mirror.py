"""A graph run's checkpoints, mirrored into mainspring's database for LangGraph's
state APIs (:class:`~._saver.MainspringSaver`, the run's id as the thread).

Each execution runs the graph over an in-memory checkpointer; at each interrupt and
at the end the driver copies the new checkpoints (root namespace) and their pending
writes into the database, fenced by the run's epoch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver

from ... import RunContext
from ._saver import MainspringSaver

__all__ = ["Mirror"]


class Mirror:
    """Copies one execution's checkpoints (root namespace) into the database, fenced.

    The checkpoints of an execution are numbered in order (``position``); a replay
    makes the same ones again under new ids, and finds those its predecessors stored
    by their number, so the thread holds each once, under the id first given."""

    def __init__(self, saver: MainspringSaver, ctx: RunContext) -> None:
        self.saver = saver
        self.ctx = ctx
        self.thread_id = ctx.run_id
        self.ids: dict[str, str] = {}  # this execution's checkpoint id -> stored id

    async def sync(self, memory: InMemorySaver) -> None:
        # The epoch now: an execution that suspended and woke on this worker again
        # goes on at its new claim's epoch.
        self.saver.fence = (self.ctx.run_id, self.ctx.epoch)
        await asyncio.to_thread(self._sync, memory)

    def _sync(self, memory: InMemorySaver) -> None:
        where = {"thread_id": self.thread_id, "checkpoint_ns": ""}
        found = list(memory.list({"configurable": where}))
        found.reverse()  # oldest first
        store = self.saver.store
        for position, tup in enumerate(found):
            own = str(tup.config["configurable"]["checkpoint_id"])
            stored = self.ids.get(own) or store.checkpoint_at(self.thread_id, "", position)
            last = position == len(found) - 1
            if stored is None:
                parent = (
                    tup.parent_config["configurable"]["checkpoint_id"]
                    if tup.parent_config
                    else None
                )
                versions = dict(tup.checkpoint["channel_versions"])
                self.saver.put_at(
                    {"configurable": {**where, "checkpoint_id": parent}},
                    tup.checkpoint,
                    tup.metadata,
                    versions,
                    position=position,
                    parent_id=self.ids.get(str(parent), parent) if parent else None,
                )
                stored = own
            fresh = own not in self.ids
            self.ids[own] = stored
            if tup.pending_writes and (fresh or last):
                self._writes(where, stored, tup.pending_writes)

    def _writes(self, where: dict[str, str], stored: str, writes: Sequence[Any]) -> None:
        if self.saver.store.checkpoint_writes(self.thread_id, "", stored):
            return  # an earlier execution stored this checkpoint's writes
        by_task: dict[str, list[tuple[str, Any]]] = {}
        for task_id, channel, value in writes:
            by_task.setdefault(str(task_id), []).append((channel, value))
        config: RunnableConfig = {"configurable": {**where, "checkpoint_id": stored}}
        for task_id, task_writes in by_task.items():
            self.saver.put_writes(config, task_writes, task_id)
