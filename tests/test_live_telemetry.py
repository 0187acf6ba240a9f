"""End to end with real worker processes: live OTLP export started with `--otel` or by
the standard `OTEL_*` variables alone (and `--no-otel`, and the extra missing), and the
counters a worker serves on `--metrics-port`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

import mainspring as ms

ROOT = Path(__file__).resolve().parent.parent

APP = """
import mainspring as ms

app = ms.App({url!r})


@app.workflow
async def order(ctx: ms.RunContext) -> str:
    await ctx.step(lambda: "paid", name="pay")
    await ctx.wait_for("shipped")
    return await ctx.step(lambda: "done", name="close")
"""


class _Receiver:
    """An OTLP/HTTP trace receiver: what a collector, Jaeger or Phoenix would get."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        for span in ss.spans:
                            receiver.spans.append(
                                {
                                    "path": self.path,
                                    "name": span.name,
                                    "trace_id": span.trace_id.hex(),
                                    "span_id": span.span_id.hex(),
                                    "parent": span.parent_span_id.hex(),
                                    "status": span.status.code,
                                    "attributes": {
                                        kv.key: getattr(kv.value, kv.value.WhichOneof("value"))
                                        for kv in span.attributes
                                        if kv.value.WhichOneof("value") != "array_value"
                                    },
                                }
                            )
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver()
    yield r
    r.close()


def _worker(tmp_path: Path, endpoint: str) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "orders",
    }
    done = subprocess.run(
        [sys.executable, "-m", "mainspring", "worker", "liveapp:app", "--otel", "--until-idle"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_worker_process_exports_spans_over_otlp_while_the_run_is_unfinished(
    tmp_path: Path, receiver: _Receiver
) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    (tmp_path / "liveapp.py").write_text(textwrap.dedent(APP.format(url=url)))
    app = ms.App(url)

    @app.workflow
    async def order(ctx: ms.RunContext) -> str:  # the same workflow, to submit it
        raise AssertionError("executed by the worker process only")

    run_id = app.submit(order).run_id
    _worker(tmp_path, receiver.url)
    assert app.get_run(run_id).status == "waiting"
    # The run is unfinished, and its first step is already in the receiver, beside
    # the root that lists the run in a trace view while it runs.
    assert sorted((s["path"], s["name"]) for s in receiver.spans) == [
        ("/v1/traces", "step pay"),
        ("/v1/traces", "workflow order (started)"),
    ]
    (pay,) = [s for s in receiver.spans if s["name"] == "step pay"]
    app.signal(run_id, "shipped")
    _worker(tmp_path, receiver.url)
    assert app.get_run(run_id).status == "succeeded"
    names = sorted(s["name"] for s in receiver.spans)
    assert names == [
        "signal shipped",
        "step close",
        "step pay",
        "workflow order",
        "workflow order (started)",
    ]
    (root,) = [s for s in receiver.spans if s["name"] == "workflow order"]
    # two processes, one trace: ids derive from the run
    assert {s["trace_id"] for s in receiver.spans} == {pay["trace_id"]}
    assert pay["parent"] == root["span_id"] and root["parent"] == ""
    assert root["status"] == 1  # STATUS_CODE_OK
    app.close()


FAMILY_APP = """
import mainspring as ms

app = ms.App({url!r})


@app.workflow
async def kid(ctx: ms.RunContext, n: int) -> int:
    return await ctx.step(lambda: n * 2, name="double")


@app.workflow
async def family(ctx: ms.RunContext) -> int:
    return await ctx.child(kid, 20) + 1
"""


def test_a_parent_and_its_child_export_one_complete_tree_over_otlp(
    tmp_path: Path, receiver: _Receiver
) -> None:
    """Live export of a child run: one trace for the family, no span whose parent the
    receiver never got, and the child's run span under the parent's starting step."""
    url = f"sqlite:///{tmp_path / 'family.db'}"
    (tmp_path / "familyapp.py").write_text(textwrap.dedent(FAMILY_APP.format(url=url)))
    app = ms.App(url)

    @app.workflow
    async def family(ctx: ms.RunContext) -> int:  # the same workflow, to submit it
        raise AssertionError("executed by the worker process only")

    run_id = app.submit(family).run_id
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
    }
    cmd = [sys.executable, "-m", "mainspring", "worker", "familyapp:app", "--otel"]
    done = subprocess.run(
        [*cmd, "--until-idle"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert app.get_run(run_id).status == "succeeded"
    app.close()
    spans = {s["span_id"]: s for s in receiver.spans}
    names = sorted(s["name"] for s in spans.values())
    assert names == [
        "signal child:" + names[0].split("child:")[-1],  # the parent's wait for the child
        "step child:kid",
        "step double",
        "workflow family",
        "workflow family (started)",
        "workflow kid",
        "workflow kid (started)",
    ]
    assert len({s["trace_id"] for s in spans.values()}) == 1
    orphans = [s["name"] for s in spans.values() if s["parent"] and s["parent"] not in spans]
    assert orphans == []
    (start,) = [s for s in spans.values() if s["name"] == "step child:kid"]
    (kid_root,) = [s for s in spans.values() if s["name"] == "workflow kid"]
    assert kid_root["parent"] == start["span_id"]


BLOCKING_APP = """
import pathlib
import time

import mainspring as ms

app = ms.App({url!r})


@app.workflow
async def slow(ctx: ms.RunContext) -> str:
    def wait_for_file() -> str:
        gate = pathlib.Path({gate!r})
        while not gate.exists():  # the test scrapes meanwhile, then opens the gate
            time.sleep(0.02)
        return "ok"

    return await ctx.step(wait_for_file, name="gate")
"""


def test_worker_metrics_port_serves_its_counters_while_it_runs(tmp_path: Path) -> None:
    import socket
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    url = f"sqlite:///{tmp_path / 'm.db'}"
    gate = tmp_path / "gate"
    (tmp_path / "slowapp.py").write_text(BLOCKING_APP.format(url=url, gate=str(gate)))
    app = ms.App(url)

    @app.workflow
    async def slow(ctx: ms.RunContext) -> str:
        raise AssertionError("executed by the worker process only")

    run_id = app.submit(slow).run_id
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    cmd = [sys.executable, "-m", "mainspring", "worker", "slowapp:app", "--until-idle"]
    proc = subprocess.Popen(
        [*cmd, "--concurrency", "2", "--metrics-port", str(port)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        body = ""
        while time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
                body = body.decode()
            except OSError:
                time.sleep(0.05)
                continue
            if "mainspring_worker_active_runs 1.0" in body:
                break
            time.sleep(0.05)
        families = {f.name: f for f in text_string_to_metric_families(body)}
        assert families["mainspring_worker_active_runs"].samples[0].value == 1
        assert families["mainspring_worker_concurrency"].samples[0].value == 2
        claimed = families["mainspring_runs_claimed"].samples
        assert [(s.labels, s.value) for s in claimed] == [({"workflow": "slow"}, 1.0)]
        assert "mainspring_runs" not in families  # store-wide gauges are the server's
        assert app.get_run(run_id).status == "running"
        gate.touch()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert app.get_run(run_id).status == "succeeded"
    app.close()


GATED_APP = """
import pathlib
import time

import mainspring as ms

app = ms.App({url!r})


@app.workflow
async def order(ctx: ms.RunContext) -> str:
    await ctx.step(lambda: "paid", name="pay")

    def wait_for_gate() -> str:
        gate = pathlib.Path({gate!r})
        while not gate.exists():  # the test watches the receiver meanwhile
            time.sleep(0.02)
        return "shipped"

    return await ctx.step(wait_for_gate, name="ship")
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return {**env, **extra}


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_the_otel_variables_alone_make_a_worker_export_live(
    tmp_path: Path, receiver: _Receiver
) -> None:
    """No --otel and no code: OTEL_EXPORTER_OTLP_ENDPOINT is enough, and the spans
    arrive while the run is still running."""
    url = f"sqlite:///{tmp_path / 'env.db'}"
    gate = tmp_path / "gate"
    (tmp_path / "envapp.py").write_text(GATED_APP.format(url=url, gate=str(gate)))
    app = ms.App(url)

    @app.workflow
    async def order(ctx: ms.RunContext) -> str:
        raise AssertionError("executed by the worker process only")

    run_id = app.submit(order).run_id
    env = _env(
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_SERVICE_NAME="orders",
        OTEL_BSP_SCHEDULE_DELAY="50",  # the batch processor's standard knob, in ms
    )
    cmd = [sys.executable, "-m", "mainspring", "worker", "envapp:app", "--until-idle"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        _until(lambda: len(receiver.spans) >= 2, "the first spans")
        assert sorted(s["name"] for s in receiver.spans) == [
            "step pay",
            "workflow order (started)",
        ]
        assert app.get_run(run_id).status == "running"  # live: the run is not over
        gate.touch()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert app.get_run(run_id).status == "succeeded"
    assert sorted(s["name"] for s in receiver.spans) == [
        "step pay",
        "step ship",
        "workflow order",
        "workflow order (started)",
    ]
    said = [line for line in err.splitlines() if "live spans go" in line]
    assert len(said) == 1, err  # where the spans go, said once
    assert f"over OTLP/HTTP to {receiver.url}/v1/traces" in said[0]
    app.close()


def test_no_otel_turns_the_environment_off_and_a_missing_extra_is_said_once(
    tmp_path: Path, receiver: _Receiver
) -> None:
    url = f"sqlite:///{tmp_path / 'off.db'}"
    (tmp_path / "offapp.py").write_text(textwrap.dedent(FAMILY_APP.format(url=url)))
    app = ms.App(url)

    @app.workflow
    async def kid(ctx: ms.RunContext, n: int) -> int:
        raise AssertionError("executed by the worker process only")

    cmd = [sys.executable, "-m", "mainspring", "worker", "offapp:app", "--until-idle"]
    env = _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_BSP_SCHEDULE_DELAY="50")
    first = app.submit(kid, 1).run_id
    done = subprocess.run([*cmd, "--no-otel"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert app.get_run(first).status == "succeeded"
    assert receiver.spans == []  # --no-otel wins over the environment
    assert "OpenTelemetry" not in done.stderr

    # The same environment without the [otel] extra: said once, and the runs still run.
    shadow = tmp_path / "no_otel"
    (shadow / "opentelemetry").mkdir(parents=True)
    (shadow / "opentelemetry" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'opentelemetry'\", name='opentelemetry')\n"
    )
    env["PYTHONPATH"] = os.pathsep.join([str(shadow), env["PYTHONPATH"]])
    runs = [app.submit(kid, n).run_id for n in (2, 3)]
    done = subprocess.run(
        [*cmd, "--concurrency", "1"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert [app.get_run(r).status for r in runs] == ["succeeded", "succeeded"]
    said = [line for line in done.stderr.splitlines() if "OpenTelemetry" in line]
    assert len(said) == 1, done.stderr
    assert f"over OTLP/HTTP to {receiver.url}/v1/traces" in said[0]
    assert "pip install 'mainspring[otel]'" in said[0]
    assert receiver.spans == []
    app.close()


def test_serve_with_a_worker_exports_from_the_environment_too(
    tmp_path: Path, receiver: _Receiver
) -> None:
    import signal
    import socket

    url = f"sqlite:///{tmp_path / 'serve.db'}"
    gate = tmp_path / "gate"
    (tmp_path / "serveapp.py").write_text(GATED_APP.format(url=url, gate=str(gate)))
    app = ms.App(url)

    @app.workflow
    async def order(ctx: ms.RunContext) -> str:
        raise AssertionError("executed by the server's worker only")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_BSP_SCHEDULE_DELAY="50")
    cmd = [sys.executable, "-m", "mainspring", "serve", "serveapp:app", "--worker"]
    proc = subprocess.Popen([*cmd, "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        run_id = app.submit(order).run_id
        _until(lambda: bool(receiver.spans), "the first span")
        assert app.get_run(run_id).status == "running"
        gate.touch()
        _until(lambda: app.get_run(run_id).status == "succeeded", "the run to end")
        _until(lambda: len(receiver.spans) == 4, "the root span")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sorted(s["name"] for s in receiver.spans) == [
        "step pay",
        "step ship",
        "workflow order",
        "workflow order (started)",
    ]
    assert len([line for line in err.splitlines() if "live spans go" in line]) == 1, err
    app.close()
