"""The agent of ``bench/rate_limit.py``: an OpenAI model behind the enforcing fake
server. RATE_BENCH_LIMITS says what the App is told: ``declared`` (the limit),
``learned`` (nothing but the fake's short "minute": limits learned from the server's
headers), ``default`` (nothing at all: ``ms.App()`` as a new user writes it) or ``off``
(``rate_limits=False``, the default before limits were on). The rest is read from the
environment the bench sets: MAINSPRING_DATABASE_URL, RATE_BENCH_BASE_URL, RATE_BENCH_TPM,
RATE_BENCH_RPM, RATE_BENCH_PERIOD_S."""

from __future__ import annotations

import os

import mainspring as ms
from mainspring.limits import RateLimit, RateLimits
from mainspring.models import ModelSettings, OpenAIModel

PERIOD_S = float(os.environ.get("RATE_BENCH_PERIOD_S", "2"))
DECLARED = RateLimit(
    provider="openai",
    model="gpt-4.1-mini",
    tpm=float(os.environ.get("RATE_BENCH_TPM", "40000")),
    rpm=float(os.environ.get("RATE_BENCH_RPM", "600")),
    period_s=PERIOD_S,
    headroom=0.02,
)
# Undeclared: only the length of the fake's "minute" (a real provider's is 60 s).
LEARNED = RateLimits(period_s=PERIOD_S, headroom=0.02)

_MODE = os.environ.get("RATE_BENCH_LIMITS", "declared")
_LIMITS: dict[str, dict[str, object]] = {
    "declared": {"rate_limits": [DECLARED]},
    "learned": {"rate_limits": LEARNED},
    "default": {},
    "off": {"rate_limits": False},
}
app = ms.App(lease_s=5.0, poll_interval_s=0.02, inline_wait_s=0.2, **_LIMITS[_MODE])  # type: ignore[arg-type]


@app.tool
def note(n: int) -> str:
    """Record that step n of the batch is done."""
    return f"step {n} recorded"


worker_agent = app.agent(
    "rate-bench",
    model=OpenAIModel(
        "gpt-4.1-mini",
        base_url=os.environ.get("RATE_BENCH_BASE_URL", "http://127.0.0.1:9/v1"),
        api_key="sk-test",
        timeout_s=30,
    ),
    instructions="Work through the batch: call note for each step, then finish.",
    tools=[note],
    settings=ModelSettings(max_tokens=400),
)
