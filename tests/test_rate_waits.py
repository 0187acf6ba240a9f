"""A 429 or an overload is back-pressure, never a failure: the run waits (durably,
visibly) for as long as the provider asks, spends none of the model step's attempts,
and only ``Limits(max_rate_wait_s=...)`` bounds the wait, by pausing for a human."""

from __future__ import annotations

from typing import Any

import pytest
from _helpers import Crash, drain

import mainspring as ms
from mainspring.limits import Booking, Cost, RateLimit, RateLimits, StoreRateLimiter
from mainspring.models import ModelResponse, Usage, UserMessage
from mainspring.storage import Store
from mainspring.testing import FakeClock, ScriptedModel

NOW = 1_767_225_600.0
TWO_ATTEMPTS = ms.RetryPolicy(max_attempts=2, initial_s=0.001, max_s=0.001)
MODEL_STEP = "model:scripted:scripted"
USAGE = Usage(input_tokens=20, output_tokens=5)


def _finish() -> ModelResponse:
    return ModelResponse(
        tool_calls=ScriptedModel.call("finish", {"answer": "ok"}).tool_calls, usage=USAGE
    )


def _app(db_url: str, clock: FakeClock, *, limited: bool) -> ms.App:
    rate = [RateLimit(provider="scripted", model="scripted", rpm=6000, headroom=0.0)]
    return ms.App(
        db_url,
        clock=clock,
        poll_interval_s=0.01,
        inline_wait_s=0.0,  # every wait leaves the worker: the test drives the clock
        rate_limits=rate if limited else None,
    )


async def _sleep_through(app: ms.App, clock: FakeClock, run_id: str, step_s: float) -> int:
    """Drain, and while the run sleeps for rate, check it says so and move time on.
    Returns how many times it slept."""
    for sleeps in range(100):
        await drain(app)
        run = app.get_run(run_id)
        if run.status != "sleeping" or run.wait_reason != "rate_limit":
            return sleeps
        assert run.wake_at is not None and run.wake_at > clock.now()
        clock.advance(max(step_s, run.wake_at - clock.now()))
    raise AssertionError("the run never stopped sleeping")


@pytest.mark.parametrize("limited", [False, True], ids=["no-limiter", "limiter"])
async def test_a_429_storm_longer_than_every_retry_policy_only_waits(
    db_url: str, limited: bool
) -> None:
    clock = FakeClock(NOW)
    app = _app(db_url, clock, limited=limited)
    storm = [ms.RateLimited("429: slow down", retry_after=30) for _ in range(8)]
    model = ScriptedModel([*storm, _finish()])
    agent = app.agent("patient", model=model, instructions="x", model_retry=TWO_ATTEMPTS)
    try:
        handle = app.submit(agent, "t")
        sleeps = await _sleep_through(app, clock, handle.run_id, 30)
        assert sleeps == 8  # one durable wait per refusal, each as long as asked
        assert (await handle.result()).answer == "ok"
        steps = [s for s in app.observe.steps(handle.run_id) if s.name == MODEL_STEP]
        # Eight refusals, eight steps that each spent one attempt (the policy has two).
        assert [(s.status, s.attempt) for s in steps] == [("failed", 1)] * 8 + [("completed", 1)]
        assert clock.now() - NOW >= 8 * 30
    finally:
        app.close()


@pytest.mark.parametrize("limited", [False, True], ids=["no-limiter", "limiter"])
async def test_overloads_back_off_and_never_fail_the_run(db_url: str, limited: bool) -> None:
    clock = FakeClock(NOW)
    app = _app(db_url, clock, limited=limited)
    model = ScriptedModel([*[ms.Overloaded("529 overloaded") for _ in range(6)], _finish()])
    agent = app.agent("busy", model=model, instructions="x", model_retry=TWO_ATTEMPTS)
    try:
        handle = app.submit(agent, "t")
        assert await _sleep_through(app, clock, handle.run_id, 1) == 6
        assert (await handle.result()).answer == "ok"
        steps = [s for s in app.observe.steps(handle.run_id) if s.name == MODEL_STEP]
        assert [s.attempt for s in steps] == [1] * 7
        # No retry-after: a growing back-off (1 s doubling, jittered by a quarter).
        waits = [
            s for s in app.observe.steps(handle.run_id) if s.name == "rate:wait:scripted:scripted"
        ]
        assert len(waits) == 6
    finally:
        app.close()


async def test_max_rate_wait_pauses_for_a_human_who_can_stop_or_go_on(db_url: str) -> None:
    clock = FakeClock(NOW)
    app = _app(db_url, clock, limited=True)
    storm = [ms.RateLimited("429", retry_after=40) for _ in range(6)]
    model = ScriptedModel([*storm, _finish()])
    agent = app.agent(
        "bounded",
        model=model,
        instructions="x",
        limits=ms.Limits(max_rate_wait_s=100),
        model_retry=TWO_ATTEMPTS,
    )
    try:
        handle = app.submit(agent, "t")
        await _sleep_through(app, clock, handle.run_id, 40)
        run = app.get_run(handle.run_id)
        # Three 40 s waits would pass 100 s: the run asks instead of waiting on.
        assert (run.status, run.wait_reason) == ("waiting", "signal:budget:max_rate_wait_s")
        (request,) = app.requests(handle.run_id)
        assert request.preview["limit"] == "max_rate_wait_s"
        assert request.preview["refusals"] == 3
        app.answer(handle.run_id, request.id, decision="approve")
        await _sleep_through(app, clock, handle.run_id, 40)
        run = app.get_run(handle.run_id)
        assert (run.status, run.wait_reason) == ("waiting", "signal:budget:max_rate_wait_s")
        (request,) = app.requests(handle.run_id)
        app.answer(handle.run_id, request.id, decision="reject", reason="enough")
        await drain(app)
        result = await handle.result()
        assert result.status == "partial"
        assert "max_rate_wait_s reached" in (result.reason or "")
        assert "stopped by a human" in (result.reason or "")
    finally:
        app.close()


@pytest.mark.parametrize("limited", [False, True], ids=["no-limiter", "limiter"])
async def test_a_plain_workflow_calls_a_model_through_the_limiter_and_journal(
    db_url: str, limited: bool
) -> None:
    clock = FakeClock(NOW)
    app = _app(db_url, clock, limited=limited)
    model = ScriptedModel(
        [ms.RateLimited("429", retry_after=20), ModelResponse(text="summary", usage=USAGE)]
    )

    @app.workflow
    async def summarise(ctx: ms.RunContext, text: str) -> str:
        reply = await app.call_model(ctx, model, [UserMessage(content=text)])
        await ctx.sleep(100)  # leaves the worker: the resumed run replays the call
        return reply.text or ""

    try:
        handle = app.submit(summarise, "tides")
        assert await _sleep_through(app, clock, handle.run_id, 20) == 1  # the 429's wait
        run = app.get_run(handle.run_id)
        assert (run.status, run.wait_reason) == ("sleeping", "sleep")
        clock.advance(100)
        await drain(app)
        assert await handle.result() == "summary"
        assert len(model.requests) == 2  # the refused one and the answered one, no more
        names = [s.name for s in app.observe.steps(handle.run_id)]
        assert names.count(MODEL_STEP) == 2
        assert ("rate:scripted:scripted:default" in names) is limited
    finally:
        app.close()


async def test_a_slot_that_lapsed_is_waited_for_on_the_runs_clock(db_url: str) -> None:
    """A retried model step finds its slot gone and the next one a minute away: the
    run waits for it durably (the injected clock decides), not in an in-process
    sleep that an un-advanced FakeClock would never end."""
    clock = FakeClock(NOW)
    app = ms.App(
        db_url,
        clock=clock,
        poll_interval_s=0.01,
        inline_wait_s=0.0,
        rate_limits=[RateLimit(provider="scripted", model="scripted", rpm=1, headroom=0.0)],
    )
    first = ScriptedModel([ms.TransientError("HTTP 502"), _finish()])
    second = ScriptedModel([_finish()])
    a = app.agent("a", model=first, instructions="x", model_retry=TWO_ATTEMPTS)
    b = app.agent("b", model=second, instructions="x")
    try:
        ha = app.submit(a, "t")
        await drain(app)  # a: its one slot of this minute, then a 502: retry shortly
        hb = app.submit(b, "t")
        await drain(app)  # b: booked a minute later
        clock.advance(0.01)
        await drain(app)  # a's retry: its slot passed, the next free one is far
        run = app.get_run(ha.run_id)
        assert (run.status, run.wait_reason) == ("sleeping", "rate_limit")
        assert run.wake_at is not None and run.wake_at - clock.now() > 30
        for _ in range(10):
            clock.advance(60)
            await drain(app)
        assert (await ha.result()).answer == "ok"
        assert (await hb.result()).answer == "ok"
        # A lapsed slot is no refusal: nothing counts it as a 429.
        body = app.observe.metrics().render()[0].decode()
        limited = [
            line for line in body.splitlines() if line.startswith("mainspring_rate_limited_total{")
        ]
        # the agents' model is reported from the start, and stays at 0
        assert limited == [
            'mainspring_rate_limited_total{kind="model",model="scripted:scripted"} 0.0'
        ]
        assert "mainspring_store_rate_limited{" not in body
        assert sum(app.observe.trace(h.run_id).rate_limited for h in (ha, hb)) == 0
    finally:
        app.close()


class _DiesOnce(ScriptedModel):
    """Its first request kills the process (``Crash``), mid-request."""

    died = False

    async def request(self, *args: Any, **kwargs: Any) -> ModelResponse:
        if not self.died:
            self.died = True
            raise Crash
        return await super().request(*args, **kwargs)


async def test_a_probe_whose_worker_dies_is_released_when_its_run_is_taken_over(
    db_url: str,
) -> None:
    clock = FakeClock(NOW)
    app = ms.App(
        db_url,
        clock=clock,
        poll_interval_s=0.01,
        inline_wait_s=0.0,
        lease_s=5.0,
        rate_limits=RateLimits(period_s=60),  # nothing declared: a cold start
    )
    # Stand-ins for a provider: learned limits apply to them as to a remote model.
    dies = _DiesOnce([_finish()], remote=True)
    other = ScriptedModel([_finish()], remote=True)
    a = app.agent("a", model=dies, instructions="x")
    b = app.agent("b", model=other, instructions="x")
    try:
        ha = app.submit(a, "t")
        await drain(app)  # a holds the probe and dies mid-request
        hb = app.submit(b, "t")
        await drain(app)
        run = app.get_run(hb.run_id)
        assert (run.status, run.wait_reason) == ("sleeping", "rate_limit")  # behind it
        assert other.requests == []
        clock.advance(app.lease_s + 1)  # a's lease expires: another worker takes it over
        for _ in range(5):
            await drain(app)
            clock.advance(1)
        assert (await ha.result()).answer == "ok"
        assert (await hb.result()).answer == "ok"
        bookings = [s for s in app.observe.steps(ha.run_id) if s.name.startswith("rate:")]
        assert len(bookings) == 1  # the journaled probe, re-sent under its new owner
    finally:
        app.close()


class _Contended(RateLimits):
    """Limits whose limiter lets another run book right after the first limiter call
    made once ``contender`` is set: a worker elsewhere booking at the worst moment."""

    contender: str | None = None
    contended: Booking | None = None

    def limiter(
        self, store: Store, clock: ms.Clock, provider: str, model: str, account: str = "default"
    ) -> StoreRateLimiter:
        found = super().limiter(store, clock, provider, model, account)
        if not isinstance(found, _ContendedLimiter):
            found = _ContendedLimiter(found.rate, store, clock=clock, limits=self)
            self._limiters[(id(store), found.key)] = found
        return found


class _ContendedLimiter(StoreRateLimiter):
    def __init__(self, *args: Any, limits: _Contended, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits

    def _contend(self) -> None:
        if self.limits.contender is not None and self.limits.contended is None:
            other = Cost(input_tokens=10)
            self.limits.contended = StoreRateLimiter.acquire(self, other, run=self.limits.contender)

    def acquire(self, *args: Any, **kwargs: Any) -> Booking:
        booking = super().acquire(*args, **kwargs)
        self._contend()
        return booking

    def rebook(self, *args: Any, **kwargs: Any) -> Booking:
        booking = super().rebook(*args, **kwargs)
        self._contend()
        return booking

    def settle(self, *args: Any, **kwargs: Any) -> None:
        super().settle(*args, **kwargs)
        self._contend()


async def test_a_re_sent_probe_keeps_the_gate_when_another_run_books_at_once(
    db_url: str,
) -> None:
    """The worker that takes a dead probe's run over gives the probe back and books
    it anew; a run booking right after its first limiter call finds the gate held.
    (Refund and booking were two transactions: a run waiting behind the probe could
    take it in between, and the re-sent probe waited in turn, about one time in
    three in the test above.)"""
    clock = FakeClock(NOW)
    limits = _Contended(period_s=60)  # nothing declared: a cold start
    app = ms.App(
        db_url,
        clock=clock,
        poll_interval_s=0.01,
        inline_wait_s=0.0,
        lease_s=5.0,
        rate_limits=limits,
    )
    a = app.agent("a", model=_DiesOnce([_finish()], remote=True), instructions="x")

    @app.workflow
    async def idle(ctx: ms.RunContext) -> None:
        await ctx.sleep(3600)  # a live run (its bookings are not given back as ended)

    try:
        ha = app.submit(a, "t")
        await drain(app)  # a holds the probe and dies mid-request
        other = app.submit(idle)
        await drain(app)
        limits.contender = other.run_id
        clock.advance(app.lease_s + 1)  # a's lease expires: another worker takes it over
        await drain(app)
        assert limits.contended is not None and limits.contended.retry  # the gate was held
        assert app.get_run(ha.run_id).status == "succeeded"
        bookings = [s for s in app.observe.steps(ha.run_id) if s.name.startswith("rate:")]
        assert len(bookings) == 1  # the probe went at once, under its new owner
    finally:
        app.close()
