"""What `mainspring worker` and `mainspring serve` write to their log: no secret in any
line, whoever's logger wrote it (httpx's request lines quote webhook URLs in full),
and no third-party chatter at INFO unless the operator asks for it. Real processes,
their real stderr."""

from __future__ import annotations

import importlib
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from _stack import ROOT, Stack, until

import mainspring as ms
from mainspring.observability import RedactingFilter
from mainspring.observability._logs import redact_log_text
from mainspring.testing import FakeOpenAIServer

SECRETS = ("hookuser", "HOOKPASSWORD", "QUERYTOKEN", "SIGVALUE")


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[str]]]:
    """A webhook receiver on 127.0.0.1: its base URL and the paths it was sent."""
    seen: list[str] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.path)
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_webhook_delivery_leaves_no_secret_in_the_server_log(
    stack: Stack, receiver: tuple[str, list[str]]
) -> None:
    where, seen = receiver
    url = f"http://hookuser:HOOKPASSWORD@{where}/hook?token=QUERYTOKEN&sig=SIGVALUE"
    stack.app.admin.add_webhook(url, events=["run.failed"])
    # DEBUG: every library logs, httpx its request line with the URL in it.
    stack.serve("--worker", "--webhook-allow", "127.0.0.1/32", "--log-level", "debug")
    ops = stack.client(stack.admin)
    assert ops.post("/runs", json={"workflow": "fails"}).status_code == 202
    until(lambda: seen, "the webhook to arrive")
    assert seen == ["/hook?token=QUERYTOKEN&sig=SIGVALUE"]  # it was sent as registered
    until(lambda: "HTTP Request: POST" in stack.log("server"), "httpx's line in the log")
    log = stack.log("server")
    line = next(x for x in log.splitlines() if "HTTP Request: POST" in x)
    assert f"http://[REDACTED]@{where}/hook?token=[REDACTED]&sig=[REDACTED]" in line, line
    for secret in SECRETS:
        assert secret not in log, secret


def _worker(env: dict[str, str], *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "mainspring", "worker", "apps.log_app:app", "--until-idle", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_worker_log_is_about_runs_not_http_lines(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeOpenAIServer(api_key="sk-test") as server:
        server.script([server.tool_call("finish", {"answer": "done"})] * 3)
        env = {
            **os.environ,
            "MAINSPRING_DATABASE_URL": db_url,
            "MAINSPRING_TEST_OPENAI_URL": server.base_url,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        env.pop("MAINSPRING_LIBRARY_LOG_LEVEL", None)
        for name in ("MAINSPRING_DATABASE_URL", "MAINSPRING_TEST_OPENAI_URL"):
            monkeypatch.setenv(name, env[name])
        module = importlib.import_module("apps.log_app")
        module = importlib.reload(module)  # this test's database and fake server

        def run_one(*extra: str, **more: str) -> str:
            handle = module.app.submit(module.helper, "Say done")
            log = _worker({**env, **more}, *extra)
            assert module.app.get_run(handle.run_id).status == "succeeded", log
            assert any(
                "event=succeeded" in line and f"run={handle.run_id}" in line
                for line in log.splitlines()
            ), log
            return log

        quiet = run_one()  # INFO: runs, and no HTTP client lines
        assert "HTTP Request:" not in quiet and "httpx" not in quiet, quiet
        asked = run_one(MAINSPRING_LIBRARY_LOG_LEVEL="INFO")  # the operator asks for them
        # (the openai SDK's HTTP client logs as httpx, or httpx2 in its newer releases)
        request = rf"INFO httpx2?: HTTP Request: POST {re.escape(server.base_url)}/chat/"
        assert re.search(request, asked), asked
        debug = run_one("--log-level", "debug")
        assert re.search(r"DEBUG httpcore2?\.", debug), debug
        assert re.search(request, debug), debug
        module.app.close()


def test_the_filter_redacts_every_record_whoever_wrote_it() -> None:
    """The handler's filter, on records as httpx, uvicorn's access log and a traceback
    write them (the lines that reach the log of worker and serve)."""
    filtering = RedactingFilter()
    filtering.add(ms.Redactor(patterns=[r"ACME-\d{4}"], builtin=False))
    records = []
    for name, msg, args in (
        ("httpx", 'HTTP Request: %s %s "%s"', ("POST", "https://u:p4ss@h.example/x?k=v&t", "ok")),
        ("uvicorn.access", '%s - "%s %s HTTP/%s" %d', ("1.2.3.4", "GET", "/a?key=K", "1.1", 200)),
        ("app", "card %s for %s", ("ACME-1234", "Bearer abcdefghijklmnop")),
    ):
        record = logging.LogRecord(name, logging.INFO, __file__, 1, msg, args, None)
        assert filtering.filter(record)
        records.append(record.getMessage())
    assert records == [
        'HTTP Request: POST https://[REDACTED]@h.example/x?k=[REDACTED]&[REDACTED] "ok"',
        '1.2.3.4 - "GET /a?key=[REDACTED] HTTP/1.1" 200',
        "card [REDACTED] for Bearer [REDACTED]",
    ]
    try:
        raise ConnectionError("cannot reach https://bot:s3cret@hooks.example/h?sig=abc")
    except ConnectionError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    filtering.filter(record)
    assert record.exc_text is not None and "s3cret" not in record.exc_text
    assert "https://[REDACTED]@hooks.example/h?sig=[REDACTED]" in record.exc_text
    assert redact_log_text("no secrets here: /runs?status=waiting") == (
        "no secrets here: /runs?status=waiting"
    )


def test_libraries_are_told_apart_by_name_and_by_where_their_code_is_installed() -> None:
    import sysconfig

    from mainspring.observability import LibraryLevel

    installed = os.path.join(sysconfig.get_paths()["purelib"], "somelib", "client.py")
    levels = LibraryLevel(logging.INFO, logging.WARNING, packages=["myapp"])

    def passes(name: str, level: int, pathname: str = __file__) -> bool:
        return levels.filter(logging.LogRecord(name, level, pathname, 1, "m", None, None))

    assert passes("mainspring.worker", logging.INFO)
    assert passes("myapp.tools", logging.INFO, installed)  # the app's own, even installed
    assert passes("reports", logging.INFO)  # code that is not installed: the app's
    assert not passes("httpx", logging.INFO)  # a known library, wherever it is
    assert not passes("httpx2", logging.INFO)
    assert not passes("somelib.client", logging.INFO, installed)  # an unknown, installed one
    assert passes("somelib.client", logging.WARNING, installed)
    assert not passes("mainspring.worker", logging.DEBUG)


def test_the_worker_command_run_in_process_leaves_logging_as_it_found_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from mainspring.cli import cli

    url = f"sqlite:///{tmp_path / 'q.db'}"
    (tmp_path / "quiet_app.py").write_text(f"import mainspring as ms\napp = ms.App({url!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    done = CliRunner().invoke(cli, ["worker", "quiet_app:app", "--until-idle"])
    assert done.exit_code == 0, done.output
    assert "worker" in done.output and "started on" in done.output  # it did log
    assert (list(root.handlers), root.level) == before
