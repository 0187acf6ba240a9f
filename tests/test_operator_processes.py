"""What an operator sees across a worker's SIGKILL, with real worker processes: the
counters a replacement serves before and after it takes runs over, the spans of the
dead worker's last steps, and runs that are not over yet in the trace list."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")

from prometheus_client.openmetrics.parser import text_string_to_metric_families
from test_live_telemetry import _Receiver

import mainspring as ms
from mainspring.observability._spans import span_id_of

ROOT = Path(__file__).resolve().parent.parent

GATED = """
import pathlib
import time

import mainspring as ms

app = ms.App({url!r})


@app.workflow
async def order(ctx: ms.RunContext, n: int) -> str:
    for i in range({quick}):
        await ctx.step(lambda i=i: i, name=f"prepare{{i}}")

    def wait_for_gate() -> str:
        gate = pathlib.Path({gate!r})
        while not gate.exists():  # the test kills the worker meanwhile
            time.sleep(0.02)
        return "shipped"

    return await ctx.step(wait_for_gate, name="ship")
"""


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver()
    yield r
    r.close()


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return {**env, **extra}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, labels): value}`` of a worker's /metrics, asked for as
    OpenMetrics (what Prometheus asks for)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
        body = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def _up(port: int) -> bool:
    try:
        _scrape(port)
    except OSError:
        return False
    return True


def _increase(samples: list[float]) -> float:
    """Prometheus's ``increase()`` over successive scrapes of one series, without its
    extrapolation: each rise, and after a reset (a restart) the whole new value."""
    total = 0.0
    for before, after in itertools.pairwise(samples):
        total += after - before if after >= before else after
    return total


def _submit(tmp_path: Path, quick: int, runs: int) -> tuple[ms.App, list[str], Path, str]:
    url = f"sqlite:///{tmp_path / 'op.db'}"
    gate = tmp_path / "gate"
    (tmp_path / "opapp.py").write_text(
        textwrap.dedent(GATED.format(url=url, gate=str(gate), quick=quick))
    )
    app = ms.App(url)

    @app.workflow
    async def order(ctx: ms.RunContext, n: int) -> str:  # the same workflow, to submit it
        raise AssertionError("executed by the worker processes only")

    return app, [app.submit(order, n).run_id for n in range(runs)], gate, url


WORKER = [sys.executable, "-m", "mainspring", "worker", "opapp:app", "--lease-s", "2"]


def test_takeovers_after_a_sigkill_read_in_full_across_the_restart(tmp_path: Path) -> None:
    """Worker A holds 4 runs and is killed; worker B, scraped before and after it
    takes them over, reports every takeover counter from 0 (with its _created), so
    increase() over its scrapes reads 4, not 0."""
    app, runs, gate, _ = _submit(tmp_path, quick=1, runs=4)
    env = _env(tmp_path)
    port_a, port_b = _port(), _port()
    a = subprocess.Popen(
        [*WORKER, "--concurrency", "4", "--metrics-port", str(port_a)],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    b: subprocess.Popen[bytes] | None = None
    try:
        _until(lambda: all(app.get_run(r).status == "running" for r in runs), "A to hold 4 runs")
        _until(lambda: _up(port_a), "A's /metrics")
        takeover = ("mainspring_lease_takeovers_total", (("workflow", "order"),))
        created = ("mainspring_lease_takeovers_created", (("workflow", "order"),))
        before = _scrape(port_a)
        assert before[("mainspring_runs_claimed_total", (("workflow", "order"),))] == 4
        assert before[takeover] == 0
        # B starts while A lives: a standby, holding nothing yet
        b = subprocess.Popen(
            [*WORKER, "--concurrency", "4", "--metrics-port", str(port_b)],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        _until(lambda: _up(port_b), "B's /metrics")
        first = _scrape(port_b)
        # Born at 0 with the process, before any event: dead letters, takeovers, 429s.
        assert first[takeover] == 0
        assert first[("mainspring_dead_letters_total", (("workflow", "order"),))] == 0
        assert (
            first[("mainspring_runs_finished_total", (("status", "failed"), ("workflow", "order")))]
            == 0
        )
        assert first[created] > 0  # OpenMetrics _created: when B started counting
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
        _until(lambda: _scrape(port_b)[takeover] == 4, "B to take the 4 runs over")
        after = _scrape(port_b)
        assert after[created] == first[created]
        series = [before[takeover], first[takeover], after[takeover]]
        assert _increase(series[1:]) == 4  # B's own series: 0, then 4
        gate.touch()
        _until(lambda: all(app.get_run(r).status == "succeeded" for r in runs), "the runs to end")
        done = _scrape(port_b)
        assert (
            done[
                ("mainspring_runs_finished_total", (("status", "succeeded"), ("workflow", "order")))
            ]
            == 4
        )
        assert done[takeover] == 4
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    app.close()


def _step_spans(receiver: _Receiver, run_id: str) -> list[dict[str, Any]]:
    return [s for s in receiver.spans if s["attributes"].get("session.id") == run_id]


def test_a_takeover_exports_the_spans_the_killed_worker_never_sent(
    tmp_path: Path, receiver: _Receiver
) -> None:
    """A batches spans for 10 s and is SIGKILLed 8 steps into a run: those spans die
    with it. B takes the run over and re-sends them: the receiver ends with one span
    per journal step, each once."""
    quick = 8
    app, (run_id,), gate, _ = _submit(tmp_path, quick=quick, runs=1)
    env = _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_BSP_SCHEDULE_DELAY="10000")
    a = subprocess.Popen([*WORKER, "--otel"], env=env, stderr=subprocess.DEVNULL)
    try:
        done = lambda: sum(  # noqa: E731
            1 for s in app.observe.steps(run_id) if s.status == "completed"
        )
        _until(lambda: done() == quick, "A to journal the quick steps")
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    _until(lambda: (app.get_run(run_id).lease_until or 0) < time.time(), "A's lease to lapse")
    lost = len(_step_spans(receiver, run_id))
    assert lost == 0  # the 10 s batch was still in A when it died
    gate.touch()
    b = subprocess.run(
        [*WORKER, "--otel", "--until-idle"], env=env, capture_output=True, text=True, timeout=90
    )
    assert b.returncode == 0, b.stderr
    assert app.get_run(run_id).status == "succeeded"
    journal = [s for s in app.observe.steps(run_id) if s.kind == "step"]
    assert len(journal) == quick + 1
    spans = _step_spans(receiver, run_id)
    steps = [s for s in spans if s["name"].startswith("step ")]
    expected = {f"{span_id_of(run_id, f'{r.session}:{r.seq}:{r.attempt}'):016x}" for r in journal}
    assert {s["span_id"] for s in steps} == expected  # every journal step, and no other
    assert len(steps) == len(journal)  # each once: no duplicates
    roots = sorted(s["name"] for s in spans if s["parent"] == "")
    assert roots == ["workflow order", "workflow order (started)"]
    assert len({s["span_id"] for s in spans}) == len(spans)
    assert len({s["trace_id"] for s in spans}) == 1
    app.close()


NAPPING = """
import mainspring as ms

app = ms.App({url!r})


@app.workflow
async def nap(ctx: ms.RunContext) -> str:
    await ctx.step(lambda: "read", name="read")
    await ctx.sleep(3600)
    return "rested"


@app.workflow
async def approve(ctx: ms.RunContext) -> str:
    await ctx.step(lambda: "drafted", name="draft")
    await ctx.wait_for("approved")
    return "sent"
"""


def test_sleeping_and_waiting_runs_are_in_the_trace_list_before_they_end(
    tmp_path: Path, receiver: _Receiver
) -> None:
    url = f"sqlite:///{tmp_path / 'nap.db'}"
    (tmp_path / "napapp.py").write_text(textwrap.dedent(NAPPING.format(url=url)))
    app = ms.App(url)

    @app.workflow
    async def nap(ctx: ms.RunContext) -> str:
        raise AssertionError("executed by the worker process only")

    @app.workflow
    async def approve(ctx: ms.RunContext) -> str:
        raise AssertionError("executed by the worker process only")

    sleeping, waiting = app.submit(nap).run_id, app.submit(approve).run_id
    env = _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url)
    cmd = [sys.executable, "-m", "mainspring", "worker", "napapp:app", "--until-idle"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert app.get_run(sleeping).status == "sleeping"
    assert app.get_run(waiting).status == "waiting"
    # A trace list (Phoenix, Jaeger, Langfuse) shows the traces whose root it has.
    roots = {s["attributes"]["mainspring.run.id"]: s for s in receiver.spans if s["parent"] == ""}
    assert set(roots) == {sleeping, waiting}
    assert roots[sleeping]["name"] == "workflow nap (started)"
    assert roots[waiting]["attributes"]["mainspring.run.status"] == "running"
    for run_id, step in ((sleeping, "step read"), (waiting, "step draft")):
        (span,) = [s for s in _step_spans(receiver, run_id) if s["name"] == step]
        assert span["trace_id"] == roots[run_id]["trace_id"]  # the listed trace holds them
    app.close()
