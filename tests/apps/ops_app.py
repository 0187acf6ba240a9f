"""An App for the operations tests (tests/test_ops.py): a step that kills its own worker,
a clock that runs ahead, and a PostgreSQL store that freezes inside a transaction.

Environment:
    MAINSPRING_DATABASE_URL: the store.
    MAINSPRING_TEST_LEASE_S, MAINSPRING_TEST_STEP_S, MAINSPRING_TEST_MAX_RECOVERIES.
    MAINSPRING_TEST_CLOCK_SKEW_S: this process's clock runs that many seconds ahead
        (a machine whose system clock is off: still the real clock, so leases on
        PostgreSQL follow the database's).
    MAINSPRING_TEST_FREEZE_FILE: when this file exists, the next commit deletes it and
        SIGSTOPs its own process right after its first statement, inside the
        transaction, holding the run rows that statement locked.
    MAINSPRING_TEST_IDLE_TX_S: the PostgreSQL store's idle_in_transaction timeout.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import mainspring as ms
from mainspring.storage import RunWrite, Store, WriteResult
from mainspring.storage._base import Cursor

URL = os.environ["MAINSPRING_DATABASE_URL"]
STEP_S = float(os.environ.get("MAINSPRING_TEST_STEP_S", "0.02"))
SKEW_S = float(os.environ.get("MAINSPRING_TEST_CLOCK_SKEW_S", "0"))
FREEZE = os.environ.get("MAINSPRING_TEST_FREEZE_FILE")


class AheadClock(ms.SystemClock):
    """The system clock of a machine whose time is off by SKEW_S."""

    def now(self) -> float:
        return time.time() + SKEW_S


class _Freezing:
    """A cursor that SIGSTOPs its process after its first statement."""

    def __init__(self, cur: Cursor) -> None:
        self._cur = cur
        self._done = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        result = self._cur.execute(sql, params)
        if not self._done:
            self._done = True
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen inside the transaction
        return result


def _store() -> Store | str:
    if not URL.startswith("postgres"):
        return URL
    from mainspring.storage.postgres import PostgresStore

    class FreezingStore(PostgresStore):
        _commit = threading.local()

        def commit(self, batch: Sequence[RunWrite], now: float) -> list[WriteResult]:
            self._commit.freeze = bool(FREEZE) and os.path.exists(FREEZE or "")
            if self._commit.freeze:
                os.unlink(FREEZE or "")
            try:
                return super().commit(batch, now)
            finally:
                self._commit.freeze = False

        def _commit_at_once(
            self, batch: Sequence[RunWrite], now: float
        ) -> list[WriteResult] | None:
            if getattr(self._commit, "freeze", False):
                return None  # freeze in the statement-by-statement transaction
            return super()._commit_at_once(batch, now)

        @contextmanager
        def _write(self) -> Iterator[Cursor]:
            with super()._write() as cur:
                yield _Freezing(cur) if getattr(self._commit, "freeze", False) else cur

    return FreezingStore(
        URL, idle_in_transaction_timeout_s=float(os.environ.get("MAINSPRING_TEST_IDLE_TX_S", "10"))
    )


app = ms.App(
    _store(),
    clock=AheadClock(),
    lease_s=float(os.environ.get("MAINSPRING_TEST_LEASE_S", "1.0")),
    max_recoveries=int(os.environ.get("MAINSPRING_TEST_MAX_RECOVERIES", "3")),
)


def work(i: int) -> int:
    time.sleep(STEP_S)
    return i


def die() -> None:
    """A native crash or an out-of-memory kill, as far as the worker can tell."""
    os.kill(os.getpid(), signal.SIGKILL)


@app.workflow
async def slow(ctx: ms.RunContext, steps: int) -> int:
    return sum([await ctx.step(work, i) for i in range(steps)])


@app.workflow
async def poison(ctx: ms.RunContext) -> None:
    await ctx.step(die)
