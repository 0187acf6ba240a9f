"""The workflow that ``mainspring demo`` runs and crashes: migrate customers to a new CRM.

Workers load it as ``mainspring.cli._demo_app:app``. It reads two environment
variables: ``MAINSPRING_DATABASE_URL`` (the store; ``ms.App`` reads it) and
``MAINSPRING_DEMO_LEDGER`` (the SQLite file that plays the outside world).

The "CRM" is an :class:`EffectLedger`: like a payment or CRM API that takes an
idempotency key, it applies each key's effect once and counts every call, so the
demo can show afterwards that a crash repeated a call but never an effect.
"""

from __future__ import annotations

import os
import time
from typing import Any

import mainspring as ms
from mainspring.testing import EffectLedger

__all__ = ["LEDGER_ENV", "app", "crm", "migrate_customers"]

LEDGER_ENV = "MAINSPRING_DEMO_LEDGER"  # set by `mainspring demo`
# The CRM's API latency: a request travels, the CRM applies it, the reply travels back.
# A worker killed during the reply leaves an effect done that the journal has not seen.
REQUEST_S = 0.03
REPLY_S = 0.05

_NAMES = ("Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Radia")

if not os.environ.get(LEDGER_ENV):
    raise ms.ConfigError(
        f"{__name__} needs {LEDGER_ENV} (the effect ledger file) in the environment; "
        "`mainspring demo` sets it for the workers it starts"
    )

app = ms.App()  # the database: MAINSPRING_DATABASE_URL
crm = EffectLedger(os.environ[LEDGER_ENV])


def export_batch(count: int) -> list[dict[str, Any]]:
    """Read the records to migrate from the old system (a read: no effect)."""
    return [
        {
            "id": f"cus_{i:04d}",
            "name": f"{_NAMES[i % len(_NAMES)]} {chr(ord('A') + i % 26)}.",
            "email": f"customer{i}@example.com",
        }
        for i in range(1, count + 1)
    ]


def upsert_customer(record: dict[str, Any]) -> dict[str, str]:
    """Write one record to the CRM, which applies each idempotency key once."""
    time.sleep(REQUEST_S)
    applied = crm.apply(ms.current_step().idempotency_key, "upsert_customer", record)
    time.sleep(REPLY_S)
    return {"customer": record["id"], "crm": "written" if applied else "repeated key: ignored"}


def send_completion_email(migrated: int) -> None:
    """Tell the sales team. The mail server does not deduplicate: a second call
    would send a second email, so this step runs at most once."""
    crm.apply_unsafe(
        ms.current_step().idempotency_key, "send_completion_email", {"migrated": migrated}
    )


@app.workflow
async def migrate_customers(ctx: ms.RunContext, count: int) -> dict[str, Any]:
    """Migrate ``count`` customers: ``count + 2`` journaled steps (export, upserts, email)."""
    records = await ctx.step(export_batch, count)
    repeats = 0
    for record in records:
        # Journaled: never re-run once completed. A crash mid-step re-runs it under the
        # same idempotency key, and the CRM recognises the repeat.
        written = await ctx.step(upsert_customer, record)
        if written["crm"] != "written":
            repeats += 1
    try:
        await ctx.step(send_completion_email, len(records), mode="at_most_once")
        email = "sent"
    except ms.StepInterrupted:
        email = "unknown: interrupted, not re-sent; check the outbox"
    return {"migrated": len(records), "repeats_recognised_by_crm": repeats, "email": email}
