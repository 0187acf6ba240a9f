"""Secrets put into a run every way a caller can (its input, a step's result, a
signal, a reviewer's edited arguments, a failing step's message, a cancel reason, a
model's streamed reply and tool call) appear in no sink: not in any byte of the SQLite
file (journal, run rows, signals, outbox, live token streams), the API (run, list,
steps, SSE with its tokens and tool_call_delta events), the dashboard's HTML, the
webhook bodies, the trace, or the CLI's output. The exceptions are documented in docs/security.md:
idempotency keys and step names are identifiers and stored as given."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.models import ScriptedModel, UserMessage
from mainspring.server import create_app

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9P"
SECRETS = {
    "url password": ("postgresql://app:UrlPw1234567@db.internal/x", "UrlPw1234567"),
    "jwt": (JWT, "dozjgNryP4J3jVmNHl0w5N"),
    "openai": ("sk-proj-AbCdEfGhIjKlMnOpQrStUv12", "AbCdEfGhIjKlMnOpQrStUv12"),
    "basic": ("Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA"),
    "pem": (
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----",
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
    ),
}
NAMED = ("db_password", "HiddenByName98765")  # a secret only its key's name gives away


def _leaks(text: str) -> list[str]:
    found = [name for name, (_, part) in SECRETS.items() if part in text]
    return found + (["named"] if NAMED[1] in text else [])


def test_no_secret_reaches_any_sink(tmp_path: Path) -> None:
    db = tmp_path / "sinks.db"
    app = ms.App(f"sqlite:///{db}", poll_interval_s=0.01, inline_wait_s=0.0)
    every = " ".join(text for text, _ in SECRETS.values())

    async def pace(index: int, piece: str) -> None:
        await asyncio.sleep(0.01)  # secrets span several batches of the live stream

    model = ScriptedModel(
        [
            ScriptedModel.call(
                "connect", {"dsn": every, NAMED[0]: NAMED[1]}, text=f"answering with {every}"
            )
        ],
        chunk_size=7,
        on_chunk=pace,
    )

    @app.workflow
    async def leaky(ctx: ms.RunContext, task: str, creds: dict[str, str]) -> str:
        await app.call_model(ctx, model, [UserMessage(content="go")])  # streamed live
        fetched = await ctx.step(lambda: f"fetched with {every}", name="fetch")
        note = await ctx.wait_for("go")
        decision = await ctx.approval("use", preview={"creds": creds})
        return f"{fetched} {note} {decision.arguments}"

    @app.workflow
    async def failing(ctx: ms.RunContext) -> None:
        def boom() -> None:
            raise RuntimeError(f"cannot connect with {every}")

        await ctx.step(boom, name="boom", retry=ms.RetryPolicy.never())

    @app.workflow
    async def idle(ctx: ms.RunContext) -> None:
        await ctx.wait_for("never")

    now = app.clock.now()
    _, admin = app.store.create_api_key("ops", ["admin"], now)
    app.store.add_webhook("http://127.0.0.1:9/hook", now)
    run = app.submit(leaky, f"migrate {every}", {NAMED[0]: NAMED[1], "note": every}).run_id
    failed = app.submit(failing).run_id
    cancelled = app.submit(idle).run_id
    app.cancel(cancelled, f"leaked {every}")
    drain = lambda: asyncio.run(app.worker().run(until_idle=True))  # noqa: E731
    drain()
    app.signal(run, "go", {"note": every, NAMED[0]: NAMED[1]})
    drain()
    app.answer(run, "approval:use", decision="edit", arguments={"dsn": every, NAMED[0]: NAMED[1]})
    drain()
    assert app.get_run(run).status == "succeeded"
    assert app.get_run(failed).status == "failed"

    sinks: dict[str, str] = {}
    with sqlite3.connect(db) as conn:  # every table, every column
        sinks["sqlite file"] = "\n".join(conn.iterdump())
    headers = {"Authorization": f"Bearer {admin}"}
    with TestClient(create_app(app, webhooks=False)) as client:
        for rid in (run, failed, cancelled):
            sinks[f"GET /runs/{rid}"] = client.get(f"/runs/{rid}", headers=headers).text
            sinks[f"steps {rid}"] = client.get(f"/runs/{rid}/steps", headers=headers).text
            with client.stream("GET", f"/runs/{rid}/events", headers=headers) as events:
                sinks[f"SSE {rid}"] = "".join(events.iter_text())
        sinks["GET /runs"] = client.get("/runs", headers=headers).text
        _login(client, admin)
        for rid in (run, failed, cancelled):
            sinks[f"dashboard {rid}"] = client.get(f"/ui/runs/{rid}").text
        sinks["dashboard list"] = client.get("/ui/").text
    deliveries = app.store.claim_deliveries(app.clock.now() + 1)
    assert {d.event for d in deliveries} >= {"run.succeeded", "run.failed", "run.cancelled"}
    sinks["webhook bodies"] = "\n".join(d.body().decode() for d in deliveries)
    for rid in (run, failed, cancelled):
        sinks[f"trace {rid}"] = json.dumps(_plain(app.observe.trace(rid)), default=str)
        for args in (["show", rid, "--json"], ["show", rid, "-v"], ["trace", rid]):
            out = CliRunner().invoke(cli, [*args, "--db", f"sqlite:///{db}"])
            assert out.exit_code == 0, out.output
            sinks[" ".join(args[:1] + args[2:]) + f" {rid}"] = out.output
    app.close()

    leaks = {sink: _leaks(text) for sink, text in sinks.items() if _leaks(text)}
    assert leaks == {}
    # Not vacuous: the redacted values are there, marked, the live streams' among them.
    assert "[REDACTED]" in sinks["sqlite file"] and "[REDACTED]" in sinks["webhook bodies"]
    assert sinks["sqlite file"].count('INSERT INTO "ms_stream_chunks"') > 5
    assert "event: tool_call_delta" in sinks[f"SSE {run}"]


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _login(client: TestClient, key: str) -> None:
    """Log in to the dashboard as a browser would (same origin): the session cookie."""
    r = client.post(
        "/ui/login",
        content=f"key={key}",
        headers={
            "Origin": "http://testserver",
            "Content-Type": "application/x-www-form-urlencoded",
        },
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    assert client.cookies.get("mainspring_key", "").startswith("mss_")
