"""Two dashboard features in a real headless Chromium (Debian's), driven by Playwright:
the run page shows an agent's answer forming while its model call streams, and the
schedules page pauses and resumes a schedule (buttons for admin keys only)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _helpers import drain, uvicorn_serving

import mainspring as ms
from mainspring.testing import ScriptedModel

CHROMIUM = "/usr/bin/chromium"
TEXT = "The quick brown fox jumps over the lazy dog, and then it streams home."
FIRST = "Looking it up."  # three pieces, then its tool call's arguments
# The six pieces of five characters handed out before the pause, but for the word they
# end in ("over"), which redaction holds back until it is whole.
SO_FAR = "The quick brown fox jumps "

pytestmark = [
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is missing: apt-get install chromium chromium-driver (.ci/run does)",
    ),
    pytest.mark.parametrize("db_url", ["sqlite"], indirect=True),
]


@pytest.fixture
def browser() -> Any:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def served(db_url: str) -> Iterator[tuple[str, ms.App]]:
    """The HTTP API and dashboard of an App on ``db_url`` under uvicorn on 127.0.0.1
    (its own thread and App, as a server process would be): (base url, that App)."""
    app = ms.App(db_url)
    try:
        with uvicorn_serving(app) as base:
            yield base, app
    finally:
        app.close()


def _login(browser: Any, base: str, key: str) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(20_000)
    page.goto(f"{base}/ui/login")
    page.fill("#key", key)
    page.click("#login")
    page.wait_for_url(f"{base}/ui/")
    return page


def test_the_run_page_shows_the_answer_forming(
    served: tuple[str, ms.App], db_url: str, browser: Any
) -> None:
    base, server_app = served
    key = server_app.admin.create_key("ops", ["admin"])[1]
    # Two pauses: in the first model turn, mid-way through its tool call's arguments
    # (the turn's 6th piece: its text is three, then `{"top`, `ic": `); in the second,
    # mid-way through its text (its 7th piece).
    pauses = {(1, 5): (threading.Event(), threading.Event())}
    pauses[2, 6] = (threading.Event(), threading.Event())

    async def pause(index: int, piece: str) -> None:
        held = pauses.get((len(model.requests), index))
        if held is not None and not held[1].is_set():
            held[0].set()
            await asyncio.to_thread(held[1].wait, 60)  # never blocks the worker's loop

    app = ms.App(db_url, poll_interval_s=0.01)  # the worker's, apart from the server's

    @app.tool
    def lookup(topic: str) -> str:
        """Look a topic up."""
        return f"{topic}: quick, brown"

    # Two model steps: the first one's output is replaced when the second one streams.
    model = ScriptedModel(
        [
            ScriptedModel.call("lookup", {"topic": "fox"}, text=FIRST),
            ScriptedModel.call("finish", {"answer": "a fox"}, text=TEXT),
        ],
        chunk_size=5,
        on_chunk=pause,
    )
    writer = app.agent("writer", model=model, instructions="Write.", tools=[lookup])
    failed: list[BaseException] = []

    def work() -> None:
        try:
            asyncio.run(drain(app))
        except BaseException as e:  # reported by the test, not lost in the thread
            failed.append(e)

    worker = threading.Thread(target=work, daemon=True)
    try:
        run_id = app.submit(writer, "Tell me about the fox").run_id
        page = _login(browser, base, key)
        worker.start()
        first, second = pauses[1, 5], pauses[2, 6]
        assert first[0].wait(30), f"the model never streamed: {failed}"
        page.goto(f"{base}/ui/runs/{run_id}")
        # Mid-way through the first turn's tool call: the card shows the call forming,
        # its name and its arguments so far (the text's last word is held back by
        # redaction until it is whole).
        page.locator("#answer-card").wait_for(state="visible")
        page.wait_for_function(
            "want => document.getElementById('answer-calls').textContent === want",
            arg='lookup {"topic": ',
        )
        assert page.text_content("#answer") == "Looking it "
        first[1].set()
        assert second[0].wait(30), f"the second turn never streamed: {failed}"
        # Mid-call of the second model step: its text so far replaces the first step's
        # output, none of the rest.
        page.wait_for_function(
            "want => document.getElementById('answer').textContent === want", arg=SO_FAR
        )
        assert page.text_content("#answer-calls") == ""
        note = page.text_content("#answer-note")
        assert note.startswith("step 0:") and note.endswith(", attempt 1"), note
        streaming = note.split(",")[0]
        assert app.get_run(run_id).status == "running"
        second[1].set()
        # The rest arrives on the same page; the end of the stream is noted, the text stays.
        page.wait_for_function(
            "want => document.getElementById('answer').textContent === want", arg=TEXT
        )
        page.wait_for_function(
            "want => document.getElementById('answer-calls').textContent === want",
            arg='finish {"answer": "a fox"}',
        )
        page.wait_for_function(
            "want => document.getElementById('answer-note').textContent === want",
            arg=f"{streaming}: complete",
        )
        page.wait_for_function(
            "() => document.getElementById('run-status')?.textContent === 'succeeded'"
        )
        assert page.is_visible("#answer-card")
        assert page.text_content("#answer") == TEXT
        worker.join(30)
        assert not failed, failed
        assert app.get_run(run_id).status == "succeeded"
    finally:
        for _, resume in pauses.values():
            resume.set()
        if worker.is_alive():
            worker.join(30)
        app.close()


def test_the_schedules_page_pauses_and_resumes_for_admins_only(
    served: tuple[str, ms.App], db_url: str, browser: Any
) -> None:
    base, server_app = served
    admin = server_app.admin.create_key("ops", ["admin"])[1]
    reader = server_app.admin.create_key("ana", ["read"])[1]
    app = ms.App(db_url)

    @app.workflow
    async def report(ctx: ms.RunContext, scope: str) -> str:
        return f"report of {scope}"

    app.schedules.add("nightly-report", "0 3 * * *", report, "all")
    try:
        app.schedules.sync()  # what a worker does at its first tick
        page = _login(browser, base, admin)
        page.click("a[href='/ui/schedules']")
        page.wait_for_url(f"{base}/ui/schedules")
        row = page.locator("#schedule-nightly-report")
        assert row.get_attribute("data-paused") == "no"
        assert "active" in row.inner_text() and "0 3 * * *" in row.inner_text()

        row.locator("button.toggle").click()  # Pause: the page reloads with the new state
        page.locator("#schedule-nightly-report[data-paused=yes]").wait_for()
        assert app.schedules.get("nightly-report").paused
        row = page.locator("#schedule-nightly-report")
        assert "paused" in row.inner_text()
        assert row.locator("button.toggle").inner_text() == "Resume"
        assert page.text_content("#action-error") == ""

        row.locator("button.toggle").click()  # Resume undoes it
        page.locator("#schedule-nightly-report[data-paused=no]").wait_for()
        assert not app.schedules.get("nightly-report").paused
        assert page.locator("#schedule-nightly-report button.toggle").inner_text() == "Pause"
        page.close()

        # A read-only key sees the schedule, its state and no buttons.
        page = _login(browser, base, reader)
        page.goto(f"{base}/ui/schedules")
        row = page.locator("#schedule-nightly-report")
        assert row.get_attribute("data-paused") == "no"
        assert page.locator("button.toggle").count() == 0
        assert "needs a key with the admin scope" in page.text_content("main")
    finally:
        app.close()
