"""The dashboard in a real headless Chromium (Debian's), driven by Playwright: log in,
watch a run progress live, approve its request with a click, see it finish."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "dashboard"

pytestmark = [
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is missing: apt-get install chromium chromium-driver (.ci/run does)",
    ),
]


@pytest.fixture
def browser() -> Any:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield chromium
        chromium.close()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_watch_a_run_live_and_approve_it(stack: Any, browser: Any) -> None:
    stack.serve("--worker", "--no-webhooks")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(20_000)

    page.goto(f"{stack.base}/ui/")
    assert page.url.endswith("/ui/login")
    page.fill("#key", "msk_wrong_key")
    page.click("#login")
    assert "not valid" in page.text_content("#login-error")
    page.fill("#key", stack.admin)
    page.click("#login")
    page.wait_for_url(f"{stack.base}/ui/")

    ops = stack.client(stack.admin)
    run_id = ops.post("/runs", json={"workflow": "release", "args": [8, 0.5]}).json()["id"]
    row = page.locator(f"#run-{run_id}")
    row.wait_for()  # appeared without a reload: the list follows /events
    page.screenshot(path=str(ARTIFACTS / "runs.png"))

    row.locator("a").click()
    page.wait_for_url(f"{stack.base}/ui/runs/{run_id}")
    steps = page.locator("#steps tr.step")
    assert steps.count() <= 1  # only the wait for "go": everything else arrives live
    ops.post(f"/runs/{run_id}/signals", json={"name": "go"})
    # Steps keep arriving while the page stays open (one every 0.5 s).
    page.wait_for_function("() => document.querySelectorAll('#steps tr.step').length > 3")
    request = page.locator('[data-request="approval:publish"]')
    request.wait_for()
    assert page.text_content("#run-status") == "waiting"
    assert '"tag": "v1"' in request.inner_text()
    page.screenshot(path=str(ARTIFACTS / "run-waiting.png"), full_page=True)

    request.locator("summary").click()
    request.locator("textarea.arguments").fill('{"tag": "v2"}')
    request.locator("button.edit").click()
    page.wait_for_function(
        "() => document.getElementById('run-status')?.textContent === 'succeeded'"
    )
    assert "published v2 (approved by ops)" in page.text_content("#output")
    # The run's status and its last rows are separate events of one commit: the row
    # may arrive a moment after the status.
    page.wait_for_function("() => document.querySelectorAll('#steps tr.step').length >= 11")
    names = page.locator("#steps tr.step td:nth-child(3)").all_text_contents()
    assert names == ["go", *(f"check-{i}" for i in range(8)), "approval:publish", "publish"]
    page.screenshot(path=str(ARTIFACTS / "run-done.png"), full_page=True)
    assert stack.app.get_run(run_id).status == "succeeded"


ATTACK_PAGE = """<!doctype html><html><body>
<iframe id="framed" src="{base}/ui/"></iframe>
<form id="f" method="post" action="{base}/runs/{run_id}/cancel" target="sink"></form>
<form id="g" method="post" action="{base}/runs/{run_id}/signals" enctype="text/plain"
  target="sink2"><input name='{{"name":"go","x":"' value='"}}'></form>
<iframe name="sink"></iframe><iframe name="sink2"></iframe>
<script>
  document.getElementById("f").submit();
  document.getElementById("g").submit();
  fetch("{base}/runs/{run_id}/retry", {{method: "POST", credentials: "include", mode: "no-cors"}});
  fetch("{base}/runs/{run_id}/cancel", {{method: "POST", credentials: "include",
    mode: "no-cors", headers: {{"Content-Type": "text/plain"}}, body: "{{}}"}})
    .finally(() => {{ document.title = "sent"; }});
</script></body></html>"""


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_page_on_another_origin_cannot_act_or_frame(stack: Any, browser: Any) -> None:
    """Logged in to the dashboard, the reviewer visits a page on another port of the
    same host (same site, so the SameSite=Strict cookie is sent): its forms and
    fetches are refused and it cannot frame the dashboard."""
    import http.server
    import threading

    from _stack import free_port

    stack.serve("--no-worker", "--no-webhooks")
    ops = stack.client(stack.admin)
    run_id = ops.post("/runs", json={"workflow": "steps_then_wait", "args": [0, 0]}).json()["id"]
    page_html = ATTACK_PAGE.format(base=stack.base, run_id=run_id).encode()

    class Evil(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page_html)

        def log_message(self, *args: Any) -> None:
            pass

    evil = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        page = browser.new_page()
        page.set_default_timeout(20_000)
        page.goto(f"{stack.base}/ui/login")
        page.fill("#key", stack.admin)
        page.click("#login")
        page.wait_for_url(f"{stack.base}/ui/")
        page.goto(f"http://127.0.0.1:{evil.server_address[1]}/")
        page.wait_for_function("() => document.title === 'sent'")
        page.wait_for_timeout(500)  # let the forms' navigations land
        framed = page.frame_locator("#framed")
        # Refused to be framed: Chromium shows its error page, not the dashboard.
        assert framed.locator("body").inner_text(timeout=2000).strip() != ""
        assert framed.locator("table, #key, #run-status").count() == 0
    finally:
        evil.shutdown()
        evil.server_close()
    run = ops.get(f"/runs/{run_id}").json()
    assert run["status"] == "queued", run  # not cancelled, not signalled
    assert ops.get(f"/runs/{run_id}/steps").json()["steps"] == []
