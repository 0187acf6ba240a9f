"""Traces, redaction, metrics, OpenTelemetry export, fork and retry (both backends)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from _helpers import drain
from prometheus_client.parser import text_string_to_metric_families

import mainspring as ms
from mainspring.limits import Price
from mainspring.models import ModelResponse, Usage
from mainspring.observability import Redactor, export_trace
from mainspring.testing import EffectLedger, FakeClock, ScriptedModel

call = ScriptedModel.call
SECRET = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0KLMN"
PRICES = {"scripted": Price(input=1.0, output=2.0)}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_700_000_000.0)


@pytest.fixture
def fapp(db_url: str, clock: FakeClock) -> ms.App:
    return ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0)


def _reply(turn: ModelResponse, tokens_in: int, tokens_out: int) -> ModelResponse:
    return ModelResponse(
        text=turn.text,
        tool_calls=turn.tool_calls,
        finish_reason=turn.finish_reason,
        usage=Usage(input_tokens=tokens_in, output_tokens=tokens_out),
    )


async def _support_run(app: ms.App, clock: FakeClock) -> tuple[str, list[str]]:
    sent: list[str] = []

    @app.tool
    def lookup_ticket(ticket: int) -> dict[str, Any]:
        """Read a ticket."""
        clock.advance(0.25)
        return {"ticket": ticket, "text": "printer on fire"}

    @app.tool(effect="write")
    def login(user: str, password: str) -> str:
        """Log in to the help desk."""
        sent.append(password)
        clock.advance(0.5)
        return f"logged in as {user}"

    model = ScriptedModel(
        [
            _reply(call("update_state", {"plan": [{"text": "read"}, {"text": "reply"}]}), 100, 10),
            _reply(call("lookup_ticket", {"ticket": 7}), 120, 12),
            _reply(call("login", {"user": "ana", "password": SECRET}), 140, 14),
            _reply(call("finish", {"answer": "done"}), 160, 16),
        ]
    )
    agent = app.agent(
        "support", model=model, instructions="x", tools=[lookup_ticket, login], prices=PRICES
    )
    await app.run(agent, "Answer ticket 7")
    return app.list_runs()[0].id, sent


async def test_trace_of_a_scripted_agent_run(fapp: ms.App, clock: FakeClock) -> None:
    run_id, sent = await _support_run(fapp, clock)
    trace = fapp.observe.trace(run_id)
    assert isinstance(trace, ms.RunTrace)
    kinds = [(e.kind, e.name) for e in trace.entries]
    assert kinds == [
        ("model", "model:scripted:scripted"),
        ("model", "model:scripted:scripted"),
        ("tool", "tool:lookup_ticket"),
        ("model", "model:scripted:scripted"),
        ("tool", "tool:login"),
        ("model", "model:scripted:scripted"),
    ]
    models = [e for e in trace.entries if e.kind == "model"]
    assert [(e.tokens_in, e.tokens_out) for e in models] == [
        (100, 10),
        (120, 12),
        (140, 14),
        (160, 16),
    ]
    assert models[0].cost_usd == pytest.approx((100 * 1.0 + 10 * 2.0) / 1e6)
    assert trace.tokens_in == 520 and trace.tokens_out == 52
    assert trace.cost_usd == pytest.approx((520 + 52 * 2) / 1e6)
    lookup = trace.entries[2]
    assert lookup.tool == "lookup_ticket"
    assert lookup.input_summary == '{"ticket": 7}'
    assert lookup.output_summary is not None and "printer on fire" in lookup.output_summary
    assert lookup.latency_s == pytest.approx(0.25)
    assert (lookup.attempt, lookup.status, lookup.error_class) == (1, "completed", None)
    # The secret was redacted before it was journaled: neither the journal, nor the
    # trace, nor the JSON export holds it; the tool saw what a replay would see.
    login = trace.entries[4]
    assert login.input_summary is not None and "[REDACTED]" in login.input_summary
    everything = json.dumps(trace.to_json()) + "".join(
        (s.output or "") + (s.error or "") for s in fapp.observe.steps(run_id)
    )
    assert SECRET not in everything
    assert "[REDACTED]" in everything
    assert sent == ["[REDACTED]"]


def test_redactor_shapes_and_configured_patterns() -> None:
    r = Redactor(patterns=[r"(card=)\d{12,19}"], keys=["pin"])
    text = json.dumps(
        {
            "a": "key sk-ant-api03-abcdefghijklmnop and AKIAABCDEFGHIJKLMNOP",
            "b": "ghp_" + "x" * 36 + " xoxb-1234567890-abc",
            "c": "Authorization: Bearer eyJhbGciOi.payload.sig",
            "d": "login?user=ana&password=hunter2&x=1",
            "e": "card=4111111111111111",
            "pin": "1234",
            "nested": json.dumps({"password": "hunter2", "user": "ana"}),
            "clean": "nothing to see",
        }
    )
    out = json.loads(r.redact_json(text))
    blob = json.dumps(out)
    for secret in ("sk-ant-api03", "AKIAABCD", "ghp_xxx", "xoxb-123", "eyJhbG", "hunter2", "4111"):
        assert secret not in blob, secret
    assert out["c"] == "Authorization: Bearer [REDACTED]"
    assert out["d"] == "login?user=ana&password=[REDACTED]&x=1"
    assert out["e"] == "card=[REDACTED]"
    assert out["pin"] == "[REDACTED]"
    assert json.loads(out["nested"]) == {"password": "[REDACTED]", "user": "ana"}
    assert out["clean"] == "nothing to see"
    clean = '{"a":"nothing"}'
    assert r.redact_json(clean) is clean
    with pytest.raises(ms.ConfigError, match="not a regex"):
        Redactor(patterns=["("])


async def test_redaction_can_be_turned_off(db_url: str) -> None:
    app = ms.App(db_url, redact=None)

    @app.workflow
    async def leak(ctx: ms.RunContext) -> str:
        return await ctx.step(lambda: SECRET, name="read")

    try:
        assert await app.run(leak) == SECRET
        assert SECRET in (app.observe.steps(app.list_runs()[0].id)[0].output or "")
    finally:
        app.close()


def _families(app: ms.App) -> dict[str, Any]:
    body, content_type = app.observe.metrics().render()
    assert content_type.startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def _samples(families: dict[str, Any], name: str, sample: str | None = None) -> dict[Any, float]:
    """``{label values: value}`` of one family's samples (``sample``: e.g. ``_total``)."""
    fam = families[name]
    return {
        tuple(v for k, v in sorted(s.labels.items())): s.value
        for s in fam.samples
        if sample is None or s.name == sample
    }


async def test_metrics_parse_back(fapp: ms.App, clock: FakeClock) -> None:
    await _support_run(fapp, clock)

    @fapp.workflow
    async def broken(ctx: ms.RunContext) -> None:
        async def limited() -> None:
            raise ms.RateLimited("429 slow down", retry_after=0)

        await ctx.step(limited, retry=ms.RetryPolicy(max_attempts=2, initial_s=0.0, jitter=False))

    fapp.submit(broken)
    await drain(fapp)
    families = _families(fapp)
    runs = _samples(families, "mainspring_runs")
    # every status is reported, 0 when no run is in it
    assert runs == {
        ("succeeded",): 1.0,
        ("failed",): 1.0,
        **{(s,): 0.0 for s in ("queued", "running", "sleeping", "waiting", "cancelled")},
    }
    assert families["mainspring_runs"].type == "gauge"
    # store-wide values are gauges (N replicas report the same value, not N times it)
    assert families["mainspring_store_tokens"].type == "gauge"
    assert _samples(families, "mainspring_store_tokens") == {
        ("input", "support"): 520.0,
        ("output", "support"): 52.0,
        ("input", "broken"): 0.0,
        ("output", "broken"): 0.0,
    }
    # counters of what this process executed
    tokens = _samples(families, "mainspring_tokens", "mainspring_tokens_total")
    assert tokens == {
        ("input", "scripted:scripted", "support"): 520.0,
        ("output", "scripted:scripted", "support"): 52.0,
    }
    cost = _samples(families, "mainspring_cost_usd", "mainspring_cost_usd_total")
    assert cost[("scripted:scripted", "support")] == pytest.approx((520 + 104) / 1e6)
    hist = {
        (s.name, s.labels.get("kind"), s.labels.get("le")): s.value
        for s in families["mainspring_step_seconds"].samples
    }
    assert hist[("mainspring_step_seconds_count", "tool", None)] == 2
    assert hist[("mainspring_step_seconds_bucket", "tool", "0.25")] == 1
    assert hist[("mainspring_step_seconds_bucket", "tool", "0.5")] == 2
    assert hist[("mainspring_step_seconds_sum", "tool", None)] == pytest.approx(0.75)
    retries = _samples(families, "mainspring_step_retries", "mainspring_step_retries_total")
    # every kind is reported from the start, 0 until it moves
    assert retries == {("step",): 1.0, ("model",): 0.0, ("tool",): 0.0, ("rate",): 0.0}
    limited = _samples(families, "mainspring_rate_limited", "mainspring_rate_limited_total")
    # both attempts were answered 429; the agent's model is there at 0 from the start
    assert limited == {("step", ""): 2.0, ("model", "scripted:scripted"): 0.0}
    steps = _samples(families, "mainspring_steps", "mainspring_steps_total")
    assert steps[("tool", "completed")] == 2 and steps[("step", "failed")] == 1
    finished = _samples(families, "mainspring_runs_finished", "mainspring_runs_finished_total")
    assert {k: v for k, v in finished.items() if v} == {
        ("succeeded", "support"): 1.0,
        ("failed", "broken"): 1.0,
    }
    assert finished[("cancelled", "broken")] == 0.0  # there before the first cancel
    info = families["mainspring_build_info"].samples[0]
    assert info.value == 1 and info.labels["python"]


async def test_waits_have_their_own_histogram(fapp: ms.App, clock: FakeClock) -> None:
    @fapp.workflow
    async def patient(ctx: ms.RunContext) -> str:
        await ctx.sleep(3600)  # an hour: not a slow step
        return await ctx.step(lambda: "ok", name="quick")

    run_id = fapp.submit(patient).run_id
    await drain(fapp)
    clock.advance(3601)
    await drain(fapp)
    assert fapp.get_run(run_id).status == "succeeded"
    families = _families(fapp)
    waits = {
        (s.name, s.labels.get("reason"), s.labels.get("le")): s.value
        for s in families["mainspring_wait_seconds"].samples
    }
    assert waits[("mainspring_wait_seconds_count", "sleep", None)] == 1
    assert waits[("mainspring_wait_seconds_sum", "sleep", None)] >= 3600
    steps = {
        (s.name, s.labels.get("kind"), s.labels.get("le")): s.value
        for s in families["mainspring_step_seconds"].samples
    }
    # the step's execution took no (fake) time: the hour of sleep is not in it
    assert steps[("mainspring_step_seconds_sum", "step", None)] == 0.0
    assert steps[("mainspring_step_seconds_bucket", "step", "0.005")] == 1


async def test_retry_back_off_is_a_wait_not_step_time(fapp: ms.App, clock: FakeClock) -> None:
    failures = {"left": 1}

    def flaky() -> str:
        clock.advance(0.5)  # the attempt itself takes half a second
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("reset")
        return "ok"

    @fapp.workflow
    async def backoff(ctx: ms.RunContext) -> str:
        policy = ms.RetryPolicy(max_attempts=2, initial_s=30.0, jitter=False)
        return await ctx.step(flaky, name="flaky", retry=policy)

    run_id = fapp.submit(backoff).run_id
    await drain(fapp)
    assert fapp.get_run(run_id).status == "sleeping"  # the back-off released the worker
    clock.advance(30)
    await drain(fapp)
    assert fapp.get_run(run_id).status == "succeeded"
    families = _families(fapp)
    waits = {
        (s.name, s.labels.get("reason")): s.value
        for s in families["mainspring_wait_seconds"].samples
        if "le" not in s.labels
    }
    assert waits[("mainspring_wait_seconds_count", "retry")] == 1
    assert waits[("mainspring_wait_seconds_sum", "retry")] == pytest.approx(30.0)
    steps = {
        s.name: s.value
        for s in families["mainspring_step_seconds"].samples
        if s.labels.get("kind") == "step" and "le" not in s.labels
    }
    assert steps["mainspring_step_seconds_count"] == 2  # two attempts of half a second
    assert steps["mainspring_step_seconds_sum"] == pytest.approx(1.0)


async def test_counters_never_go_down_across_prune_retry_and_fork(
    fapp: ms.App, clock: FakeClock, tmp_path: Path
) -> None:
    fail = {"charge1": True}
    billing = _ledger_app(fapp, EffectLedger(tmp_path / "l.db"), fail)
    model = ScriptedModel([_reply(call("finish", {"answer": "ok"}), 700, 30)] * 3)
    agent = fapp.agent("helper", model=model, instructions="x", prices=PRICES)
    seen: list[dict[tuple[str, Any], float]] = []

    def scrape() -> dict[tuple[str, Any], float]:
        values: dict[tuple[str, Any], float] = {}
        for fam in _families(fapp).values():
            if fam.type in ("counter", "histogram"):
                for s in fam.samples:
                    values[(s.name, tuple(sorted(s.labels.items())))] = s.value
        for key, before in (seen[-1] if seen else {}).items():
            assert values.get(key, 0.0) >= before, (key, before, values.get(key))
        seen.append(values)
        return values

    failed = fapp.submit(billing, 3).run_id
    source = fapp.submit(agent, "hi").run_id
    await drain(fapp)
    first = scrape()
    fail.clear()
    fapp.retry(failed)  # drops the failed step from the journal
    scrape()
    await drain(fapp)
    scrape()
    fork = fapp.fork(source, from_step=0)  # copies the model call: spent once only
    await drain(fapp)
    assert fapp.get_run(fork.run_id).status == "succeeded"
    after_fork = scrape()
    key = (
        "mainspring_tokens_total",
        (("direction", "input"), ("model", "scripted:scripted"), ("workflow", "helper")),
    )
    assert first[key] == 700 and after_fork[key] == 700  # the fork added no tokens
    assert fapp.observe.trace(fork.run_id).tokens_in == 0  # nor does its trace
    assert fapp.observe.trace(fork.run_id).entries[0].copied
    clock.advance(10 * 86400)
    pruned = fapp.store.prune(86400, clock.now())
    assert pruned.runs == 3
    scrape()  # counters kept; the store-wide gauges dropped with the runs
    assert _samples(_families(fapp), "mainspring_runs")[("succeeded",)] == 0


async def test_otel_spans_follow_genai_conventions(fapp: ms.App, clock: FakeClock) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from mainspring.observability import export_trace

    run_id, _ = await _support_run(fapp, clock)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    export_trace(fapp.observe.trace(run_id), tracer_provider=provider)
    spans = exporter.get_finished_spans()
    assert len({s.context.trace_id for s in spans}) == 1  # one trace per run
    root = next(s for s in spans if s.parent is None)
    assert root.name == "invoke_agent support"
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["mainspring.run.id"] == run_id
    chats = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert len(chats) == 4
    assert chats[0].attributes["gen_ai.request.model"] == "scripted"
    assert chats[0].attributes["gen_ai.usage.input_tokens"] == 100
    assert chats[0].attributes["gen_ai.usage.output_tokens"] == 10
    tools = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    assert [s.attributes["gen_ai.tool.name"] for s in tools] == ["lookup_ticket", "login"]
    # a turn level: each tool call under the turn of the model call that asked for it
    turns = {s.context.span_id: s for s in spans if s.name.startswith("turn ")}
    assert len(turns) == 4 and all(t.parent.span_id == root.context.span_id for t in turns.values())
    assert all(s.parent.span_id in turns for s in [*chats, *tools])
    for tool in tools:
        turn = turns[tool.parent.span_id]
        (chat,) = [c for c in chats if c.parent.span_id == turn.context.span_id]
        assert chat.end_time <= tool.start_time and turn.end_time >= tool.end_time
        assert turn.attributes["mainspring.turn.tool_calls"] == 1
    assert abs(tools[0].end_time - tools[0].start_time - 250_000_000) < 1_000
    assert SECRET not in str(tools[1].attributes)


async def test_operator_gauges_queue_age_waits_by_reason_dead_letters(
    fapp: ms.App, clock: FakeClock
) -> None:
    @fapp.workflow
    async def waits(ctx: ms.RunContext, what: str) -> None:
        if what == "sleep":
            await ctx.sleep(600)
        elif what == "approval":
            await ctx.approval("refund")
        else:
            await ctx.wait_for("go")

    for what in ("sleep", "approval", "go"):
        fapp.submit(waits, what)
    await drain(fapp)
    clock.advance(30)
    queued = fapp.submit(waits, "go").run_id
    clock.advance(12)
    # a run whose worker died twice over is dead-lettered by the next claim
    doomed = fapp.submit(waits, "go").run_id
    s = fapp.store
    s.claim(worker="w1", now=clock.now(), lease_s=1, limit=1, workflows=None,
            max_recoveries=5, run_id=doomed)  # fmt: skip
    s.claim(worker="w2", now=clock.now() + 5, lease_s=1, limit=1, workflows=None,
            max_recoveries=0, run_id=doomed)  # fmt: skip
    assert fapp.get_run(doomed).status == "failed"
    families = _families(fapp)
    assert _samples(families, "mainspring_runs_waiting") == {
        ("sleep",): 1.0,
        ("approval",): 1.0,
        ("signal",): 1.0,
        **{(r,): 0.0 for r in ("retry", "rate_limit", "question", "budget", "replay")},
    }
    ages = _samples(families, "mainspring_store_oldest_run_age_seconds")
    assert ages[("queued",)] == pytest.approx(12.0)  # the oldest queued run: submitted 12 s ago
    assert ages[("waiting",)] == pytest.approx(42.0)
    assert ages[("sleeping",)] == pytest.approx(42.0)
    waited = _samples(families, "mainspring_store_oldest_wait_age_seconds")
    assert waited[("approval",)] == pytest.approx(42.0) and waited[("question",)] == 0.0
    assert _samples(families, "mainspring_store_dead_lettered_runs") == {(): 1.0}
    assert fapp.get_run(queued).status == "queued"


async def test_takeovers_saturation_run_duration_and_webhook_backlog(
    fapp: ms.App, clock: FakeClock
) -> None:
    @fapp.workflow
    async def short(ctx: ms.RunContext) -> str:
        clock.advance(2)
        return await ctx.step(lambda: "ok", name="only")

    fapp.store.add_webhook("http://127.0.0.1:9/hook", clock.now())
    taken = fapp.submit(short).run_id
    # a worker claims it and dies: its lease runs out, and ours takes the run over
    fapp.store.claim(worker="dead", now=clock.now(), lease_s=5, limit=1, workflows=None,
                     max_recoveries=5, run_id=taken)  # fmt: skip
    clock.advance(10)
    fapp.submit(short)
    worker = fapp.worker(concurrency=3)
    await asyncio.wait_for(worker.run(until_idle=True), 30)
    families = _families(fapp)
    assert _samples(families, "mainspring_lease_takeovers", "mainspring_lease_takeovers_total") == {
        ("short",): 1.0
    }
    assert _samples(families, "mainspring_runs_claimed", "mainspring_runs_claimed_total") == {
        ("short",): 2.0
    }
    durations = {
        s.name: s.value
        for s in families["mainspring_run_duration_seconds"].samples
        if s.labels.get("workflow") == "short" and "le" not in s.labels
    }
    # from submission to the end: the run taken over includes the 10 s lost to the dead
    # worker, as the store's own timestamps say
    assert durations["mainspring_run_duration_seconds_count"] == 2
    runs = fapp.list_runs()
    expected = sum((r.finished_at or 0.0) - r.created_at for r in runs)
    assert expected > 10 and durations["mainspring_run_duration_seconds_sum"] == pytest.approx(
        expected
    )
    # the worker stopped: nothing active, no capacity left in this process
    assert _samples(families, "mainspring_worker_active_runs") == {(): 0.0}
    assert _samples(families, "mainspring_worker_concurrency") == {(): 0.0}
    # every finished run queued a webhook that nobody delivered yet
    backlog = _samples(families, "mainspring_store_webhook_backlog")
    assert backlog == {("pending",): 2.0, ("given_up",): 0.0}
    clock.advance(60)
    age = _samples(_families(fapp), "mainspring_store_webhook_oldest_pending_age_seconds")
    assert age[()] == pytest.approx(60.0)


async def test_dead_letters_are_counted_by_the_claim_that_makes_them(
    fapp: ms.App, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    @fapp.workflow
    async def doomed(ctx: ms.RunContext) -> str:
        return await ctx.step(lambda: "ok", name="only")

    run_id = fapp.submit(doomed).run_id
    # two workers claim it in turn and die: the next recovery is one too many
    for dead in ("dead", "dead too"):
        fapp.store.claim(worker=dead, now=clock.now(), lease_s=5, limit=1, workflows=None,
                         max_recoveries=5, run_id=run_id)  # fmt: skip
        clock.advance(10)
    fapp.max_recoveries = 1
    with caplog.at_level("WARNING", logger="mainspring.worker"):
        await asyncio.wait_for(fapp.worker().run(until_idle=True), 30)
    assert fapp.get_run(run_id).status == "failed"
    families = _families(fapp)
    # a counter of this process, beside the store-wide gauge (which pruning lowers)
    assert _samples(families, "mainspring_dead_letters", "mainspring_dead_letters_total") == {
        ("doomed",): 1.0
    }
    assert _samples(families, "mainspring_store_dead_lettered_runs") == {(): 1.0}
    # no claim: the series stands at 0 (born with the process, not at its first claim)
    claimed = _samples(families, "mainspring_runs_claimed", "mainspring_runs_claimed_total")
    assert claimed == {("doomed",): 0.0}
    said = [r.message for r in caplog.records if "event=dead_letter" in r.message]
    assert len(said) == 1 and f"run={run_id}" in said[0]


async def test_worker_saturation_while_it_runs(fapp: ms.App) -> None:
    seen: list[dict[Any, float]] = []
    gate = asyncio.Event()

    @fapp.workflow
    async def busy(ctx: ms.RunContext) -> None:
        async def look() -> None:
            fams = _families(fapp)
            seen.append(
                {
                    "active": _samples(fams, "mainspring_worker_active_runs")[()],
                    "cap": _samples(fams, "mainspring_worker_concurrency")[()],
                }
            )
            gate.set()

        await ctx.step(look, name="look")

    fapp.submit(busy)
    await asyncio.wait_for(fapp.worker(concurrency=4).run(until_idle=True), 30)
    assert gate.is_set() and seen == [{"active": 1.0, "cap": 4.0}]


async def test_worker_heartbeat_age_grows_while_its_beats_fail(
    db_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mainspring import StoreUnavailable

    app = ms.App(db_url, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0, heartbeat_s=0.01)
    release = asyncio.Event()
    beats: list[bool] = []  # each heartbeat, and whether it failed
    failing = False
    heartbeat = app.store.heartbeat

    def beating(**kwargs: Any) -> Any:
        beats.append(failing)
        if failing:
            raise StoreUnavailable("database unreachable")
        return heartbeat(**kwargs)

    monkeypatch.setattr(app.store, "heartbeat", beating)

    @app.workflow
    async def held(ctx: ms.RunContext) -> None:
        async def hold() -> None:
            await release.wait()

        await ctx.step(hold, name="hold")

    async def more_beats(n: int) -> None:
        # every beat before these has returned (one thread beats in turn)
        wanted = len(beats) + n
        for _ in range(3000):
            if len(beats) >= wanted:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"the worker made {len(beats)} heartbeats, wanted {wanted}")

    def age() -> dict[Any, float]:
        return _samples(_families(app), "mainspring_worker_heartbeat_age_seconds")

    app.submit(held)
    worker = app.worker()
    task = asyncio.create_task(worker.run(until_idle=True))
    await more_beats(2)
    assert age() == {(worker.worker_id,): 0.0}
    failing = True
    await more_beats(2)
    clock.advance(5)
    await more_beats(1)
    assert age() == {(worker.worker_id,): 5.0}  # stuck: the last good beat is 5 s old
    failing = False
    await more_beats(2)
    assert age() == {(worker.worker_id,): 0.0}
    release.set()
    await asyncio.wait_for(task, 30)
    assert age() == {}  # a stopped worker is not reported
    app.close()


async def test_a_scrape_reads_only_running_and_changed_journals(
    fapp: ms.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    @fapp.workflow
    async def parked(ctx: ms.RunContext) -> None:
        await ctx.step(lambda: 1, name="one")
        await ctx.wait_for("go")

    ids = [fapp.submit(parked).run_id for _ in range(3)]
    await drain(fapp)
    read: list[str] = []
    load_steps = fapp.store.load_steps

    def counting(run_id: str, *args: Any, **kwargs: Any) -> Any:
        read.append(run_id)
        return load_steps(run_id, *args, **kwargs)

    monkeypatch.setattr(fapp.store, "load_steps", counting)
    first = _samples(_families(fapp), "mainspring_store_steps")
    assert sorted(read) == sorted(ids)
    read.clear()
    assert _samples(_families(fapp), "mainspring_store_steps") == first
    assert read == []  # three waiting runs, unchanged: no journal read again
    fapp.signal(ids[0], "go")
    await drain(fapp)
    read.clear()
    _families(fapp)
    assert read == [ids[0]]  # the one that moved


async def test_a_scrape_reads_the_rows_that_changed_not_every_run(
    fapp: ms.App, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    @fapp.workflow
    async def parked(ctx: ms.RunContext) -> None:
        await ctx.step(lambda: 1, name="one")
        await ctx.wait_for("go")

    @fapp.workflow
    async def quick(ctx: ms.RunContext) -> int:
        return await ctx.step(lambda: 2, name="two")

    for _ in range(20):
        fapp.submit(quick)
    waiting = fapp.submit(parked).run_id
    await drain(fapp)
    rows: list[int] = []
    run_changes = fapp.store.run_changes

    def counting(*args: Any, **kwargs: Any) -> Any:
        got = run_changes(*args, **kwargs)
        rows.append(len(got))
        return got

    monkeypatch.setattr(fapp.store, "run_changes", counting)
    assert _samples(_families(fapp), "mainspring_runs")[("succeeded",)] == 20
    assert rows == [21]  # the first scrape reads every run once
    clock.advance(600)  # well past the look-back for late commits
    fapp.signal(waiting, "go")
    await drain(fapp)
    _families(fapp)  # also re-reads the rows of the minute before the last scrape
    rows.clear()
    fams = _families(fapp)
    assert rows == [1]  # the run that moved last, not the 20 that finished long ago
    assert _samples(fams, "mainspring_runs")[("succeeded",)] == 21
    assert _samples(fams, "mainspring_runs")[("waiting",)] == 0
    assert _samples(fams, "mainspring_store_steps")[("step", "completed")] == 22
    # Pruning deletes rows without changing any: seen by the oldest finish time alone.
    clock.advance(1)
    fapp.store.prune(300, clock.now())
    rows.clear()
    fams = _families(fapp)
    assert rows == [1]  # the same recent one, in the look-back: none of the 20 pruned
    assert _samples(fams, "mainspring_runs")[("succeeded",)] == 1
    assert _samples(fams, "mainspring_store_steps")[("step", "completed")] == 2
    assert _samples(fams, "mainspring_store_tokens") == {
        ("input", "parked"): 0.0,
        ("output", "parked"): 0.0,
    }


async def test_rate_limit_bookings_count_the_wait_per_model(clock: FakeClock) -> None:
    from mainspring.journal import StepCall, StepInfo
    from mainspring.limits import Booking
    from mainspring.observability import Telemetry

    telemetry = Telemetry(clock, prices=lambda _wf: None)
    booking = Booking(key="openai:gpt-4.1:default", start=0.0, waited_s=2.5, wake_at=2.5)
    info = StepInfo(
        run_id="r", session=0, seq=0, name="rate:openai:gpt-4.1:default", attempt=1, role="rate"
    )

    async def book() -> Booking:
        return booking

    for _ in range(2):
        assert await telemetry.execute_step(StepCall(info=info, fn=book), book) is booking
    values = {
        (s.name, tuple(s.labels.values())): s.value
        for fam in telemetry.collect()
        for s in fam.samples
    }
    assert values[("mainspring_rate_limit_wait_seconds_total", ("openai:gpt-4.1",))] == 5.0
    assert values[("mainspring_rate_limit_bookings_total", ("openai:gpt-4.1",))] == 2.0
    assert values[("mainspring_step_attempts_total", ("rate", "ok"))] == 2.0


async def test_the_grafana_dashboard_uses_only_exported_metrics(
    fapp: ms.App, clock: FakeClock
) -> None:
    import re

    from mainspring.storage import WorkerBeat

    await _support_run(fapp, clock)
    # A worker's heartbeat registers it: the server's registry gauges then have series.
    now = time.time()
    beat = WorkerBeat(id="w1", host="h", pid=1, started_at=now - 60, lease_s=15)
    fapp.store.heartbeat(runs=[], now=now, lease_s=15, worker=beat)
    exported = set(_families(fapp))
    dashboard = json.loads(
        (Path(__file__).parent.parent / "docs/grafana-dashboard.json").read_text()
    )
    used = {
        re.sub(r"_(total|bucket|sum|count)$", "", name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"mainspring_[a-z_]+", target["expr"])
    }
    assert len(used) >= 15
    assert used <= exported, used - exported
    problems = {
        target["expr"]: found
        for panel in dashboard["panels"]
        for target in panel["targets"]
        if (found := _promql_problems(target["expr"]))
    }
    assert problems == {}
    # Counters whose first event matters count a series born in the window whole
    # (increase() alone reads 0 for a replacement worker's first takeovers).
    exprs = " ".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    for counter, window in (
        ("mainspring_lease_takeovers_total", "15m"),
        ("mainspring_dead_letters_total", "15m"),
        ("mainspring_rate_limited_total", "5m"),
    ):
        assert f"({counter} unless {counter} offset {window}) or increase(" in exprs


#: PromQL functions and aggregations the dashboard may use.
_PROMQL_FUNCTIONS = frozenset(
    [
        "sum",
        "max",
        "min",
        "avg",
        "count",
        "rate",
        "increase",
        "irate",
        "delta",
        "histogram_quantile",
        "absent",
        "vector",
        "clamp_min",
        "clamp_max",
        "time",
        "timestamp",
        "topk",
        "bottomk",
        "quantile",
    ]
)


def _promql_problems(expr: str) -> list[str]:
    """A structural check of a PromQL expression (promtool is not on every machine):
    balanced brackets outside strings, known functions, well-formed range and offset
    durations and label matchers."""
    import re

    problems: list[str] = []
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    in_string = False
    for ch in expr:
        if ch == '"':
            in_string = not in_string
        elif in_string:
            continue
        elif ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            problems.append(f"unbalanced {ch!r}")
    if stack or in_string:
        problems.append("unclosed bracket or string")
    bare = re.sub(r'"[^"]*"', '""', expr)
    for name in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", bare):
        if name not in _PROMQL_FUNCTIONS | {"by", "without", "on", "ignoring"}:
            problems.append(f"unknown function {name!r}")
    for duration in re.findall(r"\[([^\]]*)\]", bare):
        if not re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", duration):
            problems.append(f"bad range [{duration}]")
    for duration in re.findall(r"offset\s+(\S+)", bare):
        if not re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+\)?", duration):
            problems.append(f"bad offset {duration}")
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        for m in filter(None, (x.strip() for x in matchers.split(","))):
            if not re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)\s*"[^"]*"', m):
                problems.append(f"bad matcher {m!r}")
    return problems


@pytest.mark.parametrize(
    "expr",
    [
        "sum(rate(x[5m])",  # unclosed
        "sum(rate(x[5 m]))",
        'max(x{state="dead")}',
        "sum(increse(x[5m]))",
        "x{state=dead}",
        "x offset 15",
    ],
)
def test_the_promql_check_catches_broken_expressions(expr: str) -> None:
    assert _promql_problems(expr)


def _memory_provider() -> tuple[Any, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _ids(spans: Any) -> set[tuple[str, int, int, int | None]]:
    return {
        (s.name, s.context.trace_id, s.context.span_id, s.parent.span_id if s.parent else None)
        for s in spans
    }


async def test_live_spans_while_the_run_runs_and_backfill_gives_the_same_ids(
    fapp: ms.App, clock: FakeClock
) -> None:
    from opentelemetry.trace import StatusCode

    provider, exporter = _memory_provider()
    fapp.observe.enable_tracing(provider)
    flaky = {"left": 1}

    def charge() -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("card service down, token sk-proj-" + "x" * 24)
        return "charged"

    @fapp.workflow
    async def order(ctx: ms.RunContext) -> str:
        got = await ctx.step(
            charge, name="charge", retry=ms.RetryPolicy(max_attempts=3, initial_s=0.0, jitter=False)
        )
        await ctx.wait_for("shipped")
        ctx.now()  # a recorded value: no span, live or back-filled
        await ctx.step(lambda: 1, name="rate:openai:gpt-4.1:default", role="rate")
        return got

    run_id = fapp.submit(order).run_id
    await drain(fapp)
    assert fapp.get_run(run_id).status == "waiting"
    # The run is still waiting: both attempts of its step were exported already.
    live = exporter.get_finished_spans()
    attempts = sorted(
        (s for s in live if s.name == "step charge"),
        key=lambda s: s.attributes["mainspring.step.attempt"],
    )
    assert [s.attributes["mainspring.step.attempt"] for s in attempts] == [1, 2]
    failed, ok = attempts
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes["error.type"] == "ConnectionError"
    (event,) = failed.events
    assert event.name == "exception" and event.attributes["exception.type"] == "ConnectionError"
    assert "sk-proj-" not in str(event.attributes)  # redacted like the journal
    assert ok.status.status_code == StatusCode.OK and "error.type" not in ok.attributes
    # no root span for a running run, but a "started" root that lists it in trace views
    (started,) = [s for s in live if s.parent is None]
    assert started.name == "workflow order (started)"
    assert started.attributes["mainspring.run.phase"] == "started"
    assert started.status.status_code == StatusCode.UNSET
    assert not any("input.value" in s.attributes or "output.value" in s.attributes for s in live)
    fapp.signal(run_id, "shipped")
    await drain(fapp)
    assert fapp.get_run(run_id).status == "succeeded"
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.parent is None and s is not started]
    assert root.name == "workflow order" and root.status.status_code == StatusCode.OK
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    assert all(s.parent.span_id == root.context.span_id for s in spans if s.parent)
    assert any(s.name == "signal shipped" for s in spans)  # the wait, as its own span

    # Back-filling the same run gives the same trace and span ids, twice over.
    provider2, again = _memory_provider()
    export_trace(fapp.observe.trace(run_id), tracer_provider=provider2)
    export_trace(fapp.observe.trace(run_id), tracer_provider=provider2)
    back = again.get_finished_spans()
    assert _ids(back[: len(back) // 2]) == _ids(back[len(back) // 2 :])
    # the journal keeps the last attempt only: it, the wait and the root agree with live
    # (the "started" root is live export's alone: a back-fill is of a run read back)
    assert _ids(back) <= _ids(spans)
    assert _ids(spans) - _ids(back) == {
        x for x in _ids(spans) if x[2] in (failed.context.span_id, started.context.span_id)
    }
    assert "rate rate:openai:gpt-4.1:default" in {s.name for s in back}
    (charge_span,) = [s for s in back[: len(back) // 2] if s.name == "step charge"]
    assert "error.type" not in charge_span.attributes
    assert [e.name for e in charge_span.events] == ["previous_attempt_failed"]


CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("header", "valid"),
    [
        (f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", True),
        (f"01-{CALLER_TRACE}-{CALLER_SPAN}-00-later-fields", True),  # a later version
        (f"00-{CALLER_TRACE}-{CALLER_SPAN}-01-extra", False),  # version 00: four fields
        (f"ff-{CALLER_TRACE}-{CALLER_SPAN}-01", False),
        (f"00-{'0' * 32}-{CALLER_SPAN}-01", False),
        (f"00-{CALLER_TRACE}-{'0' * 16}-01", False),
        (f"00-{CALLER_TRACE.upper()}-{CALLER_SPAN}-01", False),
        ("", False),
    ],
)
def test_traceparent_parsing_follows_w3c(header: str, valid: bool) -> None:
    from mainspring.observability._traceparent import parse_traceparent

    assert (parse_traceparent(header) is not None) is valid


async def test_traceparent_on_submit_puts_the_run_in_the_callers_trace(
    fapp: ms.App, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient

    from mainspring.server import create_app

    provider, exporter = _memory_provider()
    fapp.observe.enable_tracing(provider)

    @fapp.workflow
    async def order(ctx: ms.RunContext) -> str:
        await ctx.wait_for("shipped")
        return await ctx.step(lambda: "done", name="close")

    _, token = fapp.store.create_api_key("svc", ["submit"], 0.0)
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(fapp, webhooks=False)) as client:
        linked = client.post(
            "/runs",
            json={"workflow": "order"},
            headers={**auth, "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"},
        ).json()["id"]
        # A malformed header is ignored (W3C): the run is a trace of its own.
        alone = client.post(
            "/runs", json={"workflow": "order"}, headers={**auth, "traceparent": "00-zz-1-01"}
        ).json()["id"]
    assert fapp.get_run(linked).traceparent == f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    assert fapp.get_run(alone).traceparent is None
    for run_id in (linked, alone):
        await drain(fapp)
        fapp.signal(run_id, "shipped")
    await drain(fapp)

    def of(spans: Any, run_id: str) -> list[Any]:
        return [s for s in spans if s.attributes.get("session.id") == run_id]

    live = exporter.get_finished_spans()
    mine = of(live, linked)
    (root,) = [s for s in mine if s.name == "workflow order"]
    assert {s.context.trace_id for s in mine} == {int(CALLER_TRACE, 16)}
    assert root.parent is not None and root.parent.span_id == int(CALLER_SPAN, 16)
    assert root.parent.is_remote
    (started,) = [s for s in mine if s.name == "workflow order (started)"]
    assert started.parent.span_id == int(CALLER_SPAN, 16)  # beside the run's root
    assert all(
        s.parent.span_id == root.context.span_id for s in mine if s.parent.is_remote is False
    )
    (own_root,) = [s for s in of(live, alone) if s.name == "workflow order"]
    assert own_root.parent is None and own_root.context.trace_id != int(CALLER_TRACE, 16)

    # Back-fill links the same way: the same ids, the same parent.
    provider2, again = _memory_provider()
    export_trace(fapp.observe.trace(linked), tracer_provider=provider2)
    back = again.get_finished_spans()
    assert _ids(back) == _ids([s for s in mine if s is not started])


async def test_a_fork_sits_in_its_sources_trace_under_the_sources_root(fapp: ms.App) -> None:
    provider, exporter = _memory_provider()
    fapp.observe.enable_tracing(provider)

    @fapp.workflow
    async def steps(ctx: ms.RunContext) -> int:
        a = await ctx.step(lambda: 1, name="a")
        return a + await ctx.step(lambda: 2, name="b")

    source = fapp.enqueue(steps, traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01").run_id
    await drain(fapp)
    fork = fapp.fork(source, from_step=0).run_id
    await drain(fapp)
    assert fapp.get_run(fork).status == "succeeded"
    live = exporter.get_finished_spans()
    (source_root,) = [
        s for s in live if s.name == "workflow steps" and s.attributes["session.id"] == source
    ]
    mine = [s for s in live if s.attributes.get("session.id") == fork]
    # the copied step "a" replayed: only "b" ran, and the fork's root
    assert sorted(s.name for s in mine) == ["step b", "workflow steps", "workflow steps (started)"]
    (root,) = [s for s in mine if s.name == "workflow steps"]
    assert {s.context.trace_id for s in live} == {int(CALLER_TRACE, 16)}  # one trace
    assert root.parent is not None and root.parent.span_id == source_root.context.span_id
    assert root.attributes["mainspring.run.parent"] == source
    assert root.attributes["mainspring.run.parent_kind"] == "fork"
    assert root.attributes["mainspring.run.parent_step"] == "0:0"

    # Back-fill agrees, and marks the step the fork copied (spent by the source).
    provider2, again = _memory_provider()
    export_trace(fapp.observe.trace(fork), tracer_provider=provider2)
    back = again.get_finished_spans()
    assert _ids([s for s in back if s.name != "step a"]) == _ids(
        [s for s in mine if not s.name.endswith("(started)")]
    )
    (copied,) = [s for s in back if s.name == "step a"]
    assert copied.attributes["mainspring.step.copied"] is True
    assert copied.context.trace_id == int(CALLER_TRACE, 16)


async def test_content_capture_is_opt_in_redacted_and_capped(
    fapp: ms.App, clock: FakeClock
) -> None:
    provider, exporter = _memory_provider()
    fapp.observe.enable_tracing(provider, capture_content=True, content_max_chars=30)
    second, _ = await _support_run(fapp, clock)
    spans = exporter.get_finished_spans()
    assert all(s.attributes["session.id"] == second for s in spans)
    login = next(s for s in spans if s.name == "execute_tool login")
    assert '"password":"[R' in login.attributes["input.value"]  # redacted, then capped
    lookup = next(s for s in spans if s.name == "execute_tool lookup_ticket")
    assert lookup.attributes["output.value"].endswith("…")  # capped
    assert len(lookup.attributes["output.value"]) == 30
    assert lookup.attributes["gen_ai.tool.call.result"] == lookup.attributes["output.value"]
    chat = next(s for s in spans if s.name == "chat scripted")
    assert chat.attributes["output.value"].startswith("update_state(")
    everything = str([dict(s.attributes) for s in spans])
    assert SECRET not in everything

    provider, exporter = _memory_provider()
    export_trace(fapp.observe.trace(second), tracer_provider=provider, capture_content=True)
    back = exporter.get_finished_spans()
    login = next(s for s in back if s.name == "execute_tool login")
    assert "[REDACTED]" in login.attributes["input.value"] and SECRET not in str(back[0].attributes)


async def test_unfinished_steps_and_runs_are_not_exported(fapp: ms.App) -> None:
    provider, exporter = _memory_provider()

    def down() -> None:
        raise ConnectionError("down")

    @fapp.workflow
    async def stuck(ctx: ms.RunContext) -> None:
        await ctx.step(lambda: 1, name="first")
        await ctx.step(down, retry=ms.RetryPolicy(max_attempts=5, initial_s=3600.0))

    run_id = fapp.submit(stuck).run_id
    await drain(fapp)
    assert fapp.get_run(run_id).status == "sleeping"  # backing off before attempt 2
    export_trace(fapp.observe.trace(run_id), tracer_provider=provider)
    assert [s.name for s in exporter.get_finished_spans()] == ["step first"]


async def test_spans_carry_the_logical_model_never_the_url(
    fapp: ms.App, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mainspring.agent._call as call_module

    provider, exporter = _memory_provider()
    fapp.observe.enable_tracing(provider)
    model = ScriptedModel([_reply(call("finish", {"answer": "ok"}), 10, 1)])
    model.provider, model.model_id = "openai", "gpt-4.1"
    # an older journal's name: the endpoint URL (with credentials) after "@"
    monkeypatch.setattr(
        call_module,
        "model_step_name",
        lambda p, m: f"model:{p}:{m}@http://user:hunter2@proxy.internal/v1",
    )
    agent = fapp.agent("u", model=model, instructions="x")
    await fapp.run(agent, "hi")
    run_id = fapp.list_runs()[0].id
    export_trace(fapp.observe.trace(run_id), tracer_provider=provider)
    spans = exporter.get_finished_spans()
    chats = [s for s in spans if s.name.startswith("chat")]
    assert {s.name for s in chats} == {"chat gpt-4.1"} and len(chats) == 2
    assert chats[0].attributes["gen_ai.provider.name"] == "openai"
    for s in spans:
        text = s.name + str(dict(s.attributes or {}))
        assert "hunter2" not in text and "proxy.internal" not in text, text
    families = _families(fapp)
    assert "hunter2" not in str([f.samples for f in families.values()])


async def test_tracing_without_an_exporter_says_so_once(
    fapp: ms.App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    from mainspring.observability import _setup

    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.setattr(_setup, "_warned", threading.Event())  # a fresh process

    @fapp.workflow
    async def one(ctx: ms.RunContext) -> int:
        return await ctx.step(lambda: 1, name="one")

    with caplog.at_level("WARNING", logger="mainspring.observability"):
        fapp.observe.enable_tracing()
        await fapp.run(one)
        export_trace(fapp.observe.trace(fapp.list_runs()[0].id))  # no provider: not silent either
        fapp.observe.enable_tracing()
    said = [r.message for r in caplog.records if "spans go nowhere" in r.message]
    assert len(said) == 1, said


# -- fork and retry --------------------------------------------------------------------


def _ledger_app(app: ms.App, ledger: EffectLedger, fail: dict[str, bool]) -> Any:
    async def charge(n: int) -> int:
        ledger.apply(ms.current_step().idempotency_key, "charge", {"n": n})
        if fail.get(f"charge{n}"):
            raise ValueError(f"card {n} declined")
        return n * 10

    @app.workflow
    async def billing(ctx: ms.RunContext, count: int) -> list[int]:
        return [
            await ctx.step(charge, i, name=f"charge{i}", retry=ms.RetryPolicy.never())
            for i in range(count)
        ]

    return billing


async def test_retry_resumes_from_the_failing_step(fapp: ms.App, tmp_path: Path) -> None:
    ledger = EffectLedger(tmp_path / "ledger.db")
    fail = {"charge2": True}
    billing = _ledger_app(fapp, ledger, fail)
    run_id = fapp.submit(billing, 4).run_id
    await drain(fapp)
    assert fapp.get_run(run_id).status == "failed"
    assert ledger.report().calls == 3
    fail.clear()
    handle = fapp.retry(run_id)
    assert handle.run_id == run_id and fapp.get_run(run_id).status == "queued"
    await drain(fapp)
    assert await fapp.result(run_id) == [0, 10, 20, 30]
    report = ledger.report()
    # charge0 and charge1 never ran again; charge2 ran again under the same key.
    assert report.calls == 5
    assert report.duplicate_calls == {f"{run_id}:0:2": 2}
    with pytest.raises(ms.RunConflict, match="only a failed run"):
        fapp.retry(run_id)
    with pytest.raises(ms.RunNotFound):
        fapp.retry("nope")


async def test_fork_replays_up_to_the_step_and_runs_live_after(
    fapp: ms.App, tmp_path: Path
) -> None:
    ledger = EffectLedger(tmp_path / "ledger.db")
    billing = _ledger_app(fapp, ledger, {})
    source = fapp.submit(billing, 4).run_id
    await drain(fapp)
    assert ledger.report().calls == 4
    fork = fapp.fork(source, from_step=1, edit=99)
    assert fork.run_id != source
    await drain(fapp)
    assert await fapp.result(fork.run_id) == [0, 99, 20, 30]
    report = ledger.report()
    assert report.calls == 6  # only charge2 and charge3 ran live in the fork
    assert {k for k in report.duplicate_calls} == set()
    assert [s.name for s in fapp.observe.steps(fork.run_id)] == [
        "charge0",
        "charge1",
        "charge2",
        "charge3",
    ]


async def test_fork_and_retry_refuse_bad_input(fapp: ms.App, tmp_path: Path) -> None:
    billing = _ledger_app(fapp, EffectLedger(tmp_path / "l.db"), {})
    source = fapp.submit(billing, 2).run_id
    await drain(fapp)
    before = len(fapp.list_runs())
    with pytest.raises(ms.ConfigError, match=r"has no step 0:7 .*steps 0\.\.1"):
        fapp.fork(source, from_step=7)
    with pytest.raises(ms.ConfigError, match="session:seq"):
        fapp.fork(source, from_step="x")
    with pytest.raises(ms.ConfigError, match="only session 0"):
        fapp.fork(source, from_step="3:0")
    with pytest.raises(ms.RunNotFound):
        fapp.fork("nope", from_step=0)
    with pytest.raises(ms.RunConflict, match="succeeded"):
        fapp.retry(source)
    assert len(fapp.list_runs()) == before


async def test_list_runs_filters(fapp: ms.App, clock: FakeClock) -> None:
    @fapp.workflow
    async def echo(ctx: ms.RunContext, text: str) -> str:
        return text

    fapp.submit(echo, "Printer_on fire", key="k-1")
    clock.advance(100)
    late = fapp.submit(echo, "all 100% fine").run_id
    assert [r.id for r in fapp.list_runs(since=clock.now() - 1)] == [late]
    assert len(fapp.list_runs(search="printer_ON")) == 1
    assert [r.id for r in fapp.list_runs(search="100%")] == [late]
    assert fapp.list_runs(search="_x%") == []
    assert len(fapp.list_runs(search="K-1")) == 1


async def test_the_trace_shows_the_arguments_that_ran_after_a_repair(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'repair.db'}")

    @app.tool
    def record(item: int) -> dict[str, int]:
        """Record an item."""
        return {"recorded": item + 4}

    model = ScriptedModel(
        [
            call("record", {"item": "fifty"}),  # not an int: handed back for repair
            call("record", {"item": 50}),
            call("finish", {"answer": "done"}),
        ]
    )
    agent = app.agent("recorder", model=model, instructions="Record 50.", tools=[record])
    await app.run(agent, "go")
    [run] = app.list_runs()
    [tool] = [e for e in app.observe.trace(run.id).entries if e.kind == "tool"]
    assert (tool.input_summary, tool.output_summary) == ('{"item": 50}', '{"recorded":54}')
    app.close()
