"""A Pydantic AI support agent made durable, for the SIGKILL tests: an effectful tool
(an effect ledger), an approval, and a sub-agent asked from a tool (a child run).

MAINSPRING_DATABASE_URL: the store; MAINSPRING_TEST_LEDGER: the ledger file;
MAINSPRING_TEST_OPENAI_URL: the FakeOpenAIServer the test runs (127.0.0.1).
"""

from __future__ import annotations

import os

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import mainspring as ms
from mainspring.integrations.pydantic_ai import durable
from mainspring.testing import EffectLedger

app = ms.App(lease_s=float(os.environ.get("MAINSPRING_TEST_LEASE_S", "1.0")))
ledger = EffectLedger(os.environ["MAINSPRING_TEST_LEDGER"])
model = OpenAIChatModel(
    "gpt-4.1-mini",
    provider=OpenAIProvider(base_url=os.environ["MAINSPRING_TEST_OPENAI_URL"], api_key="sk-t"),
)

billing_agent = Agent(model, name="billing", instructions="Answer billing questions.")
billing = durable(app, billing_agent)

support_agent = Agent(model, name="support", instructions="Resolve the ticket.")


@support_agent.tool_plain
def refund(order: int) -> str:
    """Refund an order."""
    ledger.apply(ms.current_step().idempotency_key, "refund", order)
    return f"refunded {order}"


@support_agent.tool_plain(requires_approval=True)
def close_ticket(ticket: int) -> str:
    """Close a ticket (a person approves)."""
    ledger.apply(ms.current_step().idempotency_key, "close", ticket)
    return f"closed {ticket}"


@support_agent.tool_plain
async def ask_billing(question: str) -> str:
    """Ask the billing agent."""
    result = await billing_agent.run(question)
    return str(result.output)


support = durable(app, support_agent, delegates=["ask_billing"])
