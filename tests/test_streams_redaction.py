"""Live token streams are redacted on the way in, by the App's redactor, as the journal
is: no secret reaches the stream table, an SSE client (a read key) or ``app.stream``,
not even one split across two batches; and what a reader assembles is exactly the
journaled (redacted) reply."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest
from _helpers import drain, uvicorn_serving
from test_streams import _sse

import mainspring as ms
from mainspring.models import ScriptedModel, UserMessage
from mainspring.observability import Redactor
from mainspring.testing import assert_invariants

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9P"
PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
# (what the model writes, a part of it that must never be seen)
SECRETS = [
    ("postgresql://app:UrlPw1234567@db.internal/x", "UrlPw1234567"),
    (JWT, "dozjgNryP4J3jVmNHl0w5N"),
    ("sk-proj-AbCdEfGhIjKlMnOpQrStUv12", "AbCdEfGhIjKlMnOpQrStUv12"),
    ("Authorization: Bearer abcdefgh12345678", "abcdefgh12345678"),
    ("db_password = hunter2hunter2", "hunter2hunter2"),
    (PEM, "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
]
WORDS = ["hello", "world", "\n", "tokens: 5", "max_tokens=100", "Bearer", '"x": 1', "  "]


def _pieces(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        j = i + rng.randint(1, rng.choice([3, 15, 80, 300]))
        out.append(text[i:j])
        i = j
    return out


def _check_live(redactor: Redactor, trials: int, seed: int) -> None:
    rng = random.Random(seed)
    parts = [s for s, _ in SECRETS] + WORDS + ['{"password": "my secret value"}', "x" * 30]
    for _ in range(trials):
        text = "".join(
            rng.choice(parts) + rng.choice([" ", "\n", "", ", "]) for _ in range(rng.randint(1, 12))
        )
        live = redactor.live()
        got = "".join(live.feed(p) for p in _pieces(text, rng)) + live.end()
        assert got == redactor.redact_text(text), f"pieces of {text!r}"


def test_a_live_redaction_joins_to_the_whole_text_redacted() -> None:
    """However the text is cut, what the pieces release is redact_text of the whole:
    a secret split across pieces is caught, and nothing else changes."""
    _check_live(Redactor(), trials=1500, seed=1)
    _check_live(Redactor(patterns=[r"(card )\d{4} \d{4}"]), trials=300, seed=2)


@pytest.mark.slow
def test_a_live_redaction_joins_to_the_whole_text_redacted_long() -> None:
    _check_live(Redactor(), trials=40_000, seed=3)
    _check_live(Redactor(patterns=[r"(card )\d{4} \d{4}"]), trials=5_000, seed=4)


def test_a_live_redaction_holds_back_only_what_a_secret_may_span() -> None:
    live = Redactor().live()
    assert live.feed("The quick brown fo") == "The quick brown "  # the last word waits
    assert live.feed("x jumps. Authorization: Bearer ") == "fox jumps. Authorization: "
    assert live.feed("abcdefgh1234") == ""  # a token is coming: wait for its end
    assert live.feed("5678 and on") == "Bearer [REDACTED] and "
    assert live.end() == "on"


async def test_secrets_split_across_batches_never_reach_the_stream(db_url: str) -> None:
    """The model writes secrets in pieces paced so that each spans several batches of
    the stream; none reaches the table, a read key's SSE or app.stream, and the text
    a reader assembles is the journaled reply, redacted the same way."""
    text = "Here: " + " and ".join(s for s, _ in SECRETS) + ". Done."

    async def pace(index: int, piece: str) -> None:
        await asyncio.sleep(0.03)  # a few pieces per batch of 80 ms

    app = ms.App(db_url, poll_interval_s=0.01)
    key = app.admin.create_key("ana", ["read"])[1]
    model = ScriptedModel(
        [
            ScriptedModel.call(
                "connect", {"dsn": SECRETS[0][0], "password": "Sesame1234"}, text=text
            )
        ],
        chunk_size=6,
        on_chunk=pace,
    )

    @app.workflow(name="leaky")
    async def leaky(ctx: ms.RunContext) -> str:
        reply = await app.call_model(ctx, model, [UserMessage(content="go")])
        return reply.text or ""

    try:
        run_id = app.submit(leaky).run_id
        await drain(app)
        rows = app.store.tokens_after(run_id, limit=10_000)
        assert len([r for r in rows if r.kind == "text"]) >= 6  # many batches
        stored = "".join(r.text for r in rows)
        with uvicorn_serving(app) as base:
            async with (
                httpx.AsyncClient(
                    base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30
                ) as client,
                client.stream("GET", f"/runs/{run_id}/events") as response,
            ):
                sse = json.dumps([e async for e in _sse(response)])
        events = [e async for e in app.stream(run_id, poll_s=0.01)]
        streamed = "".join(e.text + e.arguments for e in events)
        for sink, seen in {"table": stored, "SSE": sse, "app.stream": streamed}.items():
            leaked = [part for _, part in SECRETS if part in seen] + (
                ["Sesame1234"] if "Sesame1234" in seen else []
            )
            assert leaked == [], f"{sink} shows {leaked}"
            assert "[REDACTED]" in seen
        [step] = [s for s in app.observe.steps(run_id) if s.role == "model"]
        reply = json.loads(step.output or "{}")
        assert "".join(e.text for e in events) == reply["text"]
        args = "".join(e.arguments for e in events if e.kind == "tool_call")
        assert args == reply["tool_calls"][0]["arguments"]
        assert json.loads(args)["password"] == "[REDACTED]"
        assert_invariants(app.store, run_ids=[run_id])
    finally:
        app.close()
