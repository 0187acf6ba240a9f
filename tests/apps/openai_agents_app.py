"""An OpenAI Agents SDK agent for the process tests: a triage agent hands off to
billing, which audits every third order through an agent used as a tool (with a
read tool of its own) and charges every order with an effectful tool.

MAINSPRING_DATABASE_URL: the store; MAINSPRING_TEST_LEDGER: the effect ledger;
MAINSPRING_TEST_OPENAI_URL: the FakeOpenAIServer's base URL (the test answers);
MAINSPRING_TEST_LEASE_S: the lease (1 s by default).
"""

from __future__ import annotations

import os

import openai
from agents import Agent, RunConfig, function_tool

import mainspring as ms
from mainspring.integrations.openai_agents import durable, effect
from mainspring.testing import EffectLedger

app = ms.App(lease_s=float(os.environ.get("MAINSPRING_TEST_LEASE_S", "1.0")), poll_interval_s=0.02)
ledger = EffectLedger(os.environ["MAINSPRING_TEST_LEDGER"])
MODEL = "gpt-4.1-mini"


@effect("read")
@function_tool
def lookup(order: int) -> str:
    """Look an order up."""
    return f"order {order}: paid"


@function_tool
def charge(order: int) -> str:
    """Charge an order (a payment API that deduplicates by idempotency key)."""
    ledger.apply(ms.current_step().idempotency_key, "charge", order)
    return f"charged {order}"


auditor = Agent(name="auditor", instructions="auditor", tools=[lookup], model=MODEL)
billing = Agent(
    name="billing",
    instructions="billing",
    tools=[charge, auditor.as_tool(tool_name="audit", tool_description="Audit an order.")],
    model=MODEL,
)
triage = Agent(name="triage", instructions="triage", handoffs=[billing], model=MODEL)

support = durable(
    app,
    triage,
    name="support",
    openai_client=openai.AsyncOpenAI(
        base_url=os.environ.get("MAINSPRING_TEST_OPENAI_URL", "http://127.0.0.1:9/v1"),
        api_key="sk-test",
    ),
    run_config=RunConfig(tracing_disabled=True),
    max_turns=1000,
)
