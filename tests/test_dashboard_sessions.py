"""Dashboard sessions live in the database (hashed, with an expiry): they survive a
restart of `mainspring serve`, work on every `serve` over the same database, and end
everywhere at logout; scripts use their key on the API instead (docs/dashboard.md)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from _stack import Stack

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

import mainspring as ms
from mainspring.server import create_app

ORIGIN = "http://testserver"
FORM = {"Origin": ORIGIN, "Content-Type": "application/x-www-form-urlencoded"}


def _login(client: TestClient, key: str) -> str:
    r = client.post("/ui/login", content=f"key={key}", headers=FORM, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/", r.text
    return client.cookies["mainspring_key"]


def test_a_session_works_on_every_server_of_the_database_and_ends_everywhere(
    app: ms.App, db_url: str
) -> None:
    record, key = app.admin.create_key("ana", ["read", "submit"])
    other = ms.App(db_url)  # a second `serve` over the same database
    try:
        with (
            TestClient(create_app(app, webhooks=False)) as a,
            TestClient(create_app(other, webhooks=False)) as b,
        ):
            session = _login(a, key)
            b.cookies.set("mainspring_key", session)
            assert b.get("/runs").status_code == 200
            assert b.get("/ui/", follow_redirects=False).status_code == 200
            # Logout on one server ends the session on the other.
            assert b.post("/ui/logout", headers={"Origin": ORIGIN}).status_code == 200
            assert a.get("/runs").status_code == 401
            assert a.get("/ui/", follow_redirects=False).status_code == 303
            # Revoking the key ends its sessions too.
            _login(a, key)
            assert a.get("/runs").status_code == 200
            app.admin.revoke_key(record.id)
            assert a.get("/runs").status_code == 401
    finally:
        other.close()


def test_sessions_are_stored_hashed_and_expire(tmp_path: Path) -> None:
    clock = ms.FakeClock(1_000.0)
    path = tmp_path / "sessions.db"
    app = ms.App(f"sqlite:///{path}", clock=clock)
    _, key = app.admin.create_key("ana", ["read"])
    with TestClient(create_app(app, webhooks=False)) as client:
        session = _login(client, key)
        assert client.get("/runs").status_code == 200
        clock.advance(7 * 86400 - 1)
        assert client.get("/runs").status_code == 200
        clock.advance(2)  # a week after the login: over
        assert client.get("/runs").status_code == 401
        assert client.get("/ui/", follow_redirects=False).status_code == 303
        assert app.store.session_key_id(session, clock.now()) is None
    app.close()
    data = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith(path.name))
    assert session.encode() not in data and session[4:].encode() not in data


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_session_survives_a_restart_of_serve(stack: Stack) -> None:
    import httpx

    stack.serve("--no-webhooks")
    login = httpx.post(
        f"{stack.base}/ui/login",
        data={"key": stack.admin},
        headers={"Origin": stack.base},
        follow_redirects=False,
    )
    assert login.status_code == 303
    cookie = {"Cookie": f"mainspring_key={login.cookies['mainspring_key']}"}
    assert httpx.get(f"{stack.base}/runs", headers=cookie).status_code == 200
    server = stack.procs.pop("server")
    server.send_signal(signal.SIGKILL)  # not even a clean stop
    server.wait(10)
    stack.serve("--no-webhooks")  # a new process, same database and port
    assert httpx.get(f"{stack.base}/runs", headers=cookie).status_code == 200
    page = httpx.get(f"{stack.base}/ui/", headers=cookie, follow_redirects=False)
    assert page.status_code == 200
    out = httpx.post(f"{stack.base}/ui/logout", headers={**cookie, "Origin": stack.base})
    assert out.status_code == 303
    assert httpx.get(f"{stack.base}/runs", headers=cookie).status_code == 401
