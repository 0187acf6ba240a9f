"""The API surface a browser or a stranger sees: cross-site requests riding the
dashboard's cookie, non-JSON bodies, security headers, what a 409 reveals, the
database file's permissions, out-of-range numbers."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

import mainspring as ms
from mainspring.server import create_app

ORIGIN = "http://testserver"  # the TestClient's own origin


@pytest.fixture
def app(tmp_path: Path) -> Iterator[ms.App]:
    app = ms.App(f"sqlite:///{tmp_path / 'surface.db'}", poll_interval_s=0.01, inline_wait_s=0.0)

    @app.workflow
    async def idle(ctx: ms.RunContext, note: str = "") -> Any:
        return await ctx.wait_for("go")

    yield app
    app.close()


@pytest.fixture
def admin(app: ms.App) -> str:
    return app.admin.create_key("ops", ["admin"])[1]


@pytest.fixture
def client(app: ms.App) -> Iterator[TestClient]:
    with TestClient(create_app(app, webhooks=False)) as c:
        yield c


def test_cookie_authenticated_unsafe_requests_must_be_same_origin(
    app: ms.App, admin: str, client: TestClient
) -> None:
    run_id = app.submit("idle").run_id
    _login(client, admin)
    cancel = f"/runs/{run_id}/cancel"
    for headers in (
        {},  # no Origin at all (an old browser, or a form that hides it)
        {"Origin": "http://testserver:8001"},  # another port of the same host
        {"Origin": "http://evil.example"},
        {"Origin": "null"},  # a sandboxed frame
        {"Sec-Fetch-Site": "same-site", "Origin": ORIGIN},  # the browser says: not us
        {"Sec-Fetch-Site": "cross-site"},
    ):
        for body in ({"json": {}}, {"content": b""}):
            r = client.post(cancel, headers=headers, **body)  # type: ignore[arg-type]
            assert r.status_code == 403, (headers, r.text)
            assert "cross-site request refused" in r.json()["error"]["message"]
    assert client.post(f"/runs/{run_id}/retry").status_code == 403
    assert app.get_run(run_id).status == "queued"  # nothing happened
    # Login and logout are cross-site refused too (login CSRF would log a victim in).
    assert client.post("/ui/logout", headers={"Origin": "http://evil.example"}).status_code == 403
    r = client.post("/ui/login", content=f"key={admin}", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    # From the dashboard's own origin the same cookie works.
    ok = client.post(cancel, json={}, headers={"Origin": ORIGIN})
    assert ok.status_code == 202, ok.text
    same = client.post(
        f"/runs/{app.submit('idle').run_id}/cancel",
        json={},
        headers={"Sec-Fetch-Site": "same-origin"},
    )
    assert same.status_code == 202, same.text


def test_api_bodies_must_be_json(app: ms.App, admin: str, client: TestClient) -> None:
    run_id = app.submit("idle").run_id
    key = {"Authorization": f"Bearer {admin}"}
    for content_type in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data"):
        r = client.post(
            f"/runs/{run_id}/cancel", content=b"", headers={**key, "Content-Type": content_type}
        )
        assert r.status_code == 415, (content_type, r.text)
        assert r.json()["error"]["type"] == "unsupported_media_type"
    assert app.get_run(run_id).status == "queued"
    r = client.post("/runs", json={"workflow": "idle"}, headers=key)
    assert r.status_code == 202  # JSON (and curl's bodiless POST) still work
    assert client.post(f"/runs/{run_id}/cancel", headers=key).status_code == 202


def test_security_headers_and_no_cdn_docs(app: ms.App, admin: str, client: TestClient) -> None:
    for r in (client.get("/healthz"), client.get("/runs", headers={"X-API-Key": admin})):
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert client.get("/runs", headers={"X-API-Key": admin}).headers["cache-control"] == "no-store"
    _login(client, admin)
    page = client.get("/ui/")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'nonce-" in csp
    nonce = csp.split("'nonce-", 1)[1].split("'", 1)[0]
    assert f'<script nonce="{nonce}">' in page.text
    assert page.headers["cache-control"] == "no-store"
    assert client.get("/docs").status_code == 404  # off by default: Swagger UI needs a CDN
    assert client.get("/openapi.json").status_code == 200
    with TestClient(create_app(app, webhooks=False, docs=True)) as with_docs:
        assert with_docs.get("/docs").status_code == 200


def test_a_reused_key_conflict_reveals_nothing_of_the_other_run(
    app: ms.App, admin: str, client: TestClient
) -> None:
    key = {"Authorization": f"Bearer {admin}"}
    first = client.post(
        "/runs", json={"workflow": "idle", "kwargs": {"note": "PRIVATE-NOTE-1"}, "key": "k1"}
    )
    assert first.status_code == 401  # (no key: nothing is created)
    first = client.post(
        "/runs",
        json={"workflow": "idle", "kwargs": {"note": "PRIVATE-NOTE-1"}, "key": "k1"},
        headers=key,
    )
    assert first.status_code == 202
    again = client.post(
        "/runs", json={"workflow": "idle", "kwargs": {"note": "other"}, "key": "k1"}, headers=key
    )
    assert again.status_code == 409
    assert "PRIVATE-NOTE" not in again.text
    assert "already names a run of 'idle' with other input" in again.json()["error"]["message"]


def test_database_files_are_created_owner_only(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the common umask, which would give 0644
    try:
        path = tmp_path / "private.db"
        app = ms.App(f"sqlite:///{path}")

        @app.workflow
        async def one(ctx: ms.RunContext) -> int:
            return 1

        assert asyncio.run(app.run(one)) == 1
        files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in files if p.exists()}
        app.close()
    finally:
        os.umask(old)
    assert f"{path.name}-wal" in modes, modes  # checked while the WAL was open
    assert set(modes.values()) == {0o600}, {k: oct(v) for k, v in modes.items()}


def test_out_of_range_numbers_are_4xx_or_ignored(
    app: ms.App, admin: str, client: TestClient
) -> None:
    _login(client, admin)
    r = client.get("/ui/?offset=9223372036854775808")
    assert r.status_code == 422, r.text
    run_id = app.submit("idle").run_id
    app.cancel(run_id)  # finished: its stream ends
    for last in ("999999999999999999999.1", "1.99999999999999999999999", "-5.-5", "x"):
        headers = {"Authorization": f"Bearer {admin}", "Last-Event-ID": last}
        with client.stream("GET", f"/runs/{run_id}/events", headers=headers) as stream:
            assert stream.status_code == 200
            text = "".join(stream.iter_text())
        assert "event: end" in text, (last, text)


def test_tracebacks_and_store_location_stay_with_admins(
    app: ms.App, admin: str, client: TestClient, tmp_path: Path
) -> None:
    @app.workflow
    async def broken(ctx: ms.RunContext) -> None:
        def fail() -> None:
            raise ValueError("bad row 7")

        await ctx.step(fail, name="load", retry=ms.RetryPolicy.never())

    reader = app.store.create_api_key("viewer", ["read"], app.clock.now())[1]
    app.store.add_webhook("http://127.0.0.1:9/hook", app.clock.now())
    run_id = app.submit("broken").run_id
    asyncio.run(app.worker().run(until_idle=True))
    assert "Traceback" in (app.get_run(run_id).error or "")  # kept for operators (CLI)
    as_reader = {"Authorization": f"Bearer {reader}"}
    as_admin = {"Authorization": f"Bearer {admin}"}
    seen = {
        "run": client.get(f"/runs/{run_id}", headers=as_reader).text,
        "steps": client.get(f"/runs/{run_id}/steps", headers=as_reader).text,
        "list": client.get("/runs", headers=as_reader).text,
    }
    with client.stream("GET", f"/runs/{run_id}/events", headers=as_reader) as events:
        seen["sse"] = "".join(events.iter_text())
    [delivery] = app.store.claim_deliveries(app.clock.now() + 1)
    seen["webhook"] = delivery.body().decode()
    _login(client, reader)
    seen["dashboard"] = client.get(f"/ui/runs/{run_id}").text
    for where, text in seen.items():
        assert "bad row 7" in text or where == "list", where  # the one-line error is there
        assert "Traceback" not in text and 'File "' not in text, where
    assert "Traceback" in client.get(f"/runs/{run_id}", headers=as_admin).text
    missing = client.get("/runs/nope", headers=as_reader)
    assert missing.status_code == 404
    assert "surface.db" not in missing.text and str(tmp_path) not in missing.text
    assert missing.json()["error"]["message"] == "no run 'nope'"


def test_lists_are_summaries(app: ms.App, admin: str, client: TestClient) -> None:
    @app.workflow
    async def big(ctx: ms.RunContext) -> str:
        return "x" * 100_000

    run_id = app.submit("big").run_id
    asyncio.run(app.worker().run(until_idle=True))
    key = {"Authorization": f"Bearer {admin}"}
    listed = client.get("/runs", headers=key)
    [row] = [r for r in listed.json()["runs"] if r["id"] == run_id]
    assert row["status"] == "succeeded" and row["output"] is None
    assert len(listed.content) < 10_000
    assert client.get(f"/runs/{run_id}", headers=key).json()["output"] == "x" * 100_000
    # The store does not even read the outputs for a list.
    [record] = app.list_runs(summary=True)
    assert record.id == run_id and record.output is None and record.input is None


def test_a_revoked_key_loses_its_open_streams(app: ms.App, tmp_path: Path) -> None:
    import socket
    import threading

    import httpx
    import uvicorn

    record, token = app.store.create_api_key("watcher", ["read"], app.clock.now())
    waiting = app.submit("idle").run_id
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(app, webhooks=False, events_poll_s=0.05),
            log_level="warning",
            timeout_graceful_shutdown=1,
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        for _ in range(1000):
            if server.started:
                break
            threading.Event().wait(0.02)
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=headers, timeout=20) as c:
            for path in (f"/runs/{waiting}/events", "/events"):
                with c.stream("GET", path) as stream:
                    assert stream.status_code == 200
                    chunks = stream.iter_raw()
                    assert next(chunks).startswith(b"retry:")
                    if path == "/events":
                        app.store.revoke_api_key(record.id, app.clock.now())
                    else:
                        app.store.revoke_api_key("nobody", app.clock.now())  # no effect
                        assert next(chunks)  # the stream goes on (a status event)
                        app.store.revoke_api_key(record.id, app.clock.now())
                    rest = b"".join(chunks)  # ends: the server closed it
                assert b"event: end" not in rest  # closed, not finished: the run still waits
                assert c.get(path).status_code == 401
                # Reinstate for the next stream (a new key with the same scope).
                record, token = app.store.create_api_key("watcher", ["read"], app.clock.now())
                c.headers["Authorization"] = f"Bearer {token}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def test_dashboard_sessions_are_opaque_and_end_with_logout_or_revocation(
    app: ms.App, client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    record, key = app.store.create_api_key("ana", ["read", "submit"], app.clock.now())
    run_id = app.submit("idle").run_id
    _login(client, key)
    session = client.cookies["mainspring_key"]
    assert key not in session and record.id not in session  # the cookie holds no key
    same = {"Origin": ORIGIN}
    assert client.get("/runs").status_code == 200
    assert client.get("/ui/").status_code == 200
    # Logout ends the session on the server: the old cookie, replayed, is worth nothing.
    assert client.post("/ui/logout", headers=same, follow_redirects=False).status_code == 303
    client.cookies.clear()
    client.cookies.set("mainspring_key", session)
    assert client.get("/runs").status_code == 401
    assert client.post(f"/runs/{run_id}/cancel", json={}, headers=same).status_code == 401
    assert client.get("/ui/", follow_redirects=False).status_code == 303  # to the login page
    # Revoking the key ends its sessions.
    client.cookies.clear()
    _login(client, key)
    assert client.get("/runs").status_code == 200
    app.store.revoke_api_key(record.id, app.clock.now())
    assert client.get("/runs").status_code == 401
    assert client.get("/ui/", follow_redirects=False).status_code == 303
    assert app.get_run(run_id).status == "queued"
    # Failed logins are logged and bounded per address.
    client.cookies.clear()
    form = {"Origin": ORIGIN, "Content-Type": "application/x-www-form-urlencoded"}
    with caplog.at_level("WARNING", logger="mainspring.auth"):
        codes = [
            client.post("/ui/login", content="key=msk_0123456789ab_guess", headers=form).status_code
            for _ in range(12)
        ]
    assert codes[:10] == [200] * 10 and codes[10:] == [429, 429]  # the form again, then 429
    assert "dashboard login failed from testclient (key id '0123456789ab')" in caplog.text
    assert "guess" not in caplog.text  # never the secret part


def test_secure_cookie_and_stream_cap(app: ms.App, admin: str) -> None:
    with TestClient(create_app(app, webhooks=False, secure_cookies=True)) as c:
        r = c.post(
            "/ui/login",
            content=f"key={admin}",
            headers={"Origin": ORIGIN, "Content-Type": "application/x-www-form-urlencoded"},
            follow_redirects=False,
        )
        cookie = r.headers["set-cookie"]
        assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    run_id = app.submit("idle").run_id
    app.cancel(run_id)
    with TestClient(create_app(app, webhooks=False, max_streams_per_key=0)) as c:
        r = c.get(f"/runs/{run_id}/events", headers={"Authorization": f"Bearer {admin}"})
        assert r.status_code == 429 and r.json()["error"]["type"] == "too_many_streams"


def _login(client: TestClient, key: str) -> None:
    """Log in to the dashboard as a browser would (same origin): the session cookie."""
    r = client.post(
        "/ui/login",
        content=f"key={key}",
        headers={
            "Origin": "http://testserver",
            "Content-Type": "application/x-www-form-urlencoded",
        },
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    assert client.cookies.get("mainspring_key", "").startswith("mss_")


def test_streams_end_after_their_lifetime_and_resume(app: ms.App, admin: str) -> None:
    run_id = app.submit("idle").run_id  # waits for ever: only the lifetime ends its stream
    headers = {"Authorization": f"Bearer {admin}"}
    with TestClient(create_app(app, webhooks=False, max_stream_s=0.2)) as c:
        for path in ("/events", f"/runs/{run_id}/events"):
            with c.stream("GET", path, headers=headers) as stream:
                text = "".join(stream.iter_text())  # returns: the server ended it
            assert text.startswith("retry:") and "event: end" not in text, text


def test_admin_operations_are_app_methods_on_the_apps_clock(tmp_path: Path) -> None:
    """What the CLI, the server and the dashboard call: keys and webhooks through the
    App, stamped with its clock, refused with a ConfigError when malformed."""
    clock = ms.FakeClock(1_000.0)
    app = ms.App(f"sqlite:///{tmp_path / 'admin.db'}", clock=clock)
    key, token = app.admin.create_key("ci", ["submit", "read"])
    assert key.scopes == ("read", "submit") and key.created_at == 1_000.0  # SCOPES order
    assert app.admin.get_key("nope") is None and app.admin.verify_key("msk_nope_x") is None
    clock.advance(100)
    assert app.admin.verify_key(token) == key  # genuine; its use is recorded
    used = app.admin.get_key(key.id)
    assert used is not None and used.last_used_at == 1_100.0
    assert app.admin.revoke_key(key.id) and not app.admin.revoke_key(key.id)
    revoked = app.admin.get_key(key.id)
    assert revoked is not None and revoked.revoked_at == 1_100.0 and not revoked.allows("read")
    assert [k.id for k in app.admin.list_keys()] == [key.id]
    hook, secret = app.admin.add_webhook("https://example.com/h", events=["run.failed"], secret="s")
    assert (hook.events, hook.created_at, secret) == (("run.failed",), 1_100.0, "s")
    assert app.admin.list_webhooks() == [hook] and app.admin.remove_webhook(hook.id)
    assert not app.admin.remove_webhook(hook.id) and app.admin.list_webhooks() == []
    for bad in (
        lambda: app.admin.create_key("x", ["root"]),
        lambda: app.admin.create_key(" ", ["read"]),
        lambda: app.admin.add_webhook("ftp://example.com"),
        lambda: app.admin.add_webhook("https://example.com", events=["run.exploded"]),
    ):
        with pytest.raises(ms.ConfigError):
            bad()
    app.close()


def test_failed_logins_are_throttled_not_the_holder_of_a_valid_key(app: ms.App) -> None:
    """Ten failures from one address (everyone behind one NAT) or with one key id (from
    any address) throttle further failures with 429; a valid key still logs in, from
    that address and with that key id."""
    record, key = app.store.create_api_key("ana", ["read"], app.clock.now())
    form = {"Origin": ORIGIN, "Content-Type": "application/x-www-form-urlencoded"}
    api = create_app(app, webhooks=False)

    def attempt(address: str, token: str) -> int:
        with TestClient(api, client=(address, 40000)) as c:
            r = c.post("/ui/login", content=f"key={token}", headers=form, follow_redirects=False)
            return r.status_code

    nat = "203.0.113.7"
    codes = [attempt(nat, f"msk_0123456789ab_guess{i}") for i in range(10)]
    assert codes == [200] * 10  # the form again, with the error
    assert attempt(nat, "msk_ba9876543210_other") == 429  # this address is throttled
    assert attempt(nat, key) == 303  # but ana, behind the same NAT, logs in
    assert attempt(nat, "msk_ba9876543210_other") == 429  # (her login reset nothing)
    assert attempt("198.51.100.1", "msk_ba9876543210_other") == 200  # other addresses: no
    # One key id guessed from many addresses: that key id is throttled everywhere...
    secret_guesses = [attempt(f"192.0.2.{i}", f"msk_{record.id}_guess{i}") for i in range(10)]
    assert secret_guesses == [200] * 10
    assert attempt("192.0.2.200", f"msk_{record.id}_guess") == 429
    assert attempt("192.0.2.200", "msk_ba9876543210_fresh") == 200  # a fresh address, id
    assert attempt("192.0.2.201", key) == 303  # ...and its holder still logs in
