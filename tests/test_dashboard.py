"""The dashboard in a real headless Chromium (Debian's), driven by Playwright: log in,
watch a run progress live, approve its request with a click, see it finish."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
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
    names = page.locator("#steps tr.step td.name .label").all_text_contents()
    assert names == ["go", *(f"check-{i}" for i in range(8)), "approval:publish", "publish"]
    # A workflow without model calls is a plain waterfall: no turns, the waits drawn as such.
    assert page.locator("#steps tbody.turn").count() == 0
    assert page.locator("#steps tbody.plain tr.role-wait .seg.wait").count() == 2
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


@pytest.fixture(scope="module")
def agent_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, str]]:
    """A server over two real agent runs (a scripted model): ~260 steps with a refusal,
    an approval and a retried tool call, and 1,200 steps. The database lives in memory
    (/dev/shm) where there is one: a journal commit there costs no disk flush."""
    from _stack import Stack
    from test_dashboard_timeline import agent_run

    tmp = tmp_path_factory.mktemp("dashboard-runs")
    shm = Path("/dev/shm")
    where = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else tmp
    db_url = f"sqlite:///{where / 'runs.db'}"
    try:
        agent = agent_run(db_url, 52, refuse_at=7, approve_at=20, flaky_at=12)
        long = agent_run(db_url, 240)
        stack = Stack(tmp, db_url)
        try:
            stack.serve("--no-worker", "--no-webhooks")
            yield stack, agent, long
        finally:
            stack.close()
    finally:
        if where != tmp:
            shutil.rmtree(where, ignore_errors=True)


def _login(browser: Any, stack: Any) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(20_000)
    page.goto(f"{stack.base}/ui/login")
    page.fill("#key", stack.admin)
    page.click("#login")
    page.wait_for_url(f"{stack.base}/ui/")
    return page


def _rows(page: Any, selector: str = "#steps tr.step") -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = page.eval_on_selector_all(
        selector,
        """rows => rows.map(r => ({role: r.dataset.role, turn: Number(r.dataset.turn),
            label: r.querySelector('.label').textContent, height: r.offsetHeight}))""",
    )
    return rows


def test_an_agent_run_reads_turn_by_turn(
    agent_runs: tuple[Any, str, str], browser: Any, tmp_path: Path
) -> None:
    stack, run_id, _ = agent_runs
    page = _login(browser, stack)
    url = f"{stack.base}/ui/runs/{run_id}"
    page.goto(url)
    assert page.text_content("#turn-count") == "52"
    # It opens at its live end: the last page, its newest turns.
    assert page.get_attribute("#pager", "data-page") == "3"
    live_end = _rows(page)
    assert [r["turn"] for r in live_end][-1] == 52
    page.goto(url + "?page=1")
    turns = page.locator("#steps tbody.turn")
    assert turns.count() == 25  # a page of turns
    rows = _rows(page)
    # Model and tool calls only: the recorded values and rate-limit bookings are hidden.
    assert {r["role"] for r in rows} == {"model", "tool", "wait"}
    assert page.get_attribute("#step-count", "data-steps") == str(
        len(stack.app.observe.steps(run_id))
    )
    assert "106 internal rows hidden" in page.text_content("#hidden-note")
    assert all(r["label"] == "scripted:scripted" for r in rows if r["role"] == "model")
    # The first turn: its model call and two tool calls, tokens, cost and latency.
    first = page.locator("#turn-1")
    head = first.locator("tr.turn-head td").all_text_contents()
    assert head[0] == "completed" and head[1].endswith(" s") and head[2] == "800 / 60"
    assert head[3] == "$0.003300"
    assert first.locator("tr.step .label").all_text_contents() == [
        "scripted:scripted", "lookup", "fetch",
    ]  # fmt: skip
    # Durations (and everything else) stay on one line: every row is as tall as another.
    heights = {r["height"] for r in rows}
    assert max(heights) - min(heights) <= 2, heights
    assert page.locator("#usage-chart polyline.tokens").count() == 1
    assert page.locator("#usage-chart polyline.cost").count() == 1
    # The refused call (turn 8): failed with a 429, the wait for a slot, the call again.
    refused = page.locator("#turn-8")
    assert refused.locator("tr.step .error").all_text_contents() == ["429"]
    assert refused.locator("tr.role-wait .seg.wait").count() == 1
    assert "1 retry" in refused.locator("tr.turn-head").inner_text()
    # The approval (turn 21): a long wait drawn as one, before the tool calls it allowed.
    approved = page.locator("#turn-21")
    assert approved.locator("tr.role-wait .seg.wait").count() == 1
    assert "waited 40" in approved.locator("tr.turn-head").inner_text()
    page.screenshot(path=str(tmp_path / "agent-run.png"), full_page=True)

    # Shown on request, with a link (no JavaScript needed): every row of the page's turns.
    page.click("#show-internal")
    page.wait_for_url("**internal=1")
    shown = _rows(page)
    assert {"internal", "rate"} <= {r["role"] for r in shown}
    assert len(shown) > len(live_end)  # the live end's page, with its bookkeeping
    page.click("#hide-internal")
    page.wait_for_url(url + "?")

    # Filters: errors only, then tool calls of turns 10 to 12 (a plain GET form).
    page.check("#timeline-filters input[name=errors]")
    page.click("#apply-filters")
    page.wait_for_url("**errors=1**")
    errors = _rows(page)
    assert [(r["turn"], r["label"]) for r in errors] == [(8, "scripted:scripted"), (13, "fetch")]
    flaky = page.locator("#turn-13 tr.step")
    assert "attempt 2" in flaky.inner_text() and "ConnectionError" in flaky.inner_text()
    assert flaky.locator(".seg.retry").count() == 1  # the failed attempt and its back-off
    page.screenshot(path=str(tmp_path / "agent-errors.png"), full_page=True)
    page.uncheck("#timeline-filters input[name=errors]")
    page.select_option("#timeline-filters select[name=kind]", "tool")
    page.fill("#timeline-filters input[name=first]", "10")
    page.fill("#timeline-filters input[name=last]", "12")
    page.click("#apply-filters")
    page.wait_for_url("**kind=tool**")
    picked = _rows(page)
    assert [(r["turn"], r["label"]) for r in picked] == [
        (10, "lookup"), (10, "fetch"), (11, "lookup"), (11, "fetch"), (12, "lookup"), (12, "fetch"),
    ]  # fmt: skip
    assert page.text_content("#matched") == "6 of 264 steps match"

    # Paging, and each turn on its own scale.
    page.goto(url + "?page=1")
    page.click("#page-next")
    page.wait_for_url("**page=2")
    assert page.get_attribute("#pager", "data-page") == "2"
    assert page.locator("#steps tbody.turn").first.get_attribute("data-turn") == "26"
    page.click("#scale-turn")
    page.wait_for_url("**scale=turn**")
    assert page.locator("#steps tbody.turn").first.get_attribute("data-turn") == "26"
    page.screenshot(path=str(tmp_path / "agent-page2-zoomed.png"), full_page=True)


def test_a_1200_step_run_renders_one_page(
    agent_runs: tuple[Any, str, str], browser: Any, tmp_path: Path
) -> None:
    stack, _, run_id = agent_runs
    assert len(stack.app.observe.steps(run_id)) >= 1_199
    page = _login(browser, stack)
    url = f"{stack.base}/ui/runs/{run_id}"
    started = time.monotonic()
    response = page.goto(url)
    took = time.monotonic() - started
    assert response is not None and response.ok
    assert took < 5.0, took
    assert len(response.body()) < 250_000  # one page of it, not 1,200 rows of HTML
    assert page.text_content("#turn-count") == "240"
    assert page.get_attribute("#pager", "data-pages") == "10"
    assert page.get_attribute("#pager", "data-page") == "10"  # the live end
    page.click("#page-first")
    page.wait_for_url("**page=1")
    assert page.locator("#steps tbody.turn").count() == 25
    rows = _rows(page)
    assert len(rows) == 25 * 3  # a model call and two tool calls a turn
    assert {r["role"] for r in rows} == {"model", "tool"}
    page.screenshot(path=str(tmp_path / "long-run.png"))
    page.click("#page-last")
    page.wait_for_url("**page=10")
    numbers = page.eval_on_selector_all(
        "#steps tbody.turn", "ts => ts.map(t => Number(t.dataset.turn))"
    )
    assert numbers == list(range(226, 241))
    page.goto(url + "?internal=1&page=3")
    assert {"internal", "rate"} <= {r["role"] for r in _rows(page)}
    page.screenshot(path=str(tmp_path / "long-run-internal.png"))
