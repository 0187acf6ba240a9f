"""A token limit learned from the provider's headers that is smaller than the default
output reservation (4,096 tokens) caps the reservation; it does not fail the run."""

from __future__ import annotations

import json

import pytest

import mainspring as ms
from mainspring.limits import RateLimit
from mainspring.models import OpenAIModel, Usage, UserMessage
from mainspring.testing import FakeOpenAIServer

MODEL = "gpt-4.1-mini"


async def test_a_learned_limit_below_the_default_reservation_caps_it(db_url: str) -> None:
    # The account allows 2,000 tokens a minute: less than the 4,096 reserved for the
    # output of a request that sets no max_tokens. Nothing is declared: the limiter
    # learns the limit from the first reply's headers.
    with FakeOpenAIServer(tpm=2000, rpm=100, period_s=60) as server:
        usage = Usage(input_tokens=50, output_tokens=10)
        server.script([server.text(f"r{i}", usage=usage) for i in range(2)])
        model = OpenAIModel(MODEL, base_url=server.base_url, api_key="sk-test")
        app = ms.App(db_url, rate_limits=[RateLimit(provider="openai", model=MODEL)])

        @app.workflow
        async def twice(ctx: ms.RunContext) -> list[str]:
            out = []
            for _ in range(2):  # the second call books against the learned limit
                reply = await app.call_model(ctx, model, [UserMessage(content="hi")])
                out.append(reply.text or "")
            return out

        try:
            assert await app.run(twice) == ["r0", "r1"]
            (run,) = app.list_runs()
            bookings = [s for s in app.observe.steps(run.id) if s.name.startswith("rate:")]
            second = json.loads(bookings[1].output or "{}")
            # The output reserved fits the learned 2,000 (less the 2 % headroom).
            assert 0 < second["estimate"]["output_tokens"] < 2000
            assert second["charges"]["tpm"] <= 1960
            assert app.rate_limits is not None
            limiter = app.rate_limits.limiter(app.store, app.clock, "openai", MODEL)
            # A max_tokens the caller set is reserved whole: too big is still an error.
            with pytest.raises(ms.ConfigError, match="can never fit the TPM limit"):
                limiter.reserve(prompt_tokens=10, max_tokens=4096)
            # And a booking capped once stays capped when it is booked again (late).
            capped = limiter.reserve(prompt_tokens=10)
            again = limiter.rebook(capped)
            assert again.estimate.output_tokens == capped.estimate.output_tokens < 2000
        finally:
            await model.aclose()
            app.close()
