"""The mailer workflow: tier, write, approve, send once, record."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

import mainspring as ms
from mainspring.models import Model, SystemMessage, UserMessage
from mainspring.testing import EffectLedger

__all__ = [
    "Customer",
    "Delivery",
    "Email",
    "MailerConfig",
    "MailerResult",
    "build",
    "customers",
    "tier_of",
    "writer_turn",
]

WORKFLOW = "mail_customers"
Tier = Literal["vip", "active", "lapsed"]
WRITER_INSTRUCTIONS = (
    "Write one short email per customer, in their tier's tone. Reply with a JSON object "
    "mapping each customer id to {'subject': ..., 'body': ...}."
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Customer(_Frozen):
    id: str
    name: str
    email: str
    lifetime_value: int  # USD
    days_since_order: int
    tier: Tier | None = None


class Email(_Frozen):
    customer_id: str
    to: str
    subject: str
    body: str


class Delivery(_Frozen):
    """What the mail API said; the journal keeps one per customer."""

    customer_id: str
    key: str
    status: Literal["delivered", "bounced"]
    first_send: bool  # False: the API had this key already (a re-run after a crash)


class MailerResult(_Frozen):
    approved: bool
    tiers: dict[str, int]
    statuses: dict[str, int]
    resends_recognised: int
    reason: str | None = None


_EMAILS = TypeAdapter(dict[str, dict[str, str]])


def customers(count: int = 200) -> list[Customer]:
    """The customer list (deterministic; every 40th address bounces)."""
    if not 1 <= count <= 9999:
        raise ValueError(f"count must be between 1 and 9999, got {count!r}")
    names = ("Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Radia")
    return [
        Customer(
            id=f"c{i:04d}",
            name=names[i % len(names)],
            email=f"c{i}@{'bounce.' if i % 40 == 0 else ''}example.com",
            lifetime_value=(i * 7919) % 12000,
            days_since_order=(i * 104729) % 400,
        )
        for i in range(1, count + 1)
    ]


def tier_of(c: Customer) -> Tier:
    """The rules: VIP from $8,000 lifetime; active if they ordered in the last 90 days."""
    if c.lifetime_value >= 8000:
        return "vip"
    return "active" if c.days_since_order <= 90 else "lapsed"


def writer_turn(messages: Any, tools: Any) -> str:
    """A ScriptedModel turn that writes each customer's email from a template per tier."""
    lines = {
        "vip": ("A thank-you for you, {name}", "you are one of our best customers"),
        "active": ("{name}, something new for you", "thanks for your recent order"),
        "lapsed": ("We miss you, {name}", "here is 15% off your next order"),
    }
    out = {}
    for c in json.loads(messages[-1].content):
        subject, line = lines[c["tier"]]
        out[c["id"]] = {
            "subject": subject.format(name=c["name"]),
            "body": f"Hi {c['name']}, {line}. ({c['tier']})",
        }
    return json.dumps(out)


@dataclass(frozen=True, kw_only=True)
class MailerConfig:
    """chunk: customers per writer request; send_s / reply_s: the mail API's latency."""

    chunk: int = 25
    send_s: float = 0.0
    reply_s: float = 0.0


def build(
    app: ms.App, mail_api: EffectLedger, writer: Model, config: MailerConfig | None = None
) -> ms.Workflow[[int], MailerResult]:
    """Register ``mail_customers(count)`` on ``app``; emails go to ``mail_api``."""
    cfg = config or MailerConfig()
    if cfg.chunk < 1 or cfg.send_s < 0 or cfg.reply_s < 0:
        raise ms.ConfigError(f"invalid MailerConfig: {cfg!r}")

    def segment(count: int) -> list[Customer]:
        return [c.model_copy(update={"tier": tier_of(c)}) for c in customers(count)]

    async def write(batch: list[Customer]) -> list[Email]:
        brief = [{"id": c.id, "name": c.name, "tier": c.tier} for c in batch]
        reply = await writer.request(
            [SystemMessage(content=WRITER_INSTRUCTIONS), UserMessage(content=json.dumps(brief))]
        )
        try:
            texts = _EMAILS.validate_json(reply.text or "")
            return [
                Email(
                    customer_id=c.id,
                    to=c.email,
                    subject=texts[c.id]["subject"],
                    body=texts[c.id]["body"],
                )
                for c in batch
            ]
        except (ValidationError, KeyError) as exc:
            raise ValueError(f"the writer's reply does not fit: {exc}") from None  # retried

    def send(email: Email) -> Delivery:
        key = ms.current_step().idempotency_key
        time.sleep(cfg.send_s)
        first = mail_api.apply(key, "send_email", email.model_dump())
        time.sleep(cfg.reply_s)
        status: Literal["delivered", "bounced"] = (
            "bounced" if "@bounce." in email.to else "delivered"
        )
        return Delivery(customer_id=email.customer_id, key=key, status=status, first_send=first)

    async def mail_customers(ctx: ms.RunContext, count: int) -> MailerResult:
        people = await ctx.step(segment, count, name="segment")
        tiers = dict(sorted(Counter(str(c.tier) for c in people).items()))
        emails: list[Email] = []
        for i in range(0, len(people), cfg.chunk):
            emails += await ctx.step(write, people[i : i + cfg.chunk], name="write")
        decision = await ctx.approval(
            "send",
            preview={"emails": len(emails), "tiers": tiers, "sample": emails[0].model_dump()},
        )
        if not decision.approved:
            return MailerResult(
                approved=False,
                tiers=tiers,
                statuses={},
                resends_recognised=0,
                reason=decision.reason,
            )
        deliveries = [await ctx.step(send, e, name="send_email") for e in emails]
        return MailerResult(
            approved=True,
            tiers=tiers,
            statuses=dict(sorted(Counter(d.status for d in deliveries).items())),
            resends_recognised=sum(not d.first_send for d in deliveries),
        )

    return app.workflow(name=WORKFLOW)(mail_customers)
