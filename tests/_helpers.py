"""Shared bits for engine tests."""

from __future__ import annotations

import asyncio

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
