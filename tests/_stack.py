"""A `mainspring serve` process and worker processes over one database, for the
API and dashboard tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

import mainspring as ms
from mainspring.testing import EffectLedger

ROOT = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Stack:
    """`mainspring serve apps.hitl_app:app` plus worker processes, on one database."""

    def __init__(self, tmp: Path, db_url: str) -> None:
        self.tmp = tmp
        self.db_url = db_url
        self.ledger = EffectLedger(tmp / "ledger.db")
        self.env = {
            **os.environ,
            "MAINSPRING_DATABASE_URL": db_url,
            "MAINSPRING_TEST_LEDGER": str(tmp / "ledger.db"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.clients: list[httpx.Client] = []
        self.app = ms.App(db_url)
        _, self.admin = self.app.store.create_api_key("ops", ["admin"], time.time())
        _, self.reviewer = self.app.store.create_api_key("ana", ["read", "approve"], time.time())
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mainspring", *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def serve(self, *extra: str, target: str = "apps.hitl_app:app") -> None:
        self.spawn("server", "serve", target, "--port", str(self.port), *extra)

        def up() -> bool:
            try:
                return httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                assert self.procs["server"].poll() is None, self.log("server")
                return False

        until(up, "the server to listen")

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client = httpx.Client(base_url=self.base, headers=headers, timeout=10)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        self.app.close()
