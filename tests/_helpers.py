"""Shared bits for engine tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import mainspring as ms
from mainspring.testing import SimulatedCrash

# Stands for the process dying: nothing after it is written.
Crash = SimulatedCrash


async def drain(app: ms.App, *, rounds: int = 1, **options: object) -> ms.Worker:
    """Run a worker until nothing is runnable or running."""
    worker = app.worker(**options)  # type: ignore[arg-type]
    for _ in range(rounds):
        await asyncio.wait_for(worker.run(until_idle=True), 30)
    return worker


@contextmanager
def uvicorn_serving(app: ms.App) -> Iterator[str]:
    """``app``'s HTTP API and dashboard under uvicorn on 127.0.0.1, in a thread of
    its own as a server process would be: its base URL while the block runs."""
    uvicorn = pytest.importorskip("uvicorn")
    from mainspring.server import create_app

    config = uvicorn.Config(
        create_app(app, webhooks=False, events_poll_s=0.05),
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(600):
        if server.started:
            break
        threading.Event().wait(0.05)
    assert server.started, "the server never listened"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
