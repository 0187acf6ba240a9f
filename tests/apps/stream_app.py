"""An App for the token stream fencing tests (tests/test_streams_fencing.py): one model
step whose reply streams slowly, so that a worker can be frozen in the middle of it.

Environment:
    MAINSPRING_DATABASE_URL: the store.
    MAINSPRING_TEST_LEASE_S: the lease (short, so that a frozen worker loses it soon).
    MAINSPRING_TEST_PACE_S: the pause before each four-character piece of the reply.
"""

from __future__ import annotations

import asyncio
import os

import mainspring as ms
from mainspring.models import ScriptedModel, UserMessage

# 160 characters: forty pieces of four.
TEXT = ("Durable runs stream their answers live, fenced like the journal. " * 3)[:160]
PACE_S = float(os.environ.get("MAINSPRING_TEST_PACE_S", "0.05"))

app = ms.App(lease_s=float(os.environ.get("MAINSPRING_TEST_LEASE_S", "1.0")))


async def _pace(index: int, piece: str) -> None:
    await asyncio.sleep(PACE_S)


model = ScriptedModel(lambda messages, tools: TEXT, chunk_size=4, on_chunk=_pace)


@app.workflow
async def answer(ctx: ms.RunContext, question: str) -> str:
    reply = await app.call_model(ctx, model, [UserMessage(content=question)])
    return reply.text or ""
