"""Following runs as Server-Sent Events: one run (``/runs/{run_id}/events``) or
every run's changes (``/events``). The streams themselves are in ``_events``; here
they are counted against the key's cap and told to end when the key is revoked."""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations.
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header
from fastapi.responses import StreamingResponse

from ..storage import ApiKey
from ._context import ApiContext, Ctx, Read, responses
from ._events import event_stream, runs_stream

__all__ = ["router"]

router = APIRouter()

LastEventId = Annotated[str | None, Header(max_length=200)]


def _sse(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {
        200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events."},
        **responses(*codes),
    }


def _response(ctx: ApiContext, key: ApiKey, stream: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        ctx.streams.hold(key, stream),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get(
    "/runs/{run_id}/events",
    tags=["runs"],
    response_class=StreamingResponse,
    responses=_sse(404, 429),
)
def run_events(
    run_id: str, key: Read, ctx: Ctx, last_event_id: LastEventId = None
) -> StreamingResponse:
    """Follow a run as Server-Sent Events: ``status`` when it changes, ``step``
    for each journal row started or finished, ``tokens`` for a model's text as
    it forms (and the end of each attempt's stream), ``tool_call_delta`` for the
    arguments of the tool calls it writes, ``end`` when it is over. Reconnect
    with ``Last-Event-ID`` to resume where the stream broke off."""
    ctx.app.get_run(run_id)
    stream = event_stream(
        ctx.app,
        run_id,
        last_event_id,
        poll_s=ctx.events_poll_s,
        full=key.allows("admin"),
        still_allowed=lambda: ctx.active(key.id),
        max_s=ctx.max_stream_s,
    )
    return _response(ctx, key, stream)


@router.get("/events", tags=["runs"], response_class=StreamingResponse, responses=_sse(429))
def all_events(key: Read, ctx: Ctx, last_event_id: LastEventId = None) -> StreamingResponse:
    """Follow every run: a ``run`` event each time one is submitted, claimed,
    suspended or finished (for live lists)."""
    stream = runs_stream(
        ctx.app,
        last_event_id,
        still_allowed=lambda: ctx.active(key.id),
        max_s=ctx.max_stream_s,
    )
    return _response(ctx, key, stream)
