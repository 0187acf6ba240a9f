"""Signals and requests to humans: a signal is stored before or after the wait
that consumes it and wakes the run waiting for it; a request is a wait whose journal
row says what it asks (see :mod:`mainspring._requests`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._errors import RequestNotFound, RunConflict
from .._requests import Request, request_from_row
from ._connection import Connection, Cursor
from ._records import FINISHED, SignalRecord, split_wait_signals
from ._rows import _SIGNAL_COLUMNS, _signal
from ._transitions import wake

__all__ = ["SignalTables"]


class SignalTables(Connection):
    """Signals and requests: methods of every :class:`~mainspring.storage.Store`."""

    # -- signals -----------------------------------------------------------------------

    def send_signal(self, run_id: str, name: str, payload: str, now: float) -> int:
        """Store a signal for a run (before or after its wait) and wake it if it waits.

        Raises:
            RunNotFound: no such run.
            RunConflict: the run has finished.
        """
        with self._write() as cur:
            # Locked: a suspend committing now either sees this signal or is seen
            # waiting by it, so a stored signal always wakes the run waiting for it.
            row = self._locked_run(cur, run_id, "status, wait_signal", f"signal {name!r}")
            if row[0] in FINISHED:
                raise RunConflict(
                    f"cannot signal {name!r}: run {run_id!r} is already {row[0]}", run_id=run_id
                )
            return self._insert_signal(cur, run_id, name, payload, row[0], row[1], now)

    def next_signal(
        self, run_id: str, name: str, *, skip: Sequence[int] = ()
    ) -> SignalRecord | None:
        """The oldest unconsumed signal of that name, other than the ids in ``skip``
        (those another wait of the run has taken but not committed yet)."""
        also = f" AND id NOT IN ({', '.join('?' * len(skip))})" if skip else ""
        with self._read() as cur:
            cur.execute(
                f"SELECT {_SIGNAL_COLUMNS} FROM ms_signals"
                " WHERE run_id = ? AND name = ? AND consumed_at IS NULL"
                f"{also} ORDER BY id LIMIT 1",
                (run_id, name, *skip),
            )
            row = cur.fetchone()
        return None if row is None else _signal(row)

    def list_signals(self, run_id: str | None = None) -> list[SignalRecord]:
        """Every stored signal, consumed or not, in order (of one run, or all): for
        consistency checks and operators."""
        where = " WHERE run_id = ?" if run_id is not None else ""
        with self._read() as cur:
            cur.execute(
                f"SELECT {_SIGNAL_COLUMNS} FROM ms_signals{where} ORDER BY id",
                (run_id,) if run_id is not None else (),
            )
            return [_signal(r) for r in cur.fetchall()]

    # -- requests to humans ----------------------------------------------------------

    def pending_requests(self, run_id: str | None = None, *, limit: int = 1000) -> list[Request]:
        """Requests still waiting for a human, oldest first (of one run, or all)."""
        where = " AND r.id = ?" if run_id is not None else ""
        params: list[Any] = [run_id] if run_id is not None else []
        with self._read() as cur:
            cur.execute(
                "SELECT s.run_id, r.workflow, s.name, s.output, s.started_at, s.wake_at"
                " FROM ms_runs r JOIN ms_steps s ON s.run_id = r.id AND s.session = r.session"
                " WHERE r.status IN ('queued', 'running', 'sleeping', 'waiting')" + where + ""
                " AND s.kind = 'signal' AND s.status = 'started' AND s.output IS NOT NULL"
                " AND NOT EXISTS (SELECT 1 FROM ms_signals g WHERE g.run_id = s.run_id"
                " AND g.name = s.name AND g.consumed_at IS NULL)"
                " ORDER BY s.started_at, s.run_id, s.seq LIMIT ?",
                [*params, limit],
            )
            rows = cur.fetchall()
        found = (
            request_from_row(
                run_id=r[0], workflow=r[1], name=r[2], output=r[3], started_at=r[4], deadline=r[5]
            )
            for r in rows
        )
        return [req for req in found if req is not None]

    def answer_request(
        self, run_id: str, request_id: str, make_payload: Callable[[Request], str], now: float
    ) -> tuple[Request, int]:
        """Answer a pending request once: check, build the payload and store it as
        the signal its wait consumes, in one transaction.

        Raises:
            RunNotFound: no such run.
            RequestNotFound: the run never asked ``request_id``.
            RunConflict: the run has finished, or the request was already answered.
            InvalidAnswer: ``make_payload`` refused the answer.
        """
        with self._write() as cur:
            status, workflow, session, wait_signal = self._locked_run(
                cur, run_id, "status, workflow, session, wait_signal", f"answer {request_id!r}"
            )
            if status in FINISHED:
                raise RunConflict(
                    f"cannot answer {request_id!r}: run {run_id!r} is already {status}",
                    run_id=run_id,
                )
            cur.execute(
                "SELECT status, output, started_at, wake_at FROM ms_steps WHERE run_id = ?"
                " AND session = ? AND kind = 'signal' AND name = ? AND output IS NOT NULL"
                " ORDER BY seq DESC LIMIT 1",
                (run_id, session, request_id),
            )
            step = cur.fetchone()
            request = None
            if step is not None:
                request = request_from_row(
                    run_id=run_id,
                    workflow=workflow,
                    name=request_id,
                    output=step[1],
                    started_at=step[2],
                    deadline=step[3],
                )
            if request is None:
                raise RequestNotFound(
                    f"run {run_id!r} has no request {request_id!r}"
                    " (list them with GET /runs/{id} or `mainspring pending`)",
                    run_id=run_id,
                )
            cur.execute(
                "SELECT 1 FROM ms_signals WHERE run_id = ? AND name = ? AND consumed_at IS NULL"
                " LIMIT 1",
                (run_id, request_id),
            )
            if step[0] != "started" or cur.fetchone() is not None:
                raise RunConflict(
                    f"request {request_id!r} of run {run_id!r} was already answered",
                    run_id=run_id,
                )
            payload = make_payload(request)
            signal_id = self._insert_signal(
                cur, run_id, request_id, payload, status, wait_signal, now
            )
            return request, signal_id

    def _insert_signal(
        self,
        cur: Cursor,
        run_id: str,
        name: str,
        payload: str,
        status: str,
        wait_signal: str | None,
        now: float,
    ) -> int:
        cur.execute(
            "INSERT INTO ms_signals (run_id, name, payload, created_at) VALUES (?, ?, ?, ?)"
            " RETURNING id",
            (run_id, name, payload, now),
        )
        signal_id = int(cur.fetchone()[0])
        if status == "waiting" and name in split_wait_signals(wait_signal):
            wake(self, cur, run_id, now)
        return signal_id
