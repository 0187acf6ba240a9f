"""The HTTP API over real HTTP on 127.0.0.1: a `mainspring serve` process, worker
processes stopped and started, SSE followed and resumed, keys and scopes."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from _stack import Stack, until

import mainspring as ms


def _run(c: httpx.Client, run_id: str) -> dict[str, Any]:
    response = c.get(f"/runs/{run_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_approval_over_http_resumes_on_another_worker_process(stack: Stack) -> None:
    stack.serve("--no-worker", "--no-webhooks")
    ops, ana = stack.client(stack.admin), stack.client(stack.reviewer)
    response = ops.post("/runs", json={"workflow": "deploy", "args": ["prod"]})
    assert response.status_code == 202, response.text
    run_id = response.json()["id"]
    assert response.headers["location"] == f"/runs/{run_id}"

    first = stack.spawn("worker-a", "worker", "apps.hitl_app:app")
    # The request is pending from the wait's first commit; the run is "running" while
    # it waits inline for a quick answer, then "waiting" once it suspends.
    waiting = until(
        lambda: (r := _run(ops, run_id))["pending_requests"] and r["status"] == "waiting" and r,
        "the approval request, the run suspended",
    )
    assert waiting["wait_reason"] == "signal:approval:deploy"
    [request] = waiting["pending_requests"]
    assert request["id"] == "approval:deploy" and request["preview"]["env"] == "prod"
    assert request["url"] == f"/runs/{run_id}/requests/approval:deploy"
    first.send_signal(signal.SIGTERM)  # the worker goes away; the run stays waiting
    assert first.wait(20) == 0, stack.log("worker-a")
    assert _run(ops, run_id)["status"] == "waiting"

    assert ana.post(request["url"], json={"decision": "approve"}).status_code == 200
    again = ana.post(request["url"], json={"decision": "approve"})
    assert again.status_code == 409 and "already answered" in again.json()["error"]["message"]

    second = stack.spawn("worker-b", "worker", "apps.hitl_app:app")
    done = until(lambda: (r := _run(ops, run_id))["status"] == "succeeded" and r, "the run")
    assert done["output"] == f"ship by {second.pid}, approved by ana"
    with sqlite3.connect(stack.tmp / "ledger.db") as conn:
        effects = dict(conn.execute("SELECT effect, CAST(payload AS INTEGER) FROM effects"))
    assert effects == {"build": first.pid, "ship": second.pid}  # each by its worker
    report = stack.ledger.report()
    assert (report.calls, report.duplicate_effects) == (2, {})  # each once
    finished = ana.post(request["url"], json={"decision": "approve"})
    assert (
        finished.status_code == 409 and "already succeeded" in finished.json()["error"]["message"]
    )


def test_signal_before_wait_is_consumed_and_finished_runs_refuse_steering(stack: Stack) -> None:
    stack.serve("--no-webhooks", "--worker")
    ops = stack.client(stack.admin)
    early = ops.post("/runs", json={"workflow": "steps_then_wait", "args": [0, 0]}).json()["id"]
    sent = ops.post(f"/runs/{early}/signals", json={"name": "go", "payload": 7})
    assert sent.status_code == 202 and sent.json()["signal_id"] > 0
    done = until(lambda: (r := _run(ops, early))["status"] == "succeeded" and r, "the run")
    assert done["output"] == 7

    queued = ops.post("/runs", json={"workflow": "deploy", "args": ["x"]}).json()["id"]
    cancel = ops.post(f"/runs/{queued}/cancel", json={"reason": "wrong env"})
    until(lambda: _run(ops, queued)["status"] == "cancelled", "the cancellation")
    assert cancel.status_code == 202
    for path, body in (
        (f"/runs/{queued}/signals", {"name": "go"}),
        (f"/runs/{queued}/requests/approval:deploy", {"decision": "approve"}),
        (f"/runs/{queued}/cancel", {}),
    ):
        refused = ops.post(path, json=body)
        assert refused.status_code == 409, (path, refused.text)
        assert "cancelled" in refused.json()["error"]["message"]
    missing = ops.post("/runs/nope/signals", json={"name": "go"})
    assert missing.status_code == 404 and "no run 'nope'" in missing.json()["error"]["message"]


def _events(
    response: httpx.Response, stop: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """Parse an SSE stream until ``stop(event)`` is true (or it ends)."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for line in response.iter_lines():
        if line == "":
            if "event" in current:
                current["data"] = json.loads(current["data"])
                events.append(current)
                if stop(current):
                    break
            current = {}
        elif not line.startswith(":") and ":" in line:
            field, _, value = line.partition(":")
            current[field] = value.removeprefix(" ")
    return events


def test_sse_shows_every_step_and_resumes_from_last_event_id(stack: Stack) -> None:
    stack.serve("--no-webhooks", "--worker")
    ops = stack.client(stack.admin)
    run_id = ops.post("/runs", json={"workflow": "steps_then_wait", "args": [5, 4]}).json()["id"]
    with ops.stream("GET", f"/runs/{run_id}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        first = _events(
            stream, lambda e: e["event"] == "status" and e["data"]["status"] == "waiting"
        )
    steps = [e["data"] for e in first if e["event"] == "step"]
    assert [s["name"] for s in steps if s["status"] == "completed"] == [
        f"before-{i}" for i in range(5)
    ]
    last_id = first[-1]["id"]

    ops.post(f"/runs/{run_id}/signals", json={"name": "go", "payload": 1})
    with ops.stream("GET", f"/runs/{run_id}/events", headers={"Last-Event-ID": last_id}) as stream:
        rest = _events(stream, lambda e: e["event"] == "end")
    later = [e["data"] for e in rest if e["event"] == "step" and e["data"]["status"] == "completed"]
    # Nothing before the reconnect is sent again; everything after it is there, in order.
    assert [s["name"] for s in later] == ["go"] + [f"after-{i}" for i in range(4)]
    statuses = [e["data"]["status"] for e in rest if e["event"] == "status"]
    assert statuses[-1] == "succeeded" and rest[-1]["event"] == "end"
    done = [(s["session"], s["seq"]) for s in steps + later if s["status"] == "completed"]
    assert len(done) == len(set(done)) == 10  # no finished step twice

    # From the start, a finished run's stream replays its whole journal, then ends.
    with ops.stream("GET", f"/runs/{run_id}/events") as stream:
        whole = _events(stream, lambda e: e["event"] == "end")
    names = [e["data"]["name"] for e in whole if e["event"] == "step"]
    assert names == [s.name for s in stack.app.observe.steps(run_id)]


def test_keys_scopes_and_bad_requests_change_nothing(stack: Stack, tmp_path: Path) -> None:
    stack.serve("--no-worker", "--no-webhooks", "--max-body-bytes", "20000")
    _, reader = stack.app.store.create_api_key("dash", ["read"], time.time())
    revoked, revoked_token = stack.app.store.create_api_key("old", ["admin"], time.time())
    revoke = subprocess.run(
        [sys.executable, "-m", "mainspring", "keys", "revoke", revoked.id, "--db", stack.db_url],
        env=stack.env,
        capture_output=True,
        text=True,
    )
    assert revoke.returncode == 0, revoke.stderr
    body = {"workflow": "deploy", "args": ["prod"]}
    cases = [
        (stack.client(), 401, "an API key is required"),
        (stack.client("msk_nope_nope"), 401, "not valid"),
        (stack.client("garbage"), 401, "not valid"),
        (stack.client(revoked_token), 401, f"{revoked.id!r} was revoked"),
        (stack.client(stack.reviewer), 403, "this needs 'submit'"),
        (stack.client(reader), 403, "this needs 'submit'"),
    ]
    for client, status, message in cases:
        response = client.post("/runs", json=body)
        assert response.status_code == status, response.text
        assert message in response.json()["error"]["message"]
    both = stack.client(stack.admin).post("/runs", json=body, headers={"X-API-Key": "msk_a_b"})
    assert both.status_code == 401 and "two different API keys" in both.json()["error"]["message"]
    assert stack.client().get("/runs").status_code == 401
    assert stack.client(reader).get("/runs").json()["runs"] == []
    assert stack.app.list_runs() == []  # nothing was created

    ops = stack.client(stack.admin)
    for payload, status, message in [
        ({"workflow": "nope"}, 422, "no workflow named 'nope'"),
        ({"workflow": "deploy", "args": [1, 2, 3]}, 422, "cannot take args"),
        ({"workflow": "deploy", "extra": 1}, 422, "body.extra: Extra inputs are not permitted"),
        ({"args": []}, 422, "body.workflow: Field required"),
        ({"workflow": "deploy", "args": ["x" * 30000]}, 413, "larger than 20000 bytes"),
    ]:
        response = ops.post("/runs", json=payload)
        assert response.status_code == status, response.text
        assert message in response.json()["error"]["message"]
    broken = ops.post("/runs", content=b"{not json", headers={"content-type": "application/json"})
    assert broken.status_code == 422 and broken.json()["error"]["type"] == "invalid_request"
    # A JSON body without a JSON content type (curl -d sends a form type) is refused with
    # the header to add, not with fields that seem to be missing.
    # A wrong type is refused before the body is read (415); none at all is a 422.
    for headers, status in (
        ({}, 422),
        ({"content-type": "application/x-www-form-urlencoded"}, 415),
    ):
        untyped = ops.post("/runs", content=json.dumps(body).encode(), headers=headers)
        assert untyped.status_code == status, untyped.text
        message = untyped.json()["error"]["message"]
        assert "'Content-Type: application/json'" in message, message
        assert repr(headers.get("content-type")) in message, message
    assert stack.app.list_runs() == []

    # Idempotency: the same key is the same run; a key reused for other input is refused.
    a = ops.post("/runs", json={**body, "key": "deploy-42"})
    b = ops.post("/runs", json=body, headers={"Idempotency-Key": "deploy-42"})
    assert a.status_code == b.status_code == 202
    assert a.json()["id"] == b.json()["id"] and (a.json()["created"], b.json()["created"]) == (
        True,
        False,
    )
    assert b.headers["idempotent-replayed"] == "true"
    other = ops.post("/runs", json={"workflow": "deploy", "args": ["dev"], "key": "deploy-42"})
    assert other.status_code == 409 and "other input" in other.json()["error"]["message"]
    assert len(stack.app.list_runs()) == 1


def test_run_listing_filters_and_pages(stack: Stack) -> None:
    stack.serve("--no-worker", "--no-webhooks")
    ops = stack.client(stack.admin)
    ids = [
        ops.post("/runs", json={"workflow": "deploy", "args": [str(i)]}).json()["id"]
        for i in range(5)
    ]
    ops.post(f"/runs/{ids[0]}/cancel")
    page = ops.get("/runs", params={"limit": 2}).json()
    assert [r["id"] for r in page["runs"]] == ids[::-1][:2]
    second = ops.get(page["next"]).json()
    assert [r["id"] for r in second["runs"]] == ids[::-1][2:4]
    cancelled = ops.get("/runs", params={"status": "cancelled"}).json()["runs"]
    assert [r["id"] for r in cancelled] == [ids[0]]
    assert ops.get("/runs", params={"workflow": "fails"}).json() == {"runs": [], "next": None}
    bad = ops.get("/runs", params={"status": "sideways"})
    assert bad.status_code == 422 and "query.status" in bad.json()["error"]["message"]
    assert stack.client().get("/healthz").json()["schema_version"] == ms.storage.SCHEMA_VERSION
    doc = stack.client().get("/openapi.json").json()
    assert "/runs/{run_id}/requests/{request_id}" in doc["paths"]


def test_metrics_fork_and_retry_over_http(stack: Stack) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    stack.serve("--no-webhooks", "--worker")
    ops, ana = stack.client(stack.admin), stack.client(stack.reviewer)
    source = ops.post("/runs", json={"workflow": "steps_then_wait", "args": [3, 1]}).json()["id"]
    broken = ops.post("/runs", json={"workflow": "fails"}).json()["id"]
    until(lambda: _run(ops, broken)["status"] == "failed", "the failing run")
    until(lambda: _run(ops, source)["status"] == "waiting", "the waiting run")

    forked = ops.post(f"/runs/{source}/fork", json={"from_step": 1})
    assert forked.status_code == 202, forked.text
    fork_id = forked.json()["id"]
    assert forked.headers["location"] == f"/runs/{fork_id}" and fork_id != source
    until(lambda: _run(ops, fork_id)["status"] == "waiting", "the fork to reach the wait")
    names = [s.name for s in stack.app.observe.steps(fork_id)]
    assert names == ["before-0", "before-1", "before-2", "go"]
    bad = ops.post(f"/runs/{source}/fork", json={"from_step": 99})
    assert bad.status_code == 422 and "has no step 0:99" in bad.json()["error"]["message"]

    again = ops.post(f"/runs/{broken}/retry")
    assert again.status_code == 202 and again.json()["id"] == broken
    not_failed = ops.post(f"/runs/{source}/retry")
    assert (
        not_failed.status_code == 409 and "only a failed" in not_failed.json()["error"]["message"]
    )
    assert ana.post(f"/runs/{broken}/retry").status_code == 403  # a reviewer cannot
    until(lambda: _run(ops, broken)["status"] == "failed", "the retried run to fail again")

    assert stack.client().get("/metrics").status_code == 401
    scraped = ana.get("/metrics")
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(scraped.text)}
    runs = {
        s.labels["status"]: s.value
        for f in families.values()
        for s in f.samples
        if s.name.endswith("runs") and "status" in s.labels
    }
    assert runs.get("failed") == 1 and runs.get("waiting") == 2, runs
    # the server process's own counters: requests by route template, its embedded worker
    http = {
        (s.labels["method"], s.labels["route"], s.labels["status"]): s.value
        for s in families["mainspring_http_requests"].samples
        if s.name == "mainspring_http_requests_total"
    }
    assert http[("POST", "/runs/{run_id}/fork", "202")] == 1
    assert http[("POST", "/runs/{run_id}/fork", "422")] == 1
    assert http[("POST", "/runs/{run_id}/retry", "403")] == 1
    assert not any(source in route for _, route, _ in http)  # templates, not run ids
    cap = families["mainspring_worker_concurrency"].samples[0].value
    assert cap >= 1 and families["mainspring_runs_claimed"].type == "counter"


def test_slow_clients_are_cut_off(stack: Stack) -> None:
    """Slowloris: headers that never finish are closed; a body that stalls gets 408;
    a normal request on the same server still works."""
    import socket

    stack.serve("--no-worker", "--no-webhooks", "--header-timeout", "1", "--body-timeout", "1")
    slow = [socket.create_connection(("127.0.0.1", stack.port), timeout=20) for _ in range(5)]
    for s in slow:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    for s in slow:
        assert s.recv(100) == b""  # closed by the server (a timeout would raise instead)
        s.close()
    body = socket.create_connection(("127.0.0.1", stack.port), timeout=20)
    body.sendall(
        b"POST /runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + stack.admin.encode() + b"\r\nContent-Length: 100\r\n\r\n{"
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = body.recv(1000)
        assert chunk, answer
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer
    body.close()
    assert stack.client(stack.admin).get("/runs").status_code == 200
    assert sum(stack.app.store.count_runs().values()) == 0


def test_invented_methods_add_no_series_to_metrics(tmp_path: Path) -> None:
    """300 requests with made-up methods, with no key at all: the request counter has
    one ``other`` series for them, not 300 (each scrape would carry them for ever)."""
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from mainspring.server import create_app

    app = ms.App(f"sqlite:///{tmp_path / 'm.db'}")
    metrics_key = {"Authorization": f"Bearer {app.admin.create_key('prom', ['metrics'])[1]}"}
    with TestClient(create_app(app, webhooks=False)) as client:

        def series() -> set[tuple[str, str, str]]:
            text = client.get("/metrics", headers=metrics_key).text
            return {
                (s.labels["method"], s.labels["route"], s.labels["status"])
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "mainspring_http_requests_total"
            }

        before = series()
        for i in range(300):
            client.request(f"X{i}", f"/runs/{i}")
        added = series() - before
        assert {m for m, _, _ in added} <= {"other", "GET"}, added
        assert len(added) <= 3, added
    app.close()
