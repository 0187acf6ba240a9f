"""Agents for the multi-process rate-limit tests: an OpenAI model behind the enforcing
fake server, with the limit declared to mainspring, or (MAINSPRING_TEST_UNDECLARED=1)
left for it to learn from the server's headers.

MAINSPRING_DATABASE_URL: the store; MAINSPRING_TEST_BASE_URL: the fake server's
base URL; MAINSPRING_TEST_TPM / _RPM / _PERIOD_S: the limits it enforces.
"""

from __future__ import annotations

import os

import mainspring as ms
from mainspring.limits import RateLimit, RateLimits
from mainspring.models import ModelSettings, OpenAIModel

PERIOD_S = float(os.environ.get("MAINSPRING_TEST_PERIOD_S", "2"))
TPM = float(os.environ.get("MAINSPRING_TEST_TPM", "20000"))
RPM = float(os.environ.get("MAINSPRING_TEST_RPM", "1000"))

DECLARED = RateLimit(
    provider="openai",
    model="gpt-4.1-mini",
    tpm=TPM,
    rpm=RPM,
    period_s=PERIOD_S,
    headroom=0.05,
)
# Undeclared: nothing but the length of the fake's "minute" (a real provider's is 60 s).
LEARNED = RateLimits(period_s=PERIOD_S, headroom=0.05)

app = ms.App(
    lease_s=5.0,
    poll_interval_s=0.02,
    inline_wait_s=0.2,
    rate_limits=LEARNED if os.environ.get("MAINSPRING_TEST_UNDECLARED") == "1" else [DECLARED],
)


@app.tool
def note(n: int) -> str:
    """Record that step n of the batch is done."""
    return f"step {n} recorded"


worker_agent = app.agent(
    "rated",
    model=OpenAIModel(
        "gpt-4.1-mini",
        base_url=os.environ.get("MAINSPRING_TEST_BASE_URL", "http://127.0.0.1:9/v1"),
        api_key="sk-test",
        timeout_s=30,
    ),
    instructions="Work through the batch: call note for each step, then finish.",
    tools=[note],
    settings=ModelSettings(max_tokens=400),
)
