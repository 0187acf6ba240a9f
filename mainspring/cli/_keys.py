"""``mainspring keys`` and ``mainspring webhooks``: who may call the API, and who hears
about runs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from .. import ConfigError, RunNotFound
from ..storage import SCOPES, WEBHOOK_EVENTS
from ._common import AppOption, DbOption, JsonOption, cli_errors, console, open_app, print_json

__all__ = ["keys_commands", "webhooks_commands"]

keys_commands = typer.Typer(
    name="keys", help="API keys (stored hashed) and their scopes.", no_args_is_help=True
)
webhooks_commands = typer.Typer(
    name="webhooks", help="Webhook endpoints, signed with HMAC-SHA256.", no_args_is_help=True
)


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _split(values: list[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


@keys_commands.command("create")
def keys_create(
    name: Annotated[str, typer.Argument(help="Who or what uses the key.")],
    scope: Annotated[
        list[str],
        typer.Option(
            "--scope",
            help=f"Repeatable or comma-separated: {', '.join(SCOPES)} (admin implies all;"
            " metrics can scrape /metrics and nothing else).",
        ),
    ],
    db: DbOption = None,
    app_spec: AppOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a key. The key is printed once; only its hash is stored."""
    with cli_errors(), open_app(db, app_spec) as app:
        key, token = app.admin.create_key(name, _split(scope))
    if as_json:
        print_json({"id": key.id, "name": key.name, "scopes": list(key.scopes), "key": token})
        return
    console().print(f"created key {key.id} for {name!r} with scopes {', '.join(key.scopes)}")
    console().print("the key (shown once; send it as 'Authorization: Bearer <key>'):")
    print(token)


@keys_commands.command("list")
def keys_list(db: DbOption = None, app_spec: AppOption = None, as_json: JsonOption = False) -> None:
    """List keys (never the keys themselves)."""
    with cli_errors(), open_app(db, app_spec) as app:
        found = app.admin.list_keys()
    if as_json:
        print_json(
            [
                {
                    "id": k.id,
                    "name": k.name,
                    "scopes": list(k.scopes),
                    "created_at": k.created_at,
                    "last_used_at": k.last_used_at,
                    "revoked_at": k.revoked_at,
                }
                for k in found
            ]
        )
        return
    table = Table("id", "name", "scopes", "created", "last used", "revoked")
    for k in found:
        table.add_row(
            k.id,
            k.name,
            ", ".join(k.scopes),
            _when(k.created_at),
            _when(k.last_used_at),
            _when(k.revoked_at),
        )
    console().print(table)


@keys_commands.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(metavar="ID", help="The key's id (see `keys list`).")],
    db: DbOption = None,
    app_spec: AppOption = None,
) -> None:
    """Revoke a key: every request with it gets 401 from now on."""
    with cli_errors(), open_app(db, app_spec) as app:
        if not app.admin.revoke_key(key_id):
            raise RunNotFound(f"no active key {key_id!r} (see `mainspring keys list`)")
    console().print(f"revoked key {key_id}")


@webhooks_commands.command("add")
def webhooks_add(
    url: Annotated[str, typer.Argument(help="Where to POST events (http:// or https://).")],
    event: Annotated[
        list[str] | None,
        typer.Option("--event", help=f"Repeatable: {', '.join(WEBHOOK_EVENTS)} (default: all)."),
    ] = None,
    secret: Annotated[
        str | None, typer.Option(help="The signing secret (default: a random one, printed).")
    ] = None,
    db: DbOption = None,
    app_spec: AppOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register an endpoint for run events (waiting, succeeded, failed, cancelled)."""
    with cli_errors():
        if secret is not None and len(secret) < 16:
            raise ConfigError("--secret must be at least 16 characters")
        with open_app(db, app_spec) as app:
            hook, key = app.admin.add_webhook(url, secret=secret, events=_split(event or []))
    if as_json:
        print_json({"id": hook.id, "url": hook.url, "events": list(hook.events), "secret": key})
        return
    console().print(f"added webhook {hook.id} → {url} ({', '.join(hook.events)})")
    console().print("signing secret (verify Mainspring-Signature with it):")
    print(key)


@webhooks_commands.command("list")
def webhooks_list(
    db: DbOption = None, app_spec: AppOption = None, as_json: JsonOption = False
) -> None:
    """List endpoints."""
    with cli_errors(), open_app(db, app_spec) as app:
        hooks = app.admin.list_webhooks()
    if as_json:
        print_json(
            [
                {"id": h.id, "url": h.url, "events": list(h.events), "created_at": h.created_at}
                for h in hooks
            ]
        )
        return
    table = Table("id", "url", "events", "created")
    for h in hooks:
        table.add_row(h.id, h.url, ", ".join(h.events), _when(h.created_at))
    console().print(table)


@webhooks_commands.command("remove")
def webhooks_remove(
    webhook_id: Annotated[str, typer.Argument(metavar="ID")],
    db: DbOption = None,
    app_spec: AppOption = None,
) -> None:
    """Stop delivering to an endpoint."""
    with cli_errors(), open_app(db, app_spec) as app:
        if not app.admin.remove_webhook(webhook_id):
            raise RunNotFound(f"no webhook {webhook_id!r} (see `mainspring webhooks list`)")
    console().print(f"removed webhook {webhook_id}")
