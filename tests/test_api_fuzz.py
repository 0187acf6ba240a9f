"""The HTTP API under an OpenAPI fuzzer (Schemathesis): no input, however malformed,
gets a 5xx; every 4xx is the documented JSON error; every response matches the
OpenAPI document. Then a few hand-written auth cases: nothing is created without a
valid key with the right scope.

Bounded for CI: 30 examples per operation, derandomized. The event streams of the
fuzzed server end after 0.3 s (a client resumes them with ``Last-Event-ID``), so both
stream endpoints are fuzzed, ``GET /runs/{run_id}/events`` with finished runs' ids or
ids of no run.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")

import hypothesis  # noqa: E402
import hypothesis.strategies as st  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

import mainspring as ms  # noqa: E402
from mainspring.server import create_app  # noqa: E402

MAX_EXAMPLES = 30


@dataclass
class Seeded:
    """The fuzzed App and the real ids that path parameters are sometimes swapped for."""

    app: ms.App
    admin: str
    reviewer: str
    revoked: str
    runs: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    webhooks: list[str] = field(default_factory=list)
    cancellable: list[str] = field(default_factory=list)


def _make_app(path: Path) -> ms.App:
    app = ms.App(f"sqlite:///{path}", poll_interval_s=0.02, inline_wait_s=0.0)

    @app.workflow
    async def deploy(ctx: ms.RunContext, env: str) -> str:
        built = await ctx.step(lambda: f"build of {env}", name="build")
        decision = await ctx.approval("deploy", preview={"env": env, "built": built})
        return "deployed" if decision.approved else f"not deployed: {decision.reason}"

    @app.workflow
    async def choose(ctx: ms.RunContext) -> str:
        return await ctx.ask("which colour?", choices=["red", "blue"], name="colour")

    @app.workflow
    async def plain(ctx: ms.RunContext, n: int = 1) -> int:
        return await ctx.step(lambda: n * 2, name="double")

    return app


def _seed(app: ms.App) -> Seeded:
    now = time.time()
    _, admin = app.store.create_api_key("fuzz", ["admin"], now)
    _, reviewer = app.store.create_api_key("ana", ["read", "approve"], now)
    old, revoked = app.store.create_api_key("gone", ["admin"], now)
    app.store.revoke_api_key(old.id, now)
    seeded = Seeded(app=app, admin=admin, reviewer=reviewer, revoked=revoked)
    waiting = [app.submit("deploy", env).run_id for env in ("prod", "staging", "dev")]
    asked = app.submit("choose").run_id
    done = [app.submit("plain", n).run_id for n in (1, 2)]
    asyncio.run(app.worker().run(until_idle=True))
    # One run cancelled while it waits (its wait row stays 'started'), one while queued.
    app.cancel(waiting[2], "fuzz")
    queued = app.submit("plain", 3).run_id
    app.cancel(queued)
    seeded.runs = [*waiting, asked, *done, queued, app.submit("plain", 4).run_id]
    seeded.finished = [*done, waiting[2], queued]
    # In the order of seeded.runs (not of their random ids): the same cases every time.
    order = {run_id: i for i, run_id in enumerate(seeded.runs)}
    seeded.requests = sorted(((r.run_id, r.id) for r in app.requests()), key=lambda p: order[p[0]])
    assert len(seeded.requests) == 3, seeded.requests
    # Queued runs that half the valid cancels go to (the rest meet real ids at random).
    seeded.cancellable = [app.submit("plain", n).run_id for n in (5, 6, 7)]
    hook, _ = app.store.add_webhook("http://127.0.0.1:9/hook", now)
    seeded.webhooks = [hook.id]
    return seeded


class _Seeded:
    """The fuzzed server and its data, made on first use.

    Why not ``schemathesis.pytest.from_fixture``: its lazy loader renames pytest's items
    through a private attribute (``Function._nodeid``) that pytest 9.2 removed, so it
    failed at once on the releases a resolver picks today. A schema loaded at import and
    parametrized by schemathesis's own collector uses pytest's public API only; it
    generates its first cases (and asks for the key, and calls the hooks below) while
    collecting, so the data is made then, once per process, in a folder of its own.
    """

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="mainspring-fuzz-"))
        self._seeded: Seeded | None = None
        # Only /openapi.json is asked before the data exists: the same document.
        self.api: Any = create_app(_make_app(self.folder / "schema.db"), webhooks=False)

    @property
    def data(self) -> Seeded:
        if self._seeded is None:
            self._seeded = _seed(_make_app(self.folder / "fuzz.db"))
            # Streams end after 0.3 s (a client would resume them): so GET /events,
            # which otherwise follows every run for ever, is fuzzed too.
            self.api = create_app(
                self._seeded.app, webhooks=False, events_poll_s=0.01, max_stream_s=0.3
            )
        return self._seeded

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.api(scope, receive, send)

    def close(self) -> None:
        if self._seeded is not None:
            self._seeded.app.close()
        shutil.rmtree(self.folder, ignore_errors=True)


FUZZED = _Seeded()


@pytest.fixture(scope="module")
def seeded() -> Iterator[Seeded]:
    try:
        yield FUZZED.data
    finally:
        FUZZED.close()


schema = schemathesis.openapi.from_asgi("/openapi.json", FUZZED)
schema.config.generation.update(
    max_examples=MAX_EXAMPLES,
    deterministic=True,
    database="none",
    # The key is the admin's (below): no made-up X-API-Key or cookie beside it.
    with_security_parameters=False,
)

# A body past the size limit is rejected with 413 (before it is parsed): that is a
# rejection of invalid data too.
schema.config.checks.negative_data_rejection.expected_statuses = [
    *schema.config.checks.negative_data_rejection.expected_statuses,
    "413",
]


@schema.auth()
class AdminKey:
    """The admin key on every case (explicit auth: the checks also probe without)."""

    def get(self, case: Any, ctx: Any) -> str:
        return FUZZED.data.admin

    def set(self, case: Any, token: str, ctx: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}


@schema.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any]) -> Any:
    """Sometimes a real run, request or webhook id instead of a generated one."""
    seeded = FUZZED.data
    generated = st.just(path_parameters)
    if not isinstance(path_parameters, dict):  # none, or malformed on purpose
        return generated
    path = context.operation.path if context.operation is not None else ""
    if path == "/runs/{run_id}/events":
        # A stream ends with its run: only finished runs (or no run at all: 404).
        real = st.sampled_from(seeded.finished).map(lambda rid: {**path_parameters, "run_id": rid})
        return st.one_of(generated, real)
    if "request_id" in path_parameters:
        pairs = st.sampled_from(seeded.requests)
        real = pairs.map(lambda p: {**path_parameters, "run_id": p[0], "request_id": p[1]})
        same_run = pairs.map(lambda p: {**path_parameters, "run_id": p[0]})
        return st.one_of(generated, real, real, same_run)
    if "run_id" in path_parameters:
        real = st.sampled_from(seeded.runs).map(lambda rid: {**path_parameters, "run_id": rid})
        return st.one_of(generated, real, real)
    if "webhook_id" in path_parameters:
        real = st.sampled_from(seeded.webhooks).map(
            lambda wid: {**path_parameters, "webhook_id": wid}
        )
        return st.one_of(generated, real)
    return generated


@schema.hook
def map_case(context: Any, case: Any) -> Any:
    """Most valid submissions name a registered workflow, so that they get past the
    name to the arguments; two in three valid answers fit their request. (Invalid
    cases stay as they are: they must fail.)"""
    seeded = FUZZED.data
    body = case.body
    if (
        case.operation.label == "POST /runs"
        and case.meta is not None
        and case.meta.generation.mode.is_positive
        and isinstance(body, dict)
    ):
        names = [body.get("workflow"), "deploy", "choose", "plain"]
        case.body = {**body, "workflow": names[len(repr(body)) % len(names)]}
    if (
        case.operation.label == "POST /runs/{run_id}/requests/{request_id}"
        and case.meta is not None
        and case.meta.generation.mode.is_positive
        and len(repr(body)) % 3 != 0
    ):
        question = str(case.path_parameters.get("request_id")).startswith("question:")
        case.body = {"answer": "red"} if question else {"decision": "approve"}
    if (
        case.operation.label == "POST /runs/{run_id}/signals"
        and case.meta is not None
        and case.meta.generation.mode.is_positive
        and len(repr(body)) % 2 == 0
    ):
        # Half the valid signals go to a run still waiting, so they get past the 404.
        case.path_parameters = {**(case.path_parameters or {}), "run_id": seeded.runs[0]}
    if (
        case.operation.label == "POST /runs/{run_id}/cancel"
        and case.meta is not None
        and case.meta.generation.mode.is_positive
        and len(repr(body)) % 2 == 0
    ):
        # Half the valid cancels go to a queued run, so that some are accepted.
        run_id = seeded.cancellable[len(repr(body)) % len(seeded.cancellable)]
        case.path_parameters = {**(case.path_parameters or {}), "run_id": run_id}
    return case


def _assert_error_body(response: Any) -> None:
    assert "application/json" in str(response.headers.get("content-type")), response.headers
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error.get("type"), str) and error["type"], body
    assert isinstance(error.get("message"), str) and error["message"].strip(), body


# Input the schema cannot describe: which workflows exist and what arguments they take,
# which answers fit a request. Schema-valid bodies may get a 422 there, but only one
# that names such a problem, never a validation error (schema and validator disagree).
SEMANTIC = {
    "POST /runs": {"invalid_input", "unknown_workflow"},
    "POST /runs/{run_id}/requests/{request_id}": {"invalid_answer"},
    # Which steps a run's journal holds: a schema-valid step may not exist in it.
    "POST /runs/{run_id}/fork": {"invalid_input"},
    # Which addresses webhooks may go to: a schema-valid URL may be refused by the policy.
    "POST /webhooks": {"invalid_input"},
}


SEEN: Counter[tuple[str, int]] = Counter()


def _check(case: Any) -> None:
    semantic = SEMANTIC.get(case.operation.label)
    excluded = [schemathesis.checks.positive_data_acceptance] if semantic else []
    response = case.call_and_validate(excluded_checks=excluded)
    SEEN[case.operation.label, response.status_code] += 1
    assert response.status_code < 500, (response.status_code, response.text)
    if 400 <= response.status_code < 500:
        _assert_error_body(response)
    if semantic and response.status_code == 422 and case.meta.generation.mode.is_positive:
        assert response.json()["error"]["type"] in semantic, response.text


# One test per operation, parametrized by pytest itself: the cases come from
# schemathesis's documented strategies (``APIOperation.as_strategy``, valid and invalid
# data), with the hooks and the key above, under Hypothesis. (schemathesis's own pytest
# items all share one node id, so under pytest-xdist only the first of them ran.)
OPERATIONS = sorted(op.ok().label for op in schema.get_all_operations())


@pytest.mark.parametrize("label", OPERATIONS)
def test_fuzz(label: str, seeded: Seeded) -> None:
    operation = schema.find_operation_by_label(label)
    assert operation is not None, label
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    cases = st.one_of(
        operation.as_strategy(mode, hooks=schema.hooks, auth_storage=schema.auth) for mode in modes
    )

    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(case=cases)
    def fuzz(case: Any) -> None:
        _check(case)

    fuzz()


def test_fuzz_reached_real_ids() -> None:
    """The fuzzer got past the 404s to real runs and webhooks (answers that fit a
    request are rare in the fuzz: test_reviewer_answers covers them)."""
    if not SEEN:
        pytest.skip("run with test_fuzz")
    print(sorted(SEEN.items()))
    for label, ok in [
        ("GET /runs/{run_id}", 200),
        ("GET /runs/{run_id}/steps", 200),
        ("GET /runs/{run_id}/events", 200),
        ("POST /runs/{run_id}/signals", 202),
        ("POST /runs/{run_id}/cancel", 202),
        ("POST /runs", 202),
        ("DELETE /webhooks/{webhook_id}", 204),
        ("GET /events", 200),
    ]:
        assert SEEN[label, ok], (label, ok, sorted(SEEN.items()))


# -- by hand: keys and scopes ------------------------------------------------------------


@pytest.fixture
def client(seeded: Seeded) -> Iterator[TestClient]:
    with TestClient(create_app(seeded.app, webhooks=False)) as c:
        yield c


def _run_count(app: ms.App) -> int:
    return sum(app.store.count_runs().values())


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer msk_nope_nope"},
        {"Authorization": "Bearer not-a-key"},
        {"X-API-Key": "msk_123456789abc_forged"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        "revoked",
        "tampered",
    ],
    ids=["missing", "wrong", "malformed", "forged-header", "basic", "revoked", "tampered"],
)
def test_bad_key_is_401_and_creates_nothing(
    client: TestClient, seeded: Seeded, headers: dict[str, str] | str
) -> None:
    if headers == "revoked":
        headers = {"Authorization": f"Bearer {seeded.revoked}"}
    elif headers == "tampered":  # a real key's id with another secret
        headers = {"Authorization": f"Bearer {seeded.admin[:-4]}AAAA"}
    assert isinstance(headers, dict)
    before = _run_count(seeded.app)
    hooks = len(seeded.app.store.list_webhooks())
    for method, url, body in [
        ("POST", "/runs", {"workflow": "plain", "args": [1]}),
        ("POST", f"/runs/{seeded.runs[0]}/signals", {"name": "go"}),
        ("POST", "/webhooks", {"url": "http://127.0.0.1:9/x"}),
        ("GET", "/runs", None),
        ("GET", "/events", None),
    ]:
        response = client.request(method, url, json=body, headers=headers)
        assert response.status_code == 401, (method, url, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
        _assert_error_body(response)
        assert response.json()["error"]["type"] == "unauthorized"
    assert _run_count(seeded.app) == before
    assert len(seeded.app.store.list_webhooks()) == hooks


def test_reviewer_cannot_submit(client: TestClient, seeded: Seeded) -> None:
    headers = {"Authorization": f"Bearer {seeded.reviewer}"}
    before = _run_count(seeded.app)
    for method, url, body in [
        ("POST", "/runs", {"workflow": "plain", "args": [1]}),
        ("POST", "/runs", {"workflow": "plain", "key": "k-1"}),
        ("POST", "/webhooks", {"url": "http://127.0.0.1:9/x"}),
        ("POST", f"/runs/{seeded.runs[0]}/cancel", None),
    ]:
        response = client.request(method, url, json=body, headers=headers)
        assert response.status_code == 403, (method, url, response.text)
        _assert_error_body(response)
        assert response.json()["error"]["type"] == "forbidden"
    assert _run_count(seeded.app) == before
    # The same key reads.
    assert client.get("/runs", headers=headers).status_code == 200


def test_stream_of_run_cancelled_while_waiting_ends(client: TestClient, seeded: Seeded) -> None:
    """A run cancelled in a wait keeps its wait row 'started': its stream still ends."""
    run_id = seeded.finished[2]
    headers = {"Authorization": f"Bearer {seeded.admin}"}
    with client.stream("GET", f"/runs/{run_id}/events", headers=headers) as response:
        text = "".join(response.iter_text())
    assert "event: end" in text
    assert '"status":"cancelled"' in text


def test_reviewer_answers_once(client: TestClient, seeded: Seeded) -> None:
    app = seeded.app
    run_id = app.submit("choose").run_id
    asyncio.run(app.worker().run(until_idle=True))
    headers = {"Authorization": f"Bearer {seeded.reviewer}"}
    url = f"/runs/{run_id}/requests/question:colour"
    wrong = client.post(url, json={"answer": "green"}, headers=headers)
    assert wrong.status_code == 422 and wrong.json()["error"]["type"] == "invalid_answer"
    ok = client.post(url, json={"answer": "red"}, headers=headers)
    assert ok.status_code == 200, ok.text
    assert ok.json()["kind"] == "question"
    again = client.post(url, json={"answer": "blue"}, headers=headers)
    assert again.status_code == 409, again.text
    _assert_error_body(again)
