"""Rate limits are on by default: an App that says nothing about them learns every remote
model's limits from the provider's headers and paces its calls to them; ``False`` turns
them off; scripted models book nothing; runs journaled before the default replay as they
were written."""

from __future__ import annotations

from pathlib import Path

from _helpers import drain

import mainspring as ms
from mainspring.limits import RateLimits
from mainspring.models import OpenAIModel
from mainspring.testing import FakeClock, FakeOpenAIServer, ScriptedModel

NOW = 1_767_225_600.0


def test_an_app_learns_rate_limits_unless_told_not_to(tmp_path: Path) -> None:
    default = ms.App(f"sqlite:///{tmp_path / 'a.db'}")
    assert isinstance(default.rate_limits, RateLimits)
    assert default.rate_limits.declared == {}  # nothing declared: learned from headers
    for off in (False, None):
        assert ms.App(f"sqlite:///{tmp_path / 'b.db'}", rate_limits=off).rate_limits is None


async def test_a_scripted_model_books_no_slot_by_default(tmp_path: Path) -> None:
    """A local model has no provider whose limits could be learned: its journal is what it
    was before the default (no ``rate`` rows, no probe holding other runs back)."""
    app = ms.App(f"sqlite:///{tmp_path / 'app.db'}")
    model = ScriptedModel([ScriptedModel.call("finish", {"answer": "ok"})])
    agent = app.agent("s", model=model, instructions="x")
    try:
        handle = app.submit(agent, "t")
        await drain(app)
        assert (await handle.result()).answer == "ok"
        assert [s.role for s in app.observe.steps(handle.run_id)] == ["model"]
    finally:
        app.close()


async def test_the_default_app_paces_a_provider_that_only_announces_its_limits(
    db_url: str,
) -> None:
    """Six runs at once against a provider that allows 3 requests a minute and says so only
    in its headers: the default App sends one probe, learns the limit, and the rest wait for
    their slots (durably, on the runs' clock): no 429, every run done."""
    clock = FakeClock(NOW)
    with FakeOpenAIServer(rpm=3, tpm=1_000_000, period_s=60, clock=clock.now) as server:
        server.script([server.tool_call("finish", {"answer": "ok"})] * 6)
        model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="sk-test")
        # On PostgreSQL too: a test's FakeClock books the slots (as it holds the leases),
        # not the database's own clock, or the runs would sleep by the wrong calendar.
        app = ms.App(db_url, clock=clock, inline_wait_s=0.0)
        try:
            agent = app.agent("a", model=model, instructions="x")
            ids = [app.submit(agent, f"q{i}").run_id for i in range(6)]
            for _ in range(30):
                await drain(app)
                if all(app.get_run(r).status == "succeeded" for r in ids):
                    break
                clock.advance(20)
            else:
                raise AssertionError([app.get_run(r).status for r in ids])
            assert len(server.requests) == 6
            assert server.too_many_requests == 0
            slept = [r for r in ids if any(s.role == "rate" for s in app.observe.steps(r))]
            assert len(slept) == 6  # every call booked its slot
        finally:
            app.close()
            await model.aclose()


async def test_a_run_journaled_without_a_limiter_replays_under_the_default(
    tmp_path: Path,
) -> None:
    """A deploy that brings the default: a run whose first turns were journaled by code with
    no limiter (no ``rate`` row before its model calls) is replayed by the new code without
    a NondeterminismError; its calls after the replay book slots as usual."""
    db = f"sqlite:///{tmp_path / 'app.db'}"
    with FakeOpenAIServer(api_key="sk-test") as server:
        server.script(
            [
                server.rate_limited(0.01),  # the old code waits it out (a rate:wait row)
                server.tool_call("refund", {"cents": 500}),
                server.tool_call("finish", {"answer": "refunded"}),
            ]
        )
        model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="sk-test")
        refunds: list[int] = []

        def build(**options: object) -> tuple[ms.App, ms.Agent]:
            app = ms.App(db, inline_wait_s=0.0, **options)  # type: ignore[arg-type]

            @app.tool(effect="irreversible")
            def refund(cents: int) -> str:
                refunds.append(cents)
                return "done"

            return app, app.agent("r", model=model, instructions="x", tools=[refund])

        old, agent = build(rate_limits=False)  # the code before the default
        handle = old.submit(agent, "refund the order")
        await drain(old)  # one turn, then it waits for a person to approve the refund
        assert old.get_run(handle.run_id).status == "waiting"
        [request] = old.requests(handle.run_id)
        old.answer(handle.run_id, request.id, decision="approve")
        old.close()

        new, agent = build()  # the default: rate limits learned from headers
        try:
            await drain(new, sticky=False)  # a fresh worker: it replays the first turn
            run = new.get_run(handle.run_id)
            assert run.status == "succeeded", run.error
            assert refunds == [500] and len(server.requests) == 3
            roles = [
                s.role
                for s in new.observe.steps(handle.run_id)
                if s.role in ("model", "rate", "wait")
            ]
            # The old turn as it was (refused, waited, sent), then a booked call.
            assert roles == ["model", "wait", "model", "rate", "model"], roles
        finally:
            new.close()
            await model.aclose()
