"""The shared rate limiter: GCRA booking, settlement, header tightening, oversize
rejection and ordering (pure, and through each store), configuration, and the agent
loop sleeping durably until its booked slot."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from pathlib import Path

import pytest
from _helpers import drain

import mainspring as ms
from mainspring.limits import (
    Booking,
    Cost,
    RateLimit,
    RateLimits,
    StoreRateLimiter,
    load_rate_limits,
)
from mainspring.limits._rate import BucketState, book, charges_of, quantile, settle, tighten
from mainspring.limits._shared import observed_limits, observed_resets
from mainspring.limits._table import RateTable
from mainspring.models import ModelResponse, Usage
from mainspring.storage import open_store
from mainspring.testing import FakeClock, ScriptedModel

NOW = 1_767_225_600.0


def _rate(**kw: float) -> RateLimit:
    return RateLimit(provider="openai", model="m", headroom=0.0, **kw)  # type: ignore[arg-type]


class _Slack:
    """How far a time read off a PostgreSQL limiter may be off the fake clock's: that
    limiter books on the database's clock, which runs in real time while the test's
    clock stands still, so its answers drift by the real time the test has taken so
    far (more on a loaded machine). SQLite books on the fake clock: no drift at all."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, base: float = 0.1) -> float:
        return base + time.monotonic() - self.start


def _tokens(n: float, requests: float = 1) -> dict[str, float]:
    return {"rpm": requests, "tpm": n, "itpm": n, "otpm": 0.0}


# -- the algorithm --------------------------------------------------------------------


def test_bookings_start_at_the_earliest_time_that_fits() -> None:
    rate, state = _rate(tpm=6000), BucketState()
    # A full bucket lets 6000 tokens go at once; then 100 tokens a second.
    starts = [book(state, rate, _tokens(2000), NOW) - NOW for _ in range(5)]  # type: ignore[arg-type]
    assert starts == [0, 0, 0, 20, 40]


def test_every_dimension_must_fit() -> None:
    rate, state = _rate(rpm=2, tpm=60_000), BucketState()
    starts = [book(state, rate, _tokens(10), NOW) - NOW for _ in range(4)]  # type: ignore[arg-type]
    assert starts == [0, 0, 30, 60]  # requests bind, tokens do not


def test_burst_and_headroom_shrink_the_bucket() -> None:
    rate = RateLimit(provider="openai", model="m", tpm=6000, burst=0.5, headroom=0.5)
    state = BucketState()
    # 3000 effective tokens per minute (50 a second), 1500 of them at once.
    starts = [book(state, rate, _tokens(1500), NOW) - NOW for _ in range(3)]  # type: ignore[arg-type]
    assert starts == [0, 30, 60]


def test_settlement_refunds_and_charges_the_difference() -> None:
    rate, state = _rate(tpm=6000), BucketState()
    for _ in range(3):
        book(state, rate, _tokens(2000), NOW)  # type: ignore[arg-type]
    settle(state, rate, {"tpm": -1000}, NOW, 1)  # the first used 1000, not 2000
    assert book(state, rate, _tokens(1000), NOW) == NOW  # type: ignore[arg-type]
    settle(state, rate, {"tpm": 3000}, NOW)  # an output far above its reservation
    assert book(state, rate, _tokens(1000), NOW) - NOW == pytest.approx(40)  # type: ignore[arg-type]


def test_headers_only_ever_tighten() -> None:
    rate, state = _rate(tpm=6000), BucketState()
    book(state, rate, _tokens(3000), NOW)  # type: ignore[arg-type]
    before = dict(state.tat)
    tighten(state, rate, learned={}, remaining={"tpm": 5000}, retry_after=None, now=NOW)
    assert state.tat == before  # the provider has not seen our booking yet: keep it
    tighten(state, rate, learned={}, remaining={"tpm": 1000}, retry_after=None, now=NOW)
    assert state.tat["tpm"] == pytest.approx(NOW + 50)  # 5000 used: 50 s of refill
    # 2000 of them were not booked here: another client of the account uses them, so
    # this limiter paces at 4000 a minute and leaves a third of the bucket to it.
    assert state.outside["tpm"] == pytest.approx(2000)
    assert book(state, rate, _tokens(1000), NOW) - NOW == pytest.approx(25)  # type: ignore[arg-type]
    assert book(state, rate, _tokens(1000), NOW) - NOW == pytest.approx(40)  # type: ignore[arg-type]
    state = BucketState()
    tighten(state, rate, learned={}, remaining={}, retry_after=30, now=NOW)
    assert book(state, rate, _tokens(1), NOW) - NOW == pytest.approx(30)  # type: ignore[arg-type]
    tighten(state, rate, learned={}, remaining={}, retry_after=5, now=NOW)
    assert state.blocked_until == NOW + 30  # a shorter retry-after does not loosen


def test_a_learned_limit_below_the_declared_one_wins() -> None:
    rate, state = _rate(tpm=6000), BucketState()
    tighten(state, rate, learned={"tpm": 3000}, remaining={}, retry_after=None, now=NOW)
    with pytest.raises(ms.ConfigError, match="TPM limit"):
        book(state, rate, _tokens(4000), NOW)  # type: ignore[arg-type]


def test_a_request_that_can_never_fit_fails_at_once() -> None:
    rate, state = _rate(tpm=6000, itpm=4000), BucketState()
    with pytest.raises(ms.ConfigError) as err:
        book(state, rate, _tokens(5000), NOW)  # type: ignore[arg-type]
    assert "5000 input tokens can never fit the ITPM limit of 'openai:m:default'" in str(err.value)
    assert state.tat["tpm"] == 0  # nothing was booked


def test_bookings_are_served_in_order_and_a_huge_one_starves_nobody() -> None:
    rate, state = _rate(tpm=6000), BucketState()
    small = [book(state, rate, _tokens(1000), NOW) for _ in range(3)]  # type: ignore[arg-type]
    huge = book(state, rate, _tokens(6000), NOW)  # type: ignore[arg-type]
    after = [book(state, rate, _tokens(1000), NOW) for _ in range(3)]  # type: ignore[arg-type]
    starts = [*small, huge, *after]
    assert starts == sorted(starts)  # first booked, first served
    assert huge - NOW == pytest.approx(30)  # the huge one waits for room, not forever
    assert after[0] - huge == pytest.approx(10)  # and the rest queue right behind it


def test_anthropic_cache_reads_do_not_count_toward_input_limits() -> None:
    cost = Cost(input_tokens=1000, cached_tokens=800, output_tokens=50)
    assert charges_of(cost, "anthropic") == {"rpm": 1, "tpm": 250, "itpm": 200, "otpm": 50}
    assert charges_of(cost, "openai") == {"rpm": 1, "tpm": 1050, "itpm": 1000, "otpm": 50}


def test_quantile_and_header_parsing() -> None:
    assert quantile(list(range(1, 11)), 0.9) == 9
    assert quantile([], 0.9) == 0
    limits, remaining = observed_limits(
        {
            "x-ratelimit-limit-tokens": "30000",
            "x-ratelimit-remaining-tokens": "29000",
            "x-ratelimit-limit-requests": "500",
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-output-tokens-remaining": "7000",
            "x-ratelimit-remaining-requests": "lots",
        }
    )
    assert limits == {"tpm": 30000, "rpm": 500, "itpm": 40000}
    assert remaining == {"tpm": 29000, "otpm": 7000}


def test_bad_limits_are_named() -> None:
    with pytest.raises(ms.ConfigError, match="tpm must be a positive number, got -5"):
        RateLimit(provider="openai", model="m", tpm=-5)
    with pytest.raises(ms.ConfigError, match=r"burst must be in \(0, 1\]"):
        RateLimit(provider="openai", model="m", burst=2)
    with pytest.raises(ms.ConfigError, match="two rate limits for 'openai:m:default'"):
        RateLimits(
            [RateLimit(provider="openai", model="m"), RateLimit(provider="openai", model="m")]
        )


# -- configuration files ----------------------------------------------------------------


def test_limits_load_from_toml_and_json(tmp_path: Path) -> None:
    toml = tmp_path / "limits.toml"
    toml.write_text(
        '[[rate_limit]]\nprovider = "openai"\nmodel = "gpt-4.1-mini"\nrpm = 500\ntpm = 200000\n'
        '\n[[rate_limit]]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-5"\n'
        'itpm = 30000\notpm = 8000\naccount = "team-a"\n'
    )
    limits = load_rate_limits(toml)
    assert [r.key for r in limits] == [
        "openai:gpt-4.1-mini:default",
        "anthropic:claude-sonnet-4-5:team-a",
    ]
    assert (limits[0].tpm, limits[1].otpm) == (200000, 8000)
    js = tmp_path / "limits.json"
    js.write_text('{"rate_limit": [{"provider": "openai", "model": "x", "rpm": 3}]}')
    assert load_rate_limits(js)[0].rpm == 3


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('[[rate_limit]]\nprovider = "openai"\nmodel = "m"\ntpms = 5\n', r"entry 1: unknown.*tpms"),
        ('[[rate_limit]]\nprovider = "openai"\nmodel = "m"\ntpm = "lots"\n', "tpm must be"),
        ('[[rate_limit]]\nprovider = "openai"\n', r"entry 1: missing field\(s\) \['model'\]"),
        ("[[rate_limit]\n", "is not valid TOML"),
        ("[limits]\nx = 1\n", "expected only a list named 'rate_limit'"),
    ],
)
def test_bad_config_files_say_what_is_wrong(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "limits.toml"
    path.write_text(text)
    with pytest.raises(ms.ConfigError, match=error):
        load_rate_limits(path)


def test_a_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ms.ConfigError, match="cannot read it"):
        ms.App(f"sqlite:///{tmp_path / 'x.db'}", rate_limits=tmp_path / "nope.toml")


# -- through the store ----------------------------------------------------------------


def test_the_store_books_like_the_algorithm(db_url: str) -> None:
    store = open_store(db_url)
    try:
        table = RateTable(store)
        rate = _rate(rpm=2, tpm=6000)
        state = BucketState()
        for n in (2000, 2000, 2000, 500, 1):
            expected = book(state, rate, _tokens(n), NOW)  # type: ignore[arg-type]
            assert table.book(rate, _tokens(n), NOW)[0] == pytest.approx(expected)  # type: ignore[arg-type]
        table.settle(
            rate,
            delta={"tpm": -1500},
            learned={"tpm": 5000},
            remaining={"tpm": 100},
            retry_after=7,
            input_ratio=1.25,
            output_tokens=42,
            now=NOW,
        )
        state.learned["tpm"] = 5000
        settle(state, rate, {"tpm": -1500}, NOW)
        tighten(state, rate, learned={"tpm": 5000}, remaining={"tpm": 100}, retry_after=7, now=NOW)
        stored = table.state(rate.key)
        assert stored.tat == pytest.approx(state.tat)
        assert stored.blocked_until == pytest.approx(NOW + 7)
        assert stored.learned["tpm"] == 5000
        assert table.snapshot(rate.key) == (1.25, [42])
        with pytest.raises(ms.ConfigError, match="can never fit the TPM limit"):
            table.book(rate, _tokens(5500), NOW)  # type: ignore[arg-type]
    finally:
        store.close()


def test_concurrent_bookings_never_share_a_slot(db_url: str) -> None:
    store = open_store(db_url)
    try:
        limiter = StoreRateLimiter(_rate(rpm=60), store, clock=FakeClock(NOW))
        table = limiter.table
        table.book(limiter.rate, {"rpm": 60}, NOW if store.dialect == "sqlite" else None)
        starts: list[float] = []

        def worker() -> None:
            for _ in range(5):
                starts.append(limiter.acquire(Cost(input_tokens=1)).start)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        starts.sort()
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        assert len(starts) == 20
        assert min(gaps) == pytest.approx(1.0, abs=0.05)  # one request a second, no two alike
    finally:
        store.close()


def test_the_limiter_learns_limits_and_output_sizes(db_url: str) -> None:
    store = open_store(db_url)
    try:
        clock = FakeClock(NOW)
        limits = RateLimits(period_s=60, headroom=0.0)
        limiter = limits.limiter(store, clock, "openai", "m")
        first = limiter.reserve(prompt_tokens=100, max_tokens=500)
        # No data yet: the prompt at twice the tokenizer's count, the output at max_tokens.
        assert first.estimate == Cost(input_tokens=200, output_tokens=500)
        assert first.waited_s == 0  # nothing known yet
        headers = {"x-ratelimit-limit-tokens": "1200", "x-ratelimit-remaining-tokens": "1100"}
        limiter.settle(first, Cost(input_tokens=130, output_tokens=20), headers)
        for n in (10, 20, 30, 40):
            limiter.settle(first, Cost(input_tokens=130, output_tokens=n), {})
        estimate = limiter.estimate(prompt_tokens=100, max_tokens=500)
        assert estimate.output_tokens == 40  # p90 of five observations
        assert estimate.input_tokens == 130  # the prompt as the provider counts it
        assert limiter.table.limits(limiter.rate)["tpm"] == 1200  # learned at first contact
        with pytest.raises(ms.ConfigError, match="can never fit the TPM limit"):
            limiter.reserve(prompt_tokens=2000)
    finally:
        store.close()


# -- the agent loop -----------------------------------------------------------------------


async def test_an_agent_sleeps_durably_until_its_slot(db_url: str) -> None:
    clock = FakeClock(NOW)
    app = ms.App(
        db_url,
        clock=clock,
        poll_interval_s=0.01,
        inline_wait_s=0.0,
        rate_limits=[RateLimit(provider="scripted", model="scripted", rpm=1, headroom=0.0)],
    )
    done = ScriptedModel.call("finish", {"answer": "ok"})
    usage = Usage(input_tokens=50, output_tokens=5)
    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=ScriptedModel.call("update_state", {"note": "a"}).tool_calls, usage=usage
            ),
            ModelResponse(tool_calls=done.tool_calls, usage=usage),
        ]
    )
    agent = app.agent("limited", model=model, instructions="x")
    try:
        handle = app.submit(agent, "task")
        await drain(app)
        assert len(model.requests) == 1  # the second call waits for the next minute
        run = app.get_run(handle.run_id)
        assert (run.status, run.wait_reason) == ("sleeping", "rate_limit")
        assert run.wake_at == pytest.approx(NOW + 60)
        clock.advance(59)
        await drain(app)
        assert len(model.requests) == 1
        clock.advance(1)
        await drain(app)
        assert (await handle.result()).answer == "ok"
        names = [s.name for s in app.observe.steps(handle.run_id)]
        assert names.count("rate:scripted:scripted:default") == 2
        # Waking up replayed the first booking from the journal: two calls, two bookings.
        with app.store._read() as cur:
            cur.execute("SELECT bookings FROM ms_rate_limits")
            assert cur.fetchone()[0] == 2
    finally:
        app.close()


async def test_a_run_is_back_shortly_before_its_slot_and_sends_on_time(db_url: str) -> None:
    """A long rate-limit wait leaves the worker only until half the inline wait
    before the slot: the run is claimed and replayed meanwhile, sleeps the rest in
    process, and sends at its slot, neither before nor booked anew after it."""
    slack = _Slack()
    clock = FakeClock(NOW)
    app = ms.App(
        db_url,
        clock=clock,
        poll_interval_s=0.01,
        inline_wait_s=0.4,
        rate_limits=[RateLimit(provider="scripted", model="scripted", rpm=1, headroom=0.0)],
    )
    usage = Usage(input_tokens=50, output_tokens=5)
    note = ScriptedModel.call("update_state", {"note": "a"}).tool_calls
    done = ScriptedModel.call("finish", {"answer": "ok"}).tool_calls
    model = ScriptedModel(
        [ModelResponse(tool_calls=note, usage=usage), ModelResponse(tool_calls=done, usage=usage)]
    )
    agent = app.agent("limited", model=model, instructions="x")
    try:
        handle = app.submit(agent, "task")
        await drain(app)
        run = app.get_run(handle.run_id)
        assert (run.status, run.wait_reason) == ("sleeping", "rate_limit")
        assert run.wake_at == pytest.approx(NOW + 60 - 0.2, abs=slack(0.05))
        clock.advance(59.8)
        worker = asyncio.create_task(drain(app))
        for _ in range(1000):  # replayed, now sleeping the last 0.2 s in process
            if clock.sleepers or worker.done():
                break
            await asyncio.sleep(0.01)
        assert clock.sleepers == 1
        assert len(model.requests) == 1
        clock.advance(0.2)
        await worker
        assert (await handle.result()).answer == "ok"
        with app.store._read() as cur:  # on time: not booked anew
            cur.execute("SELECT bookings FROM ms_rate_limits")
            assert cur.fetchone()[0] == 2
    finally:
        app.close()


async def test_an_oversized_request_fails_the_run_with_a_clear_error(db_url: str) -> None:
    app = ms.App(
        db_url,
        poll_interval_s=0.01,
        rate_limits=[RateLimit(provider="scripted", model="scripted", tpm=100)],
    )
    model = ScriptedModel(["never sent"])
    agent = app.agent("big", model=model, instructions="x " * 400)
    try:
        with pytest.raises(ms.RunFailed) as err:
            await app.run(agent, "task")
        assert "can never fit the TPM limit of 'scripted:scripted:default'" in str(err.value.error)
        assert model.requests == []
    finally:
        app.close()


def test_booking_round_trips_through_the_journal() -> None:
    from mainspring._serde import decode, dumps

    booking = Booking(key="k", start=1.0, waited_s=0.5, wake_at=2.0, charges={"tpm": 3.0})
    assert decode(dumps(booking), Booking, what="booking") == booking


def test_refunds_never_give_back_capacity_that_lapsed() -> None:
    """Against the chain recomputed from scratch without the refunded units: random
    bookings and refunds never leave the TAT below it (a booking sleeps until its
    start, so the ones after a refund can only close up that far)."""
    import random

    rate = _rate(tpm=6000)
    interval = 60 / 6000

    def chain(live: dict[int, tuple[float, float]]) -> float:
        tat = 0.0
        for seq in sorted(live):
            start, units = live[seq]
            tat = max(tat, start) + units * interval
        return tat

    for trial in range(200):
        rng = random.Random(trial)
        state, live, now = BucketState(), {}, NOW
        for _ in range(60):
            now += rng.choice([0.0, 0.0, 0.5, 2.0, 10.0])
            if live and rng.random() < 0.4:
                seq = rng.choice(list(live))
                start, units = live[seq]
                back = rng.choice([units, units / 2])
                settle(state, rate, {"tpm": -back}, now, seq)
                live[seq] = (start, units - back)
            else:
                units = rng.choice([500, 1000, 2000, 3000])
                start = book(state, rate, {"tpm": units}, now)  # type: ignore[arg-type]
                live[state.seq] = (start, units)
            assert max(state.tat["tpm"], now) >= max(chain(live), now) - 1e-6, trial


def _chain(live: dict[int, tuple[float, float]], interval: float) -> float:
    tat = 0.0
    for seq in sorted(live):
        start, units = live[seq]
        tat = max(tat, start) + units * interval
    return tat


def test_refunds_of_the_oldest_of_many_bookings_are_not_clipped() -> None:
    """Thirty runs booked at once (more than the barriers once kept): each refund,
    oldest first as replies come back, frees exactly what the chain without it frees.
    Merging the oldest barriers clipped these refunds (10 % of the refill lost in
    bench/rate_limit.py with twenty runs)."""
    rate = _rate(tpm=600_000)
    interval = 60 / 600_000
    state, live = BucketState(), {}
    for _ in range(30):  # all start at once: each is a barrier just below the TAT
        start = book(state, rate, {"tpm": 3000.0}, NOW)  # type: ignore[arg-type]
        live[state.seq] = (start, 3000.0)
    now = NOW + 0.001
    for seq in range(1, 21):
        settle(state, rate, {"tpm": -1500.0}, now, seq)
        live[seq] = (live[seq][0], 1500.0)
        assert state.tat["tpm"] == pytest.approx(_chain(live, interval), abs=1e-3), seq


def test_merged_barriers_still_never_give_back_lapsed_capacity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With few barriers kept (so that they merge), random refunds still never leave
    the TAT below the chain recomputed without them."""
    import random

    from mainspring.limits import _rate as rate_module

    monkeypatch.setattr(rate_module, "_MAX_BARRIERS", 3)
    rate = _rate(tpm=6000)
    for trial in range(200):
        rng = random.Random(trial)
        state, live, now = BucketState(), {}, NOW
        for _ in range(60):
            now += rng.choice([0.0, 0.0, 0.5, 2.0])
            if live and rng.random() < 0.4:
                seq = rng.choice(list(live))
                start, units = live[seq]
                back = rng.choice([units, units / 2])
                settle(state, rate, {"tpm": -back}, now, seq)
                live[seq] = (start, units - back)
            else:
                units = rng.choice([500, 1000, 2000, 3000])
                start = book(state, rate, {"tpm": units}, now)  # type: ignore[arg-type]
                live[state.seq] = (start, units)
            assert len(state.barriers["tpm"]) <= 3
            assert max(state.tat["tpm"], now) >= max(_chain(live, 60 / 6000), now) - 1e-6, trial


# -- cold start and header sync --------------------------------------------------------


def test_a_cold_limiter_admits_one_probe_then_paces_from_its_headers(db_url: str) -> None:
    slack = _Slack()
    store = open_store(db_url)
    try:
        clock = FakeClock(NOW)
        limiter = RateLimits(period_s=60, headroom=0.0).limiter(store, clock, "openai", "m")
        probe = limiter.acquire(Cost(input_tokens=1000))
        assert (probe.probe, probe.retry, probe.waited_s) == (True, False, 0)
        waiting = [limiter.acquire(Cost(input_tokens=1000)) for _ in range(3)]
        # Nobody else goes while the probe is out, on any worker: ask again shortly.
        assert all(b.retry and not b.probe and b.charges == {} for b in waiting)
        assert all(0 < b.waited_s <= 0.25 + 0.05 for b in waiting)
        # Its reply: limit 6000 tokens, 4000 of them left (another client used 1000).
        limiter.settle(
            probe,
            Cost(input_tokens=1000),
            {"x-ratelimit-limit-tokens": "6000", "x-ratelimit-remaining-tokens": "4000"},
        )
        starts = [limiter.acquire(Cost(input_tokens=2000)) for _ in range(3)]
        assert not any(b.retry or b.probe for b in starts)
        # 4000 left: two go now, the third waits for 2000 tokens of refill (20 s).
        assert [b.waited_s for b in starts] == pytest.approx([0, 0, 20], abs=slack())
    finally:
        store.close()


def test_a_probe_whose_run_ended_or_lapsed_lets_the_next_one_go(db_url: str) -> None:
    store = open_store(db_url)
    try:
        clock = FakeClock(NOW)
        limiter = RateLimits(period_s=60).limiter(store, clock, "openai", "m")
        assert limiter.acquire(Cost(input_tokens=10), run="no-such-run").probe
        # Its run is gone (cancelled, failed, pruned): the gate is free again.
        held = limiter.acquire(Cost(input_tokens=10))
        assert held.probe
        assert limiter.acquire(Cost(input_tokens=10)).retry
        # A probe that never settles holds the gate for PROBE_HOLD_S at most.
        clock.advance(61)
        nxt = limiter.acquire(Cost(input_tokens=10), run=None)
        if store.dialect == "sqlite":  # (PostgreSQL books on its own clock)
            assert nxt.probe
        # The worker that takes a dead probe's run over refunds its booking before it
        # sends again (the model step's next attempt): that gives the gate back too.
        retaken = limiter.acquire(Cost(input_tokens=10), run="no-such-run-either")
        if store.dialect == "sqlite":
            assert retaken.retry  # the lapsed probe above was taken again
            limiter.settle(nxt, None)  # its run's new owner refunds it
            assert limiter.acquire(Cost(input_tokens=10)).probe
        # A reply without rate-limit headers: the provider announces none; pace freely.
        limiter.settle(held, Cost(input_tokens=10), {})
        free = [limiter.acquire(Cost(input_tokens=10)) for _ in range(3)]
        assert not any(b.retry or b.probe for b in free)
    finally:
        store.close()


def test_the_run_holding_the_probe_gets_the_gate_again_and_others_only_look(
    db_url: str,
) -> None:
    """The worker that takes a run over re-runs a booking whose end a crash kept out
    of the journal: the run holding the probe books again and goes (its old probe
    given back), where it was turned away and everyone waited out the 60 s hold.
    The runs behind it look at the gate (``gate``) without booking or writing."""
    app = ms.App(db_url)

    @app.workflow
    async def idle(ctx: ms.RunContext) -> None:
        return None

    a, b = app.submit(idle).run_id, app.submit(idle).run_id  # live runs (queued)
    try:
        limiter = RateLimits(period_s=60).limiter(app.store, FakeClock(NOW), "openai", "m")
        first = limiter.acquire(Cost(input_tokens=10), run=a)
        assert first.probe
        assert limiter.acquire(Cost(input_tokens=10), run=b).retry
        ahead = limiter.gate(run=b)
        assert ahead is not None and 0 < ahead <= 0.25
        assert limiter.gate(run=a) is None
        again = limiter.acquire(Cost(input_tokens=10), run=a)
        assert (again.probe, again.retry, again.seq) == (True, False, first.seq + 1)
        assert limiter.acquire(Cost(input_tokens=10), run=b).retry  # held by the new one
        state = limiter.table.state(limiter.key)
        assert [h[0] for h in state.holds] == [again.seq]  # the old probe's hold is gone
        limiter.gate(run=b)
        assert limiter.table.state(limiter.key) == state  # looking wrote nothing
        limiter.settle(again, Cost(input_tokens=10), {})  # no limits announced: warm
        assert limiter.gate(run=b) is None
    finally:
        app.close()


def test_rebook_refunds_and_books_anew_in_one_go(db_url: str) -> None:
    slack = _Slack()
    store = open_store(db_url)
    try:
        clock = FakeClock(NOW)
        cold = RateLimits(period_s=60).limiter(store, clock, "openai", "m")
        probe = cold.acquire(Cost(input_tokens=10))
        # A re-sent probe is the probe again: nobody got the gate in between.
        again = cold.rebook(probe)
        assert (again.probe, again.retry, again.seq) == (True, False, probe.seq + 1)
        assert cold.acquire(Cost(input_tokens=10)).retry
        cold.settle(again, Cost(input_tokens=10), {})  # no limits announced: warm
        rate = RateLimit(provider="openai", model="w", tpm=6000, headroom=0.0)
        warm = StoreRateLimiter(rate, store, clock=clock)
        full = warm.acquire(Cost(input_tokens=6000))
        # The whole bucket given back and booked again: at once, not a minute later.
        assert warm.rebook(full).waited_s == pytest.approx(0, abs=slack())
        assert warm.acquire(Cost(input_tokens=6000)).waited_s == pytest.approx(60, abs=slack())
    finally:
        store.close()


def test_every_reply_moves_the_bucket_towards_the_providers_view(db_url: str) -> None:
    slack = _Slack()
    store = open_store(db_url)
    try:
        clock = FakeClock(NOW)
        rate = RateLimit(provider="openai", model="m", tpm=6000, headroom=0.0)
        limiter = StoreRateLimiter(rate, store, clock=clock)
        first = limiter.acquire(Cost(input_tokens=1000))
        # Another client of the account used 500 meanwhile: the reply says 4500 left.
        limiter.settle(first, Cost(input_tokens=1000), {"x-ratelimit-remaining-tokens": "4500"})
        nxt = [limiter.acquire(Cost(input_tokens=1000)).waited_s for _ in range(4)]
        # Without the reply's word, four more would go at once (6000 in all); with it
        # the fourth waits, and the pace leaves the other client its 500 a minute.
        assert nxt[:3] == pytest.approx([0, 0, 0], abs=slack())
        assert nxt[3] == pytest.approx(4 * 60_000 / 5500 + 15 - 55, abs=slack())
        # The tier is lowered mid-run to 3000 per minute: the next reply says so, and
        # the pace follows at once: at least 20 ms a token, not 10.
        second = limiter.acquire(Cost(input_tokens=10))
        limiter.settle(
            second,
            Cost(input_tokens=10),
            {"x-ratelimit-limit-tokens": "3000", "x-ratelimit-remaining-tokens": "0"},
        )
        a, b = (limiter.acquire(Cost(input_tokens=300)) for _ in range(2))
        assert b.start - a.start >= 6.0 - 0.01
        assert a.waited_s > 60  # and what was booked at the old pace takes longer
    finally:
        store.close()


async def test_a_run_cancelled_while_it_sleeps_for_its_slot_gives_it_back(db_url: str) -> None:
    slack = _Slack()
    clock = FakeClock(NOW)
    app = ms.App(
        db_url,
        clock=clock,
        poll_interval_s=0.01,
        inline_wait_s=0.0,
        rate_limits=[RateLimit(provider="scripted", model="scripted", rpm=1, headroom=0.0)],
    )
    usage = Usage(input_tokens=5, output_tokens=1)
    done = ScriptedModel.call("finish", {"answer": "ok"}).tool_calls

    def model() -> ScriptedModel:
        return ScriptedModel([ModelResponse(tool_calls=done, usage=usage)])

    first = app.agent("first", model=model(), instructions="x")
    second = app.agent("second", model=model(), instructions="x")
    third = app.agent("third", model=model(), instructions="x")
    try:
        a = app.submit(first, "t")
        await drain(app)  # takes the one request of this minute
        b = app.submit(second, "t")
        await drain(app)
        run = app.get_run(b.run_id)
        assert (run.status, run.wait_reason) == ("sleeping", "rate_limit")
        assert run.wake_at == pytest.approx(NOW + 60, abs=slack())
        app.cancel(b.run_id)  # the store cancels it: no code of the run runs again
        c = app.submit(third, "t")
        await drain(app)
        # The cancelled run's slot went to the next run, not into the void.
        run = app.get_run(c.run_id)
        assert (run.status, run.wake_at) == ("sleeping", pytest.approx(NOW + 60, abs=slack()))
        assert (await a.result()).answer == "ok"
    finally:
        app.close()


def test_a_429_that_says_full_again_in_a_second_holds_the_bucket_a_second(
    tmp_path: Path,
) -> None:
    """A refusal answering "0 of 500 requests left, full again in 1s" (OpenAI's
    ``x-ratelimit-reset-requests``): the next request waits the second, not the minute
    that 500 requests take at 500 a minute. (Read as 500 requests used by someone else,
    it held every run of the account for 56 s; the horizon suite's injected 429s made
    its cells four times as long.)"""
    store = open_store(f"sqlite:///{tmp_path / 'rate.db'}")
    clock = FakeClock(NOW)
    limiter = StoreRateLimiter(RateLimit(provider="openai", model="m"), store, clock=clock)
    replied = {
        "x-ratelimit-limit-requests": "10000",
        "x-ratelimit-remaining-requests": "9999",
        "x-ratelimit-reset-requests": "6ms",
    }
    try:
        for _ in range(3):
            slot = limiter.reserve(prompt_tokens=500, max_tokens=100, run="r")
            limiter.settle(slot, Cost(input_tokens=500, output_tokens=50), replied)
        refused = limiter.reserve(prompt_tokens=500, max_tokens=100, run="r")
        limiter.settle(
            refused,
            None,
            {
                "retry-after": "1",
                "x-ratelimit-limit-requests": "500",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "1s",
            },
            retry_after=1.0,
        )
        after = limiter.reserve(prompt_tokens=500, max_tokens=100, run="r")
        assert after.waited_s == pytest.approx(1.0)
        # Both providers' spellings of the horizon.
        assert observed_resets({"x-ratelimit-reset-tokens": "6m0s"}, NOW) == {"tpm": 360.0}
        anthropic = {"anthropic-ratelimit-input-tokens-reset": "2026-01-01T00:00:05Z"}
        assert observed_resets(anthropic, NOW) == {"itpm": 5.0}
    finally:
        store.close()
