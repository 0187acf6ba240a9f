"""Every operation of the OpenAPI document × every credential, over real HTTP.

The table below names, for each operation, the scope it needs and the status a key
with that scope gets for a well-formed request. The test walks the OpenAPI document
(not the table), so a new route without an entry fails here. Each operation is
called with no key, a wrong key, a revoked key and a key of each scope, and the
exact status is asserted: 401 without a valid key, 403 without the scope, the
success status with it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

import httpx
import uvicorn

import mainspring as ms
from mainspring.server import create_app
from mainspring.storage._api import SCOPES


@dataclass
class Fixture:
    app: ms.App
    keys: dict[str, str]  # credential name -> token ("" for none)
    finished: str  # a succeeded run

    def drain(self) -> None:
        asyncio.run(asyncio.wait_for(self.app.worker().run(until_idle=True), 30))

    def fresh(self, workflow: str, *, run: bool) -> str:
        run_id = self.app.submit(workflow).run_id
        if run:
            self.drain()
        return run_id


Call = tuple[str, dict[str, Any] | None]  # (url, JSON body)
# "METHOD path" -> (scope needed, or scopes any of which is enough, or None; status when
# allowed; a fresh request)
MATRIX: dict[str, tuple[str | tuple[str, ...] | None, int, Callable[[Fixture], Call]]] = {
    "GET /healthz": (None, 200, lambda f: ("/healthz", None)),
    "POST /runs": ("submit", 202, lambda f: ("/runs", {"workflow": "plain"})),
    "GET /runs": ("read", 200, lambda f: ("/runs", None)),
    "GET /runs/{run_id}": ("read", 200, lambda f: (f"/runs/{f.finished}", None)),
    "GET /runs/{run_id}/steps": ("read", 200, lambda f: (f"/runs/{f.finished}/steps", None)),
    "GET /runs/{run_id}/events": ("read", 200, lambda f: (f"/runs/{f.finished}/events", None)),
    "GET /events": ("read", 200, lambda f: ("/events", None)),
    "POST /runs/{run_id}/signals": (
        "submit",
        202,
        lambda f: (f"/runs/{f.fresh('waiter', run=False)}/signals", {"name": "go"}),
    ),
    "GET /requests": ("read", 200, lambda f: ("/requests", None)),
    "POST /runs/{run_id}/requests/{request_id}": (
        "approve",
        200,
        lambda f: (
            f"/runs/{f.fresh('deploy', run=True)}/requests/approval:deploy",
            {"decision": "approve"},
        ),
    ),
    "POST /runs/{run_id}/cancel": (
        "submit",
        202,
        lambda f: (f"/runs/{f.fresh('plain', run=False)}/cancel", {}),
    ),
    "POST /runs/{run_id}/fork": (
        "submit",
        202,
        lambda f: (f"/runs/{f.finished}/fork", {"from_step": 0}),
    ),
    "POST /runs/{run_id}/retry": (
        "submit",
        202,
        lambda f: (f"/runs/{f.fresh('boom', run=True)}/retry", None),
    ),
    "GET /metrics": (("metrics", "read"), 200, lambda f: ("/metrics", None)),
    "GET /queues": ("read", 200, lambda f: ("/queues", None)),
    "POST /replay-check": ("admin", 200, lambda f: ("/replay-check", {})),
    "GET /webhooks": ("admin", 200, lambda f: ("/webhooks", None)),
    "POST /webhooks": (
        "admin",
        201,
        lambda f: ("/webhooks", {"url": "https://hooks.example.com/h"}),
    ),
    "DELETE /webhooks/{webhook_id}": (
        "admin",
        204,
        lambda f: (
            f"/webhooks/{f.app.store.add_webhook('http://127.0.0.1:9/h', time.time())[0].id}",
            None,
        ),
    ),
    "GET /schedules": ("read", 200, lambda f: ("/schedules", None)),
    "POST /schedules/{name}/pause": ("admin", 200, lambda f: ("/schedules/nightly/pause", None)),
    "POST /schedules/{name}/resume": ("admin", 200, lambda f: ("/schedules/nightly/resume", None)),
}
CREDENTIALS = ("none", "wrong", "revoked", *SCOPES)


def _app(path: Path) -> ms.App:
    app = ms.App(f"sqlite:///{path}", poll_interval_s=0.01, inline_wait_s=0.0)

    @app.workflow
    async def plain(ctx: ms.RunContext) -> int:
        return await ctx.step(lambda: 2, name="two")

    @app.workflow
    async def waiter(ctx: ms.RunContext) -> Any:
        return await ctx.wait_for("go")

    @app.workflow
    async def deploy(ctx: ms.RunContext) -> bool:
        return (await ctx.approval("deploy")).approved

    @app.workflow
    async def boom(ctx: ms.RunContext) -> None:
        def fail() -> None:
            raise ValueError("boom")

        await ctx.step(fail, name="fail", retry=ms.RetryPolicy.never())

    app.schedules.add("nightly", "0 3 * * *", plain)
    return app


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Fixture]]:
    app = _app(tmp_path_factory.mktemp("scopes") / "scopes.db")
    now = time.time()
    keys = {"none": "", "wrong": "msk_000000000000_wrong"}
    for scope in SCOPES:
        keys[scope] = app.store.create_api_key(f"only-{scope}", [scope], now)[1]
    gone, keys["revoked"] = app.store.create_api_key("gone", ["admin"], now)
    app.store.revoke_api_key(gone.id, now)
    finished = app.submit("plain").run_id
    app.schedules.sync()  # stored, as a worker's first tick stores it
    fixture = Fixture(app=app, keys=keys, finished=finished)
    fixture.drain()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(app, webhooks=False, events_poll_s=0.02),
        log_level="warning",
        timeout_graceful_shutdown=1,
    )
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", fixture
    finally:
        uv.should_exit = True
        thread.join(10)
        sock.close()
        app.close()


def _operations() -> list[str]:
    with_app = _app(Path(":memory:"))  # the document only; the store is never opened
    doc = create_app(with_app, webhooks=False).openapi()
    return sorted(
        f"{method.upper()} {path}" for path, item in doc["paths"].items() for method in item
    )


def test_every_operation_has_an_entry() -> None:
    assert set(_operations()) == set(MATRIX), (
        "a route was added or removed: give it an entry in MATRIX (the scope it needs "
        "and its success status)"
    )


def _expected(credential: str, scope: str | tuple[str, ...] | None, ok: int) -> int:
    if scope is None:
        return ok
    if credential in ("none", "wrong", "revoked"):
        return 401
    enough = (scope,) if isinstance(scope, str) else scope
    return ok if credential in (*enough, "admin") else 403


def test_the_metrics_scope_is_in_the_matrix() -> None:
    # A key holding only "metrics" is one of the credentials every route is tried with:
    # it may scrape /metrics and gets 403 everywhere else.
    assert "metrics" in CREDENTIALS
    assert [op for op, (scope, _, _) in MATRIX.items() if _expected("metrics", scope, 1) == 1] == [
        "GET /healthz",
        "GET /metrics",
    ]


@pytest.mark.parametrize("operation", sorted(MATRIX))
def test_route_scope_matrix(server: tuple[str, Fixture], operation: str) -> None:
    base, fixture = server
    scope, ok, make = MATRIX[operation]
    method = operation.split()[0]
    seen = {}
    with httpx.Client(base_url=base, timeout=20) as client:
        for credential in CREDENTIALS:
            token = fixture.keys[credential]
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            url, body = make(fixture)
            # Stream, so an endless event stream is judged by its status line alone.
            with client.stream(method, url, json=body, headers=headers) as response:
                seen[credential] = response.status_code
                if response.status_code in (401, 403):
                    response.read()
                    error = response.json()["error"]
                    assert error["type"] == (
                        "unauthorized" if response.status_code == 401 else "forbidden"
                    )
    wanted = {c: _expected(c, scope, ok) for c in CREDENTIALS}
    assert seen == wanted, operation


# -- the session cookie × every unsafe operation × what a browser may add beside it ------

UNSAFE = sorted(op for op in MATRIX if op.split()[0] in ("POST", "PUT", "PATCH", "DELETE"))
# Headers that ride along with the cookie: some a browser adds by itself (a proxy's Basic
# credentials, cached for the host), some a script might. None turns the origin check off.
BESIDE_COOKIE: dict[str, Callable[[Fixture], dict[str, str]]] = {
    "nothing": lambda f: {},
    "a proxy's Basic": lambda f: {"Authorization": "Basic dXNlcjpwYXNzd29yZA=="},
    "another scheme": lambda f: {"Authorization": "Digest username=ana"},
    "an empty bearer": lambda f: {"Authorization": "Bearer"},
    "an empty X-API-Key": lambda f: {"X-API-Key": ""},
    "a wrong key": lambda f: {"Authorization": f"Bearer {f.keys['wrong']}"},
    "a valid key": lambda f: {"Authorization": f"Bearer {f.keys['admin']}"},
    "a valid X-API-Key": lambda f: {"X-API-Key": f.keys["admin"]},
}
# Requests that are not from the server's own origin, as a browser marks them.
NOT_SAME_ORIGIN: dict[str, dict[str, str]] = {
    "another port, Origin only": {"Origin": "http://127.0.0.1:1"},
    "another port, fetch metadata": {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"},
    "another site": {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
    "a sandboxed frame": {"Origin": "null"},
    "no origin at all": {},
}


def _session(client: httpx.Client, base: str, token: str) -> str:
    r = client.post(
        "/ui/login",
        content=f"key={token}",
        headers={"Origin": base, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 303, r.text
    session = r.cookies["mainspring_key"]
    assert session.startswith("mss_")
    return session


@pytest.mark.parametrize("operation", [*UNSAFE, "POST /ui/logout", "POST /ui/login"])
def test_the_session_cookie_is_always_origin_checked(
    server: tuple[str, Fixture], operation: str
) -> None:
    """A request that carries the dashboard's cookie from anywhere but the server's own
    origin is refused (403), whatever header rides beside the cookie; nothing happens;
    then the same request from the own origin does what the route does."""
    base, fixture = server
    method = operation.split()[0]
    with httpx.Client(base_url=base, timeout=20) as client:
        cookie = {"Cookie": f"mainspring_key={_session(client, base, fixture.keys['admin'])}"}
        if operation.startswith("POST /ui/"):
            url, body, ok = operation.split()[1], None, 303
        else:
            _, ok, make = MATRIX[operation]
            url, body = make(fixture)
        before = (len(fixture.app.list_runs(limit=1000)), len(fixture.app.admin.list_webhooks()))
        if operation == "POST /ui/login":
            body_kw: dict[str, Any] = {"content": f"key={fixture.keys['admin']}"}
        else:
            body_kw = {"json": body} if body is not None else {}
        for beside, extra in BESIDE_COOKIE.items():
            for where, origin in NOT_SAME_ORIGIN.items():
                headers = {**cookie, **extra(fixture), **origin}
                r = client.request(method, url, headers=headers, **body_kw)
                assert r.status_code == 403, (beside, where, r.status_code, r.text)
                assert "cross-site request refused" in r.json()["error"]["message"]
        assert (
            len(fixture.app.list_runs(limit=1000)),
            len(fixture.app.admin.list_webhooks()),
        ) == before
        # From the own origin the session works: so nothing above had happened (a second
        # cancel or answer would be a 409; logout would have ended the session).
        r = client.request(method, url, headers={**cookie, "Origin": base}, **body_kw)
        assert r.status_code == ok, (operation, r.text)
