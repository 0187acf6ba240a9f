"""An App for the log tests: an agent whose model is the OpenAI SDK talking to a
FakeOpenAIServer (so httpx, under the SDK, logs its requests), and a workflow that
fails (so a webhook fires).

MAINSPRING_DATABASE_URL: the store; MAINSPRING_TEST_OPENAI_URL: the fake's base URL.
"""

from __future__ import annotations

import os

import mainspring as ms
from mainspring.models import OpenAIModel

app = ms.App(poll_interval_s=0.05)
model = OpenAIModel(
    "gpt-4.1-mini", base_url=os.environ.get("MAINSPRING_TEST_OPENAI_URL"), api_key="sk-test"
)
helper = app.agent("helper", model=model, instructions="Answer.")


@app.workflow
async def fails(ctx: ms.RunContext) -> None:
    await ctx.step(_boom, name="boom", retry=ms.RetryPolicy.never())


def _boom() -> None:
    raise ValueError("the disk is full")
