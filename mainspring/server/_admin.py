"""Webhook registrations (``admin`` scope): list, add and remove the endpoints that
the outbox in ``_webhooks`` delivers to."""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations.
from fastapi import APIRouter, Response

from .. import RunNotFound
from ..storage import Webhook
from ._context import Admin, Ctx, responses
from ._schemas import WebhookIn, WebhookOut

__all__ = ["router"]

router = APIRouter(tags=["admin"])


def _out(hook: Webhook, secret: str | None = None) -> WebhookOut:
    return WebhookOut(
        id=hook.id,
        url=hook.url,
        events=list(hook.events),
        created_at=hook.created_at,
        secret=secret,
    )


@router.get("/webhooks", response_model=list[WebhookOut], responses=responses())
def list_webhooks(_key: Admin, ctx: Ctx) -> list[WebhookOut]:
    return [_out(w) for w in ctx.app.admin.list_webhooks()]


@router.post("/webhooks", status_code=201, response_model=WebhookOut, responses=responses(413))
def add_webhook(body: WebhookIn, _key: Admin, ctx: Ctx) -> WebhookOut:
    """Register an endpoint; the response carries its signing secret, once.
    Targets that are not globally routable (loopback, private, link-local, shared
    and the IPv6 forms that carry such an IPv4 address) are refused unless the
    server allows their network (``--webhook-allow``)."""
    ctx.targets.check_url(body.url)
    hook, secret = ctx.app.admin.add_webhook(body.url, secret=body.secret, events=body.events)
    return _out(hook, secret)


@router.delete("/webhooks/{webhook_id}", status_code=204, responses=responses(404))
def remove_webhook(webhook_id: str, _key: Admin, ctx: Ctx) -> Response:
    if not ctx.app.admin.remove_webhook(webhook_id):
        raise RunNotFound(f"no webhook {webhook_id!r}")
    return Response(status_code=204)
