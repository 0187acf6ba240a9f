"""An agent for the process tests: 5 tools, a faulty scripted model, an effect ledger.

MAINSPRING_DATABASE_URL: the store; MAINSPRING_TEST_LEDGER: the ledger file;
MAINSPRING_TEST_CALLS: how many tool calls the task takes (100 by default).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import mainspring as ms
from mainspring.models import Message, ModelResponse, ToolSpec
from mainspring.testing import EffectLedger, FaultProfile, FaultyModel, ScriptedModel

app = ms.App(lease_s=float(os.environ.get("MAINSPRING_TEST_LEASE_S", "1.0")))
ledger = EffectLedger(os.environ["MAINSPRING_TEST_LEDGER"])
CALLS = int(os.environ.get("MAINSPRING_TEST_CALLS", "100"))
TOOLS = ("fetch", "parse", "enrich", "store", "notify")
_DONE = re.compile(r"tool calls: (\d+)")


def _effect(kind: str, item: int, ctx: ms.ToolContext) -> str:
    ledger.apply(ctx.idempotency_key, kind, item)
    return f"{kind} {item} ok"


@app.tool(effect="write")
def fetch(item: int, *, ctx: ms.ToolContext) -> str:
    """Fetch an item."""
    return _effect("fetch", item, ctx)


@app.tool(effect="write")
def parse(item: int, *, ctx: ms.ToolContext) -> str:
    """Parse an item."""
    return _effect("parse", item, ctx)


@app.tool(effect="write")
def enrich(item: int, *, ctx: ms.ToolContext) -> str:
    """Enrich an item."""
    return _effect("enrich", item, ctx)


@app.tool(effect="write")
def store(item: int, *, ctx: ms.ToolContext) -> str:
    """Store an item."""
    return _effect("store", item, ctx)


@app.tool(effect="write")
def notify(item: int, *, ctx: ms.ToolContext) -> str:
    """Notify about an item."""
    return _effect("notify", item, ctx)


def play(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ModelResponse:
    """The next action follows from the state block: how many tool calls are done."""
    context = messages[1].content if len(messages) > 1 else ""  # type: ignore[union-attr]
    found = _DONE.search(context)
    done = int(found.group(1)) if found else 0
    if done >= CALLS:
        return ScriptedModel.call("finish", {"answer": f"{done} calls"})
    return ScriptedModel.call(TOOLS[done % len(TOOLS)], {"item": done})


profile = FaultProfile(transient_rate=0.10, malformed_rate=0.05)
model = FaultyModel(
    ScriptedModel(play), profile, seed=int(os.environ.get("MAINSPRING_TEST_SEED", "1"))
)
worker_agent = app.agent(
    "pipeline",
    model=model,
    instructions="Process every item.",
    tools=[fetch, parse, enrich, store, notify],
    limits=ms.Limits(max_steps=400),
    max_repairs=5,
    model_retry=ms.RetryPolicy(max_attempts=6, initial_s=0.01, max_s=0.05),
)
