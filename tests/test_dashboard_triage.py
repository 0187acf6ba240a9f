"""The dashboard as an operator triages with it, in a real headless Chromium: the runs
list (last activity, age, duration, tokens and cost, the error's first line, markers,
filters, relative times), a parent's page with its children's totals, the approval
card (readable preview, edit, the cost so far, the timeout's consequence, and an
irreversible action that the keyboard cannot approve without confirming), the workers
page, and WCAG AA contrast and labels on every page."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _stack import until

from mainspring.storage import WorkerBeat

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "dashboard"

pytestmark = [
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is missing: apt-get install chromium chromium-driver (.ci/run does)",
    ),
]

# Every text node's colour against the background it is drawn on (the nearest opaque
# background of its ancestors), as WCAG 2 computes contrast; large text (24 px, or
# 18.66 px bold) needs 3:1, the rest 4.5:1. Returns the failures.
CONTRAST_JS = """() => {
  const rgb = (s) => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const background = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length >= 3 && (c.length < 4 || c[3] > 0.5)) return c;
    }
    return [255, 255, 255];
  };
  const bad = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!n.textContent.trim() || !el || el.closest("script, style, [hidden]")) continue;
    if (!el.getClientRects().length) continue;
    const style = getComputedStyle(el);
    if (style.visibility === "hidden" || Number(style.opacity) === 0) continue;
    let fg = rgb(style.color);
    if (el.closest("svg")) fg = rgb(style.fill || style.color);
    const a = lum(fg.slice(0, 3)), b = lum(background(el));
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const size = parseFloat(style.fontSize), bold = Number(style.fontWeight) >= 700;
    const need = size >= 24 || (bold && size >= 18.66) ? 3 : 4.5;
    const text = n.textContent.trim().slice(0, 40);
    if (ratio < need) bad.push(`${ratio.toFixed(2)} ${fg} on ${background(el)}: ${text}`);
  }
  return bad;
}"""

# Every form control a person can reach has an accessible name.
LABELS_JS = """() => [...document.querySelectorAll("input, select, textarea")]
  .filter((e) => e.type !== "hidden")
  .filter((e) => !(e.labels && e.labels.length) && !e.getAttribute("aria-label")
    && !e.getAttribute("aria-labelledby") && !e.getAttribute("title"))
  .map((e) => e.outerHTML.slice(0, 80))"""


def _accessible(page: Any, what: str) -> None:
    assert page.evaluate(LABELS_JS) == [], f"{what}: inputs without a label"
    low = page.evaluate(CONTRAST_JS)
    assert low == [], f"{what}: text below WCAG AA contrast: {low}"


@pytest.fixture
def browser() -> Any:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def triage(tmp_path: Path) -> Iterator[tuple[Any, dict[str, str]]]:
    """A server with an embedded worker over tests/apps/triage_app.py, with a parent
    whose three children are done (it waits for its approval), an agent waiting for
    an irreversible refund's approval, a failed run, a long agent run (60 turns) and a
    worker that died an hour ago."""
    from _stack import Stack
    from test_dashboard_timeline import agent_run

    db_url = f"sqlite:///{tmp_path / 'triage.db'}"
    long = agent_run(db_url, 60)
    stack = Stack(tmp_path, db_url)
    try:
        now = time.time()
        stack.app.store.heartbeat(
            runs=[],
            now=now - 3600,
            lease_s=15,
            worker=WorkerBeat(
                id="old-host:4242:dead01", host="old-host", pid=4242,
                started_at=now - 7200, lease_s=15,
            ),
        )  # fmt: skip
        stack.serve("--worker", "--no-webhooks", target="apps.triage_app:app")
        ops = stack.client(stack.admin)
        runs = {"long": long}
        runs["brief"] = ops.post(
            "/runs", json={"workflow": "brief", "args": [["tides", "winds", "reefs"]]}
        ).json()["id"]
        runs["payer"] = ops.post(
            "/runs", json={"workflow": "payer", "args": ["refund order A-7"]}
        ).json()["id"]
        runs["flaky"] = ops.post("/runs", json={"workflow": "flaky", "args": [7]}).json()["id"]

        def settled() -> bool:
            got = {k: stack.app.get_run(v).status for k, v in runs.items()}
            return got == {
                "long": "succeeded", "brief": "waiting", "payer": "waiting", "flaky": "failed",
            }  # fmt: skip

        until(settled, "the runs to reach their states", timeout=60)
        yield stack, runs
    finally:
        stack.close()


def _login(browser: Any, stack: Any) -> Any:
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(20_000)
    page.goto(f"{stack.base}/ui/login")
    _accessible(page, "login")
    page.fill("#key", stack.admin)
    page.click("#login")
    page.wait_for_url(f"{stack.base}/ui/")
    return page


def _cells(page: Any, run_id: str) -> dict[str, str]:
    row = page.locator(f"#run-{run_id}")
    return {
        name: row.locator(f"td.{name}").inner_text().strip()
        for name in ("last-activity", "age", "duration", "tokens", "cost")
    }


def test_the_runs_list_is_built_for_triage(
    triage: tuple[Any, dict[str, str]], browser: Any
) -> None:
    stack, runs = triage
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = _login(browser, stack)
    children = [c.id for c in stack.app.children(runs["brief"])]
    assert len(children) == 3
    for run_id in [*runs.values(), *children]:
        page.locator(f"#run-{run_id}").wait_for()
    # A child's tokens and cost; the parent's own are none (its children spent them).
    child = _cells(page, children[0])
    assert child["tokens"] == "22,000" and child["cost"] == "$0.0960"
    assert _cells(page, runs["brief"])["tokens"] == ""
    marks = page.locator(f"#run-{children[0]} .mark").all_text_contents()
    assert marks == ["child"]
    assert runs["brief"] in page.get_attribute(f"#run-{children[0]} .mark", "title")
    # The error's first line, never the rest of the message.
    error = page.inner_text(f"#run-{runs['flaky']} .run-error")
    assert error == "ValueError: order 7 isn't valid"
    # Relative times, with the absolute time in a title.
    stamp = page.locator(f"#run-{runs['flaky']} td.last-activity time")
    assert stamp.inner_text().endswith("ago") or stamp.inner_text() == "just now"
    assert stamp.get_attribute("title").endswith(" UTC")
    assert _cells(page, runs["flaky"])["duration"].endswith(("ms", " s"))
    # A run retried after it failed (and failed again) says so.
    ops = stack.client(stack.admin)
    assert ops.post(f"/runs/{runs['flaky']}/retry").status_code == 202
    until(lambda: stack.app.get_run(runs["flaky"]).status == "failed", "the retry to fail", 30)
    assert stack.app.get_run(runs["flaky"]).retries == 1
    page.reload()
    assert page.locator(f"#run-{runs['flaky']} .mark").all_text_contents() == ["retried 1×"]
    page.screenshot(path=str(ARTIFACTS / "runs-triage.png"))
    _accessible(page, "runs")

    # Filters: by workflow, then text search; both kept by the status links.
    page.select_option("#filter-workflow", "researcher")
    page.click("#apply-run-filters")
    page.wait_for_url("**workflow=researcher**")
    shown = page.eval_on_selector_all("#runs tbody tr", "rs => rs.map(r => r.id)")
    assert sorted(shown) == sorted(f"run-{c}" for c in children)
    assert "workflow=researcher" in page.get_attribute("#status-filters a.on", "href")
    page.goto(f"{stack.base}/ui/")
    page.fill("#filter-q", "isn't valid")
    page.click("#apply-run-filters")
    page.wait_for_url("**q=**")
    shown = page.eval_on_selector_all("#runs tbody tr", "rs => rs.map(r => r.id)")
    assert shown == [f"run-{runs['flaky']}"]

    # Last activity moves with every step of a busy run: a run taking steps is drawn
    # again with a newer time (its run row's updated_at does not move with steps).
    busy = ops.post(
        "/runs", json={"workflow": "brief", "args": [["a", "b", "c", "d", "e", "f"]]}
    ).json()["id"]
    page.goto(f"{stack.base}/ui/?workflow=brief")
    page.locator(f"#run-{busy}").wait_for()
    until(lambda: stack.app.get_run(busy).status == "waiting", "the busy parent to finish", 60)
    record = stack.app.get_run(busy)
    last = max(s.finished_at or s.started_at for s in stack.app.observe.steps(busy))
    assert last > record.created_at
    page.reload()
    shown_ts = float(page.get_attribute(f"#run-{busy} td.last-activity time", "data-ts"))
    assert shown_ts == pytest.approx(max(last, record.updated_at))

    # The replay gate from the runs list: a run of a workflow this code no longer has
    # (an older deployment's), named with what to do; every other unfinished run clean.
    stack.app.store.create_run(
        run_id="retired0000001", workflow="retired", input="[]", key=None, now=time.time()
    )
    page.goto(f"{stack.base}/ui/")
    page.click("#replay-check-run")
    page.locator("#replay-retired0000001").wait_for()
    summary = page.inner_text("#replay-check-summary")
    unfinished = len(stack.app.list_runs(status=["queued", "running", "sleeping", "waiting"]))
    assert summary.startswith(f"{unfinished - 1} of {unfinished} unfinished runs replay cleanly")
    cells = page.locator("#replay-retired0000001 td").all_inner_texts()
    assert cells[1:4] == ["retired", "-", "unknown workflow"]
    assert "keep the workflow registered" in page.inner_text("#replay-check-hints")
    _accessible(page, "runs with the replay check")


def test_a_parent_shows_its_childrens_spending_and_its_approval_card(
    triage: tuple[Any, dict[str, str]], browser: Any
) -> None:
    stack, runs = triage
    page = _login(browser, stack)
    page.goto(f"{stack.base}/ui/runs/{runs['brief']}")
    # Three children of 22,000 tokens and $0.0960 each; the parent spent nothing itself.
    assert page.inner_text("#family-total") == "66,000 tokens · $0.2880"
    assert "this run 0 · $0" in page.inner_text("#family-usage")
    rows = page.locator("#children-usage tbody tr")
    assert rows.count() == 3
    first = rows.first.locator("td").all_text_contents()
    assert first[1:5] == ["researcher", "succeeded", "22,000", "$0.0960"]
    assert first[5].endswith(("ms", " s"))
    # The approval card: a readable preview, what was spent, what the timeout does.
    card = page.locator('[data-request="approval:publish"]')
    preview = card.locator("pre.preview").inner_text()
    assert "it's the team's brief — café notes" in preview and "\\u" not in preview
    assert card.locator(".spent").inner_text().startswith("$0.2880 · 66,000 tokens")
    assert "approved by default" in card.locator(".on-timeout").inner_text()
    assert card.locator("details.edit-arguments").count() == 1  # ctx.approval takes arguments
    page.screenshot(path=str(ARTIFACTS / "run-parent.png"), full_page=True)
    _accessible(page, "the parent's page")
    _axis_labels_apart(page)

    # A long run opens at its live end: the last page of turns, the newest.
    page.set_viewport_size({"width": 1024, "height": 900})
    page.goto(f"{stack.base}/ui/runs/{runs['long']}")
    assert page.get_attribute("#pager", "data-page") == page.get_attribute("#pager", "data-pages")
    turns = page.eval_on_selector_all("#steps tbody.turn", "ts => ts.map(t => +t.dataset.turn)")
    assert turns[-1] == 60 and turns[0] > 25
    _axis_labels_apart(page)  # minutes long, in a narrow window
    page.click("#page-first")
    page.wait_for_url("**page=1")
    assert page.locator("#steps tbody.turn").first.get_attribute("data-turn") == "1"


def _axis_labels_apart(page: Any) -> None:
    """The time axis's labels never overlap."""
    boxes = page.eval_on_selector_all(
        "#steps thead .ticks span",
        "ss => ss.map(s => { const b = s.getBoundingClientRect(); return [b.left, b.right]; })",
    )
    assert len(boxes) >= 2
    for (_, right), (left, _) in itertools.pairwise(boxes):
        assert right <= left, boxes


def test_the_keyboard_cannot_approve_an_irreversible_action_without_confirming(
    triage: tuple[Any, dict[str, str]], browser: Any
) -> None:
    stack, runs = triage
    page = _login(browser, stack)
    page.goto(f"{stack.base}/ui/runs/{runs['payer']}")
    card = page.locator('[data-request^="approval:"]')
    assert card.get_attribute("data-irreversible") == "1"
    assert "cannot be undone" in card.inner_text()
    assert '"note": "the customer\'s card"' in card.locator("pre.preview").inner_text()
    assert "no timeout" in card.locator(".on-timeout").inner_text()
    assert card.locator("textarea.arguments").input_value().startswith('{\n  "order": "A-7"')

    def pending() -> bool:
        return bool(stack.app.requests(runs["payer"]))

    # Tab to Approve and press Enter, as a keyboard user does: only the confirmation opens.
    page.locator("body").focus()
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.classList.contains('approve')"):
            break
    else:
        raise AssertionError("Tab never reached the Approve button")
    page.keyboard.press("Enter")
    confirm = card.locator(".confirm")
    confirm.wait_for()
    assert page.evaluate("() => document.activeElement.classList.contains('confirm-check')")
    for key in ("Enter", "Tab", "Enter", "Enter"):  # never the box: nothing is approved
        page.keyboard.press(key)
    time.sleep(0.3)
    assert pending() and stack.app.get_run(runs["payer"]).status == "waiting"
    page.screenshot(path=str(ARTIFACTS / "run-irreversible.png"), full_page=True)
    _accessible(page, "the irreversible approval")
    # Ticked, then confirmed: approved, and the run goes on.
    card.locator("button.approve").focus()
    page.keyboard.press("Enter")
    page.keyboard.press("Space")  # ticks the box, which has the focus
    assert card.locator(".confirm-approve").is_enabled()
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.classList.contains('confirm-approve')")
    page.keyboard.press("Enter")
    until(lambda: stack.app.get_run(runs["payer"]).status == "succeeded", "the refund", 30)


def test_the_workers_page_marks_the_dead(triage: tuple[Any, dict[str, str]], browser: Any) -> None:
    stack, _ = triage
    page = _login(browser, stack)
    page.click("#nav-workers")
    page.wait_for_url("**/ui/workers")
    states = page.eval_on_selector_all(
        "#workers tbody tr", "rs => rs.map(r => [r.dataset.worker, r.dataset.state])"
    )
    assert ["old-host:4242:dead01", "dead"] in states
    alive = [w for w, s in states if s == "alive"]
    assert len(alive) == 1 and alive[0].split(":")[1].isdigit()  # the server's own worker
    dead = page.locator('#workers tr[data-state="dead"]')
    assert "silent 1 h" in dead.inner_text()
    page.screenshot(path=str(ARTIFACTS / "workers.png"))
    _accessible(page, "workers")
    page.click("#nav-schedules")
    page.wait_for_url("**/ui/schedules")
    _accessible(page, "schedules")
