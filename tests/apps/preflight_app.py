"""Agents and workflows for the preflight tests: a careless one and a careful one."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import mainspring as ms
from mainspring.limits import Price
from mainspring.testing import ScriptedModel

app = ms.App("sqlite:///unused-preflight.db")


# -- careless: every checklist item has something missing ----------------------------------


def lookup(customer):  # type: ignore[no-untyped-def]
    """Look a customer up."""
    return {"customer": customer}


def update_crm(customer: str, tier: str) -> dict[str, Any]:
    """Write a customer's tier (no idempotency key, no undo)."""
    return {"ok": True}


def wipe_account(customer: str) -> dict[str, Any]:
    """Delete an account."""
    return {"deleted": customer}


careless = app.agent(
    "careless",
    model=ScriptedModel([], model_id="careless-model"),
    instructions="Sort the customers out.",
    tools=[
        ms.tool(lookup),
        ms.tool(update_crm, effect="write"),
        ms.tool(wipe_account, effect="irreversible", requires_approval=False),
    ],
    limits=ms.Limits(max_steps=None),
)


# -- careful: every item answered ------------------------------------------------------------


@dataclass(frozen=True)
class Customer:
    id: str
    tier: str


@dataclass(frozen=True)
class Receipt:
    id: str
    applied: bool


def find_customer(customer_id: str) -> Customer:
    """Look a customer up."""
    return Customer(id=customer_id, tier="gold")


def set_tier(customer_id: str, tier: str, *, ctx: ms.ToolContext) -> Receipt:
    """Write a customer's tier, keyed by ctx.idempotency_key."""
    return Receipt(id=ctx.idempotency_key, applied=True)


def undo_set_tier(customer_id: str, *, ctx: ms.ToolContext) -> Receipt:
    """Put the previous tier back."""
    return Receipt(id=ctx.idempotency_key, applied=True)


def close_account(customer_id: str, *, ctx: ms.ToolContext) -> Receipt:
    """Close an account. Compensation: reopen it through support within 30 days."""
    return Receipt(id=ctx.idempotency_key, applied=True)


careful = app.agent(
    "careful",
    model=ScriptedModel([], model_id="careful-model"),
    instructions=(
        "Use find_customer to read a customer, set_tier to change a tier (undo_set_tier "
        "reverts it), and close_account only when the ticket asks for it."
    ),
    tools=[
        ms.tool(find_customer),
        ms.tool(set_tier, effect="write"),
        ms.tool(undo_set_tier, effect="write", description="Undo set_tier: the old tier back."),
        ms.tool(close_account, effect="irreversible"),
    ],
    limits=ms.Limits(max_steps=40, max_wall_s=600, max_cost_usd=1.0),
    validators=[lambda answer, state: None if answer else "empty answer"],
    prices={"careful-model": Price(0.4, 1.6)},
)


# -- workflows -------------------------------------------------------------------------------


def fetch(n: int) -> int:
    return n


@app.workflow
async def sloppy_flow(ctx: ms.RunContext, n):  # type: ignore[no-untyped-def]
    started = time.time()
    salt = random.random()
    value = await ctx.step(lambda: n + salt)
    await ctx.step(fetch, value, mode="at_most_once")
    return started


@app.workflow
async def tidy_flow(ctx: ms.RunContext, n: int) -> int:
    value = await ctx.step(fetch, n, name="fetch", timeout=10)
    decision = await ctx.wait_for("go")
    if decision:
        value = await ctx.step(fetch, value, name="apply", mode="at_most_once", timeout=10)
    return value


not_an_agent = 42
