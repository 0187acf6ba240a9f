"""Cross-site requests riding the dashboard's cookie, in a real headless Chromium
(Debian's), driven by Playwright: a page on another port of the same host (same site,
so the SameSite=Strict cookie goes along) posts a cancel, while the browser adds a
reverse proxy's Basic credentials to every request to the server, as browsers do once
a user has logged in to such a proxy."""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from _helpers import uvicorn_serving

import mainspring as ms

CHROMIUM = "/usr/bin/chromium"

pytestmark = [
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is missing: apt-get install chromium chromium-driver (.ci/run does)",
    ),
    pytest.mark.parametrize("db_url", ["sqlite"], indirect=True),
]

ATTACK = """<!doctype html><title>cats</title><script>
fetch(%r, {method: "POST", mode: "no-cors", credentials: "include"})
  .finally(() => { document.title = "sent"; });
</script>"""


@pytest.fixture
def browser() -> Any:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def served(db_url: str) -> Iterator[tuple[str, ms.App]]:
    app = ms.App(db_url)

    @app.workflow
    async def idle(ctx: ms.RunContext) -> Any:
        return await ctx.wait_for("go")

    try:
        with uvicorn_serving(app) as base:
            yield base, app
    finally:
        app.close()


def _attacker(target: str) -> tuple[ThreadingHTTPServer, str]:
    """A page on another port of 127.0.0.1 that POSTs to ``target``."""
    page = (ATTACK % target).encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def test_a_page_on_another_port_cannot_cancel_through_a_proxys_basic_auth(
    served: tuple[str, ms.App], browser: Any
) -> None:
    base, app = served
    key = app.admin.create_key("ana", ["read", "submit"])[1]
    run_id = app.submit("idle").run_id
    basic = base64.b64encode(b"ana:proxy-password").decode()
    # What a browser sends by itself to a host behind a Basic-auth proxy.
    context = browser.new_context(extra_http_headers={"Authorization": f"Basic {basic}"})
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{base}/ui/login")
    page.fill("#key", key)
    page.click("#login")
    page.wait_for_url(f"{base}/ui/")  # logged in: the session cookie is set

    evil, evil_url = _attacker(f"{base}/runs/{run_id}/cancel")
    try:
        with page.expect_response(lambda r: r.url.endswith("/cancel")) as answered:
            page.goto(evil_url)
        response = answered.value
        assert response.request.all_headers()["authorization"].startswith("Basic ")
        # Refused for the cookie it carried: with the Basic header alone it would be a 401.
        assert response.status == 403
        assert app.get_run(run_id).status == "queued"
        # The dashboard's own page, same cookie and same Basic header, still cancels.
        page.goto(f"{base}/ui/runs/{run_id}")
        status = page.evaluate(
            """async url => (await fetch(url, {method: "POST", headers:
                 {"Content-Type": "application/json"}, body: "{}"})).status""",
            f"{base}/runs/{run_id}/cancel",
        )
        assert status == 202
        assert app.get_run(run_id).status == "cancelled"
    finally:
        evil.shutdown()
        evil.server_close()
        context.close()
