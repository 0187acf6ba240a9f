"""An App for the dashboard's triage tests: a parent whose children spend the tokens,
an agent whose tool is irreversible, a run that fails, a long agent run.

Reads MAINSPRING_DATABASE_URL (the store) from the environment.
"""

from __future__ import annotations

import asyncio
import dataclasses

import mainspring as ms
from mainspring.limits import Price
from mainspring.models import ModelResponse, Usage
from mainspring.testing import ScriptedModel

app = ms.App(lease_s=2.0, poll_interval_s=0.05)
PRICES = {"scripted": Price(input=3.0, output=15.0)}


def _spent(reply: ModelResponse, tokens_in: int, tokens_out: int) -> ModelResponse:
    return dataclasses.replace(reply, usage=Usage(input_tokens=tokens_in, output_tokens=tokens_out))


@app.tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"{topic}: three sources agree"


@app.tool(effect="irreversible")
def refund(order: str, cents: int, note: str = "") -> str:
    """Refund an order (money leaves: it cannot be undone)."""
    return f"refunded {cents} cents on {order}"


researcher = app.agent(
    "researcher",
    model=ScriptedModel(
        [
            _spent(ScriptedModel.call("lookup", {"topic": "the topic"}), 9_000, 1_000),
            _spent(ScriptedModel.call("finish", {"answer": "a page of notes"}), 10_500, 1_500),
        ],
        turn_from="history",
    ),
    instructions="Research the topic.",
    tools=[lookup],
    prices=PRICES,
)

payer = app.agent(
    "payer",
    model=ScriptedModel(
        [
            _spent(
                ScriptedModel.call(
                    "refund",
                    {"order": "A-7", "cents": 4950, "note": "the customer's card"},
                    text="refunding",
                ),
                1_200,
                80,
            ),
            _spent(ScriptedModel.call("finish", {"answer": "refunded"}), 1_400, 40),
        ],
        turn_from="history",
    ),
    instructions="Refund what the customer is owed.",
    tools=[refund],
    prices=PRICES,
)


@app.workflow
async def brief(ctx: ms.RunContext, topics: list[str]) -> str:
    """Three children research; a person approves the brief (approved at the timeout)."""
    notes = await asyncio.gather(
        *(ctx.child(researcher, f"research {t}", key=f"research-{t}") for t in topics)
    )
    decision = await ctx.approval(
        "publish",
        preview={"summary": "it's the team's brief — café notes", "reports": len(notes)},
        timeout=3600,
        default="approve",
    )
    return "published" if decision.approved else f"held: {decision.reason}"


@app.workflow
async def flaky(ctx: ms.RunContext, order: int) -> None:
    await ctx.step(lambda: order, name="read-order")
    raise ValueError(f"order {order} isn't valid\nthe second line of the message")
