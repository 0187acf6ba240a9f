"""Agents for the multi-process rate-limit tests: an OpenAI model behind the enforcing
fake server, with the limit declared to mainspring, or (MAINSPRING_TEST_UNDECLARED=1)
left for it to learn from the server's headers.

MAINSPRING_DATABASE_URL: the store; MAINSPRING_TEST_BASE_URL: the fake server's
base URL; MAINSPRING_TEST_TPM / _RPM / _PERIOD_S: the limits it enforces;
MAINSPRING_TEST_LEASE_S: the workers' lease. MAINSPRING_TEST_KILL_PROBE_FILE: while
this file exists, the worker whose booking of a cold limiter's probe has just
committed removes it, notes the time in ``<file>.killed`` and SIGKILLs itself:
before the ``rate:`` step that booked it can journal its end.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import mainspring as ms
from mainspring.limits import RateLimit, RateLimits
from mainspring.models import ModelSettings, OpenAIModel
from mainspring.storage import Store, open_store
from mainspring.testing import FaultyStore

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

KILL = os.environ.get("MAINSPRING_TEST_KILL_PROBE_FILE")


def _kill_after_probe(method: str, args: Any, kwargs: Any, result: Any) -> None:
    """Called after every store call that returned: a booking answers ``(start, now,
    number, kind, trimmed)``; kind ``"probe"`` took the cold limiter's gate."""
    if method != "update_rate_limit" or not isinstance(result, tuple) or len(result) != 5:
        return
    if result[3] != "probe" or KILL is None:
        return
    try:
        os.unlink(KILL)  # once, across every worker process
    except FileNotFoundError:
        return
    Path(KILL + ".killed").write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def _store() -> Store | None:
    if KILL is None:
        return None  # MAINSPRING_DATABASE_URL, as any App
    return FaultyStore(
        open_store(os.environ["MAINSPRING_DATABASE_URL"]), after_call=_kill_after_probe
    )


app = ms.App(
    _store(),
    lease_s=float(os.environ.get("MAINSPRING_TEST_LEASE_S", "5")),
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
