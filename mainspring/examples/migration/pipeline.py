"""The migration workflow: five stages, a stage gate, idempotent writes, compensation.

:func:`build` registers it on an App with the outside systems it talks to, so the same
code runs in-process (``python -m mainspring.examples.migration``, the tests) and in worker
processes (``mainspring.examples.migration.worker_app``, which ``mainspring demo`` starts).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pydantic import TypeAdapter, ValidationError

import mainspring as ms
from mainspring.models import Model, SystemMessage, UserMessage

from .schemas import (
    ImportReceipt,
    LegacyCustomer,
    MigrationResult,
    Reconciliation,
    Rejection,
    TargetCustomer,
    ValidationReport,
)
from .target import TargetStore, legacy_rows

__all__ = ["MalformedSegments", "MigrationConfig", "ReconciliationFailed", "build"]

WORKFLOW = "migrate_customers"
SEGMENT_INSTRUCTIONS = (
    "You label customers for the sales team. Reply with a JSON object mapping each "
    "customer id to a segment: '<region>-<size>', region emea/amer/apac, size smb/mid/large."
)
_SEGMENTS = TypeAdapter(dict[str, str])


class MalformedSegments(ValueError):
    """The model's segment labels did not parse or did not cover the batch (retried)."""


class ReconciliationFailed(ms.MainspringError):
    """The target does not hold what the import sent; the import was undone."""


@dataclass(frozen=True, kw_only=True)
class MigrationConfig:
    """How the migration runs.

    Attributes:
        chunk: customers per model request in the transform stage.
        flaky_every: every n-th customer's first import attempt fails with a 503;
            every other one of those fails *after* the target applied the write (the
            reply was lost), so the retry must be recognised by its idempotency key.
        request_s / reply_s: the target's latency on either side of the write.
        retry: the steps' retry policy.
    """

    chunk: int = 10
    flaky_every: int = 0
    request_s: float = 0.0
    reply_s: float = 0.0
    retry: ms.RetryPolicy = field(
        default_factory=lambda: ms.RetryPolicy(max_attempts=4, initial_s=0.0)
    )

    def __post_init__(self) -> None:
        if self.chunk < 1 or self.flaky_every < 0 or self.request_s < 0 or self.reply_s < 0:
            raise ms.ConfigError(f"invalid MigrationConfig: {self!r}")


def _tier(row: LegacyCustomer) -> str:
    if row.plan == "enterprise" or row.seats >= 250:
        return "enterprise"
    return "business" if row.plan in ("team", "pro") and row.seats >= 20 else "starter"


def _phone(raw: str) -> str:
    return "+" + "".join(c for c in raw if c.isdigit())


def export(count: int) -> list[dict[str, Any]]:
    """Stage 1: read the old system (a read; no effect)."""
    return legacy_rows(count)


def validate(rows: list[dict[str, Any]]) -> ValidationReport:
    """Stage 2: keep the rows that fit the schema, refuse the others with a reason."""
    valid, rejected = [], []
    for row in rows:
        try:
            valid.append(LegacyCustomer.model_validate(row))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
            )
            rejected.append(Rejection(id=str(row.get("id", "?")), reason=problems))
    return ValidationReport(valid=valid, rejected=rejected)


def _segments(text: str | None, rows: list[LegacyCustomer]) -> dict[str, str]:
    """The model's segment labels, one per row, or MalformedSegments (the step retries)."""
    try:
        segments = _SEGMENTS.validate_json(text or "")
    except ValidationError as exc:
        raise MalformedSegments(f"unreadable segments {text!r:.80}: {exc}") from None
    if missing := sorted({r.id for r in rows} - set(segments)):
        raise MalformedSegments(f"no segment for {missing}")
    return segments


def _reshape(row: LegacyCustomer, segment: str) -> TargetCustomer:
    """One legacy row as the new system holds it."""
    first, _, last = row.full_name.partition(" ")
    return TargetCustomer(
        customer_id=row.id,
        first_name=first,
        last_name=last or "-",
        email=row.email.lower(),
        phone=_phone(row.phone),
        country=row.country,
        tier=_tier(row),  # type: ignore[arg-type]
        segment=segment,
    )


def _over_the_network(
    cfg: MigrationConfig, customer_id: str, attempt: int, write: Callable[[], bool]
) -> bool:
    """The target's ``write`` as the network delivers it: with the config's latency
    either side, and every ``flaky_every``-th customer's first attempt failing, half of
    them after the target applied the write (the reply was lost)."""
    n = int(customer_id.removeprefix("cus_"))
    flaky = cfg.flaky_every and n % cfg.flaky_every == 0 and attempt == 1
    time.sleep(cfg.request_s)
    if flaky and (n // cfg.flaky_every) % 2:
        raise ms.TransientError(f"target: 503 Service Unavailable for {customer_id}")
    applied = write()
    time.sleep(cfg.reply_s)
    if flaky:
        raise ms.TransientError(f"target: reply lost after writing {customer_id}")
    return applied


def _preview(
    report: ValidationReport, customers: list[TargetCustomer], tiers: dict[str, int]
) -> dict[str, Any]:
    """What the reviewer sees at the import gate: counts, tiers and a sample."""
    return {
        "import": len(customers),
        "rejected": len(report.rejected),
        "tiers": tiers,
        "rejections": [r.model_dump() for r in report.rejected[:3]],
        "sample": [c.model_dump() for c in customers[:2]],
    }


def build(
    app: ms.App,
    target: TargetStore,
    model: Model,
    config: MigrationConfig | None = None,
) -> ms.Workflow[[int], MigrationResult]:
    """Register ``migrate_customers(count)`` on ``app``.

    Args:
        target: the new system the import writes to.
        model: labels each customer's segment in the transform stage (a
            ``ScriptedModel`` here; any :class:`~mainspring.models.Model` works).
    """
    cfg = config or MigrationConfig()

    async def transform(rows: list[LegacyCustomer]) -> list[TargetCustomer]:
        """Stage 3: reshape rows for the new system; the model labels segments."""
        brief = [{"id": r.id, "country": r.country, "seats": r.seats} for r in rows]
        reply = await model.request(
            [
                SystemMessage(content=SEGMENT_INSTRUCTIONS),
                UserMessage(content=json.dumps(brief)),
            ]
        )
        segments = _segments(reply.text, rows)
        return [_reshape(r, segments[r.id]) for r in rows]

    def import_customer(customer: TargetCustomer) -> ImportReceipt:
        """Stage 4, one customer: an idempotent write under the step's key."""
        step = ms.current_step()
        key = step.idempotency_key
        write = partial(target.upsert, key, customer)
        applied = _over_the_network(cfg, customer.customer_id, step.attempt, write)
        return ImportReceipt(customer_id=customer.customer_id, key=key, applied=applied)

    def reconcile(expected: list[TargetCustomer]) -> Reconciliation:
        """Stage 5: read the target back and compare it with what was sent."""
        rows = target.rows()
        missing = [c.customer_id for c in expected if c.customer_id not in rows]
        mismatched = [
            c.customer_id
            for c in expected
            if c.customer_id in rows and rows[c.customer_id] != c.model_dump()
        ]
        return Reconciliation(
            expected=len(expected), found=len(rows), missing=missing, mismatched=mismatched
        )

    def undo_import(receipts: list[ImportReceipt]) -> int:
        """Compensation: remove what the import wrote, each delete under its own key."""
        key = ms.current_step().idempotency_key
        for r in receipts:
            target.delete(f"{key}:{r.customer_id}", r.customer_id)
        return len(receipts)

    async def migrate_customers(ctx: ms.RunContext, count: int) -> MigrationResult:
        """Export ``count`` legacy customers, validate, transform, import behind a stage
        gate, reconcile; undo the import if reconciliation fails."""
        rows = await ctx.step(export, count, name="export")
        report = await ctx.step(validate, rows, name="validate")
        customers: list[TargetCustomer] = []
        for i in range(0, len(report.valid), cfg.chunk):
            chunk = report.valid[i : i + cfg.chunk]
            customers += await ctx.step(transform, chunk, name="transform", retry=cfg.retry)
        tiers: dict[str, int] = dict(sorted(Counter(c.tier for c in customers).items()))
        await ctx.gate("import", preview=_preview(report, customers, tiers))
        receipts = [
            await ctx.step(import_customer, c, name="import_customer", retry=cfg.retry)
            for c in customers
        ]
        check = await ctx.step(reconcile, customers, name="reconcile")
        if not check.ok:
            undone = await ctx.step(undo_import, receipts, name="undo_import", retry=cfg.retry)
            raise ReconciliationFailed(
                f"reconciliation failed: {len(check.missing)} missing "
                f"({', '.join(check.missing[:5])}), {len(check.mismatched)} mismatched; "
                f"the import was undone ({undone} customers removed)"
            )
        return MigrationResult(
            exported=len(rows),
            rejected=report.rejected,
            imported=len(receipts),
            repeats_recognised=sum(not r.applied for r in receipts),
            tiers=tiers,
            reconciled=True,
        )

    return app.workflow(name=WORKFLOW)(migrate_customers)


def segment_writer(messages: Any, tools: Any) -> str:
    """The scripted model's turn: label each customer by region and size, by rule."""
    region = {"DE": "emea", "FR": "emea", "GB": "emea", "NL": "emea", "US": "amer"}
    region |= {"BR": "amer", "CA": "amer", "JP": "apac", "IN": "apac"}
    brief = json.loads(messages[-1].content)
    return json.dumps(
        {
            c["id"]: f"{region.get(c['country'], 'emea')}-"
            + ("large" if c["seats"] >= 250 else "mid" if c["seats"] >= 50 else "smb")
            for c in brief
        }
    )
