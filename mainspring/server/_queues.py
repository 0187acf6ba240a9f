"""``GET /queues``: each queue's limits and how many of its runs are running,
queued and waiting (read scope)."""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations.
from fastapi import APIRouter

from ._context import Ctx, Read, responses
from ._schemas import QueueOut

__all__ = ["router"]

router = APIRouter()


@router.get("/queues", response_model=list[QueueOut], tags=["runs"], responses=responses())
def list_queues(_key: Read, ctx: Ctx) -> list[QueueOut]:
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
        for q in ctx.app.queues()
    ]
