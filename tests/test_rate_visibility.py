"""Every 429 and every rate-limit wait is visible: in the journal, the trace, ``show``
(text and JSON) and the metrics (this process's counter and the store-wide gauges a
server with only ``--db`` serves), and each place counts what the provider sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _helpers import drain
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.models import OpenAIModel, Usage
from mainspring.observability import MetricsCollector, build_trace
from mainspring.server import create_app
from mainspring.testing import FakeClock, FakeOpenAIServer

NOW = 1_767_225_600.0
MODEL = "openai:gpt-4.1-mini"


def _gauges(body: bytes) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("model", "")): s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
        if "rate_limit" in s.name
    }


async def test_429s_and_rate_waits_are_counted_alike_everywhere(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'rate.db'}"
    clock = FakeClock(NOW)
    # The provider allows one request a minute: the second and third runs are refused
    # (the fake's real 429, with its retry-after) until the clock moves on.
    with FakeOpenAIServer(rpm=1, tpm=1_000_000, period_s=60, clock=clock.now) as server:
        usage = Usage(input_tokens=10, output_tokens=2)
        server.script([server.tool_call("finish", {"answer": "ok"}, usage=usage)] * 3)
        model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="sk-test")
        # No limiter (it would learn the limit from the headers and never be refused):
        # the 429s themselves are what is counted here.
        app = ms.App(db, clock=clock, poll_interval_s=0.01, inline_wait_s=0.0, rate_limits=False)
        try:
            agent = app.agent("a", model=model, instructions="x")
            ids = [app.submit(agent, f"q{i}").run_id for i in range(3)]
            for _ in range(20):
                await drain(app)
                runs = [app.get_run(r) for r in ids]
                if all(r.status == "succeeded" for r in runs):
                    break
                asleep = [r for r in runs if r.status == "sleeping"]
                assert asleep and all(r.wait_reason == "rate_limit" for r in asleep)
                clock.advance(61)
            else:
                raise AssertionError("the runs never finished")
            refused = server.too_many_requests
            assert refused >= 2  # the test means something: the provider did refuse
            # The journal: each 429 is a failed model step, then a rate:wait step.
            rows = [s for r in ids for s in app.observe.steps(r)]
            failed = [s for s in rows if s.name == f"model:{MODEL}" and s.status == "failed"]
            assert len(failed) == refused
            assert all("RateLimited" in (s.error or "") for s in failed)
            waits = [s for s in rows if s.name == f"rate:wait:{MODEL}"]
            assert len(waits) == refused
            # The trace, as an API and as `mainspring trace --json`.
            traces = [build_trace(app.get_run(r), app.observe.steps(r)) for r in ids]
            assert sum(t.rate_limited for t in traces) == refused
            assert sum(t.rate_waits for t in traces) == refused
            waited = sum(t.rate_wait_s for t in traces)
            assert waited >= 30 * refused  # each waited the retry-after it was given
            # This process's counter, and the store-wide gauges of a server with --db.
            live = _gauges(app.observe.metrics().render()[0])
            assert live[("mainspring_rate_limited_total", MODEL)] == refused
            # The dashboard's run page.
            pages = _dashboard(app, ids)
            assert sum(p.count('<span class="error">429</span>') for p in pages) == refused
            assert sum(p.count('id="rate-limit"') for p in pages) >= 1
            await model.aclose()
        finally:
            app.close()
    served = _gauges(MetricsCollector(ms.App(db).store).render()[0])
    assert served[("mainspring_store_rate_limited", MODEL)] == refused
    assert served[("mainspring_store_rate_limit_waits", MODEL)] == refused
    assert abs(served[("mainspring_store_rate_limit_wait_seconds", MODEL)] - waited) < 1e-6
    # The CLI with only --db: trace (text and JSON) and show (text and JSON).
    cli_refused = cli_waits = 0
    for run_id in ids:
        out: Any = json.loads(_cli("trace", run_id, "--db", db, "--json"))
        cli_refused += out["totals"]["rate_limited"]
        cli_waits += out["totals"]["rate_waits"]
        shown = json.loads(_cli("show", run_id, "--db", db, "--json"))["run"]["rate_limit"]
        assert (shown["refused"], shown["waits"]) == (
            out["totals"]["rate_limited"],
            out["totals"]["rate_waits"],
        )
        if shown["refused"]:
            text = _cli("show", run_id, "--db", db)
            assert f"{shown['refused']} refused (429)" in text
            assert "429 (no attempt spent)" in _cli("trace", run_id, "--db", db)
    assert (cli_refused, cli_waits) == (refused, refused)


def _dashboard(app: ms.App, ids: list[str]) -> list[str]:
    _, admin = app.store.create_api_key("ops", ["admin"], app.clock.now())
    with TestClient(create_app(app, webhooks=False)) as client:
        r = client.post(
            "/ui/login",
            content=f"key={admin}",
            headers={
                "Origin": "http://testserver",
                "Content-Type": "application/x-www-form-urlencoded",
            },
            follow_redirects=False,
        )
        assert r.status_code in (302, 303), r.text
        return [client.get(f"/ui/runs/{run_id}").text for run_id in ids]


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.output
