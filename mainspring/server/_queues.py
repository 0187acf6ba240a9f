"""``GET /queues``: each queue's limits and how many of its runs are running,
queued and waiting (read scope)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends

from .. import App
from ._schemas import QueueOut

__all__ = ["queue_routes"]


def queue_routes(
    app: App, read: Callable[..., Any], responses: dict[int | str, dict[str, Any]]
) -> APIRouter:
    """The queue routes; ``read`` is the dependency that checks the read scope."""
    router = APIRouter()

    @router.get(
        "/queues",
        response_model=list[QueueOut],
        tags=["runs"],
        responses=responses,
        dependencies=[Depends(read)],
    )
    def list_queues() -> list[QueueOut]:
        """Every queue with its limits and its runs by state, by name."""
        return [
            QueueOut(
                name=q.name,
                concurrency=q.concurrency,
                per_key=q.per_key,
                rate=q.rate,
                burst=q.burst,
                running=q.running,
                queued=q.queued,
                waiting=q.waiting,
                retrying=q.retrying,
            )
            for q in app.queues()
        ]

    return router
