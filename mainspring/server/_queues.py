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
    # A queue's view is its record, field for field.
    return [QueueOut.model_validate(q, from_attributes=True) for q in ctx.app.queues.list()]
