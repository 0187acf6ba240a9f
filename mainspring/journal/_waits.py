"""Waits: sleeps, signals and requests to humans, and parking the run meanwhile.

A wait that can complete in this execution (a short sleep, a signal already stored)
holds the worker. One that cannot is *parked*: once nothing else can happen in the
run, it suspends, waking on any parked wait's signal and at the earliest parked
deadline, and every wait checks again on replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, NoReturn

from .._errors import ConfigError, StoreError, StoreUnavailable, WaitTimeout
from .._requests import Approval, OnTimeout, RequestKind, approval_from, request_meta
from .._serde import dumps, loads
from .._signals import is_request_signal
from ..storage import WAIT_SIGNAL_SEP, RunTransition, StepRecord, join_wait_signals
from ._control import _Suspend
from ._cursor import Cursor

__all__ = ["MISSING", "Waits"]

MISSING: Any = object()  # no default given: a timed-out wait raises WaitTimeout
_TIMED_OUT: Any = object()

# Loop iterations with no activity in the context, while some wait is parked and no
# step runs, before the run is suspended. Enough for the callbacks that carry one
# task's end to the tasks awaiting it (``gather``, ``asyncio.wait``, nested a few
# deep) to run, so that a wait that just completed is seen before the run leaves.
_QUIET_ROUNDS = 16


class Waits:
    """The durable waits of one execution, over its journal cursor."""

    def __init__(self, cur: Cursor) -> None:
        self.cur = cur
        self.life = cur.life
        self._sleeps = 0
        self._slot_keys: set[int] = set()  # parked back-offs, which keep a queue slot
        self._quiet_seen = -1
        self._quiet_rounds = 0
        self._quiet_polling = False
        self.life.watch(self._watch)

    # -- time -------------------------------------------------------------------------

    async def sleep(self, seconds: float) -> None:
        cur = self.cur
        self.life.boundary()
        seq = cur.take("sleep", "sleep")
        rec = cur.journal.get(seq)
        if rec is not None:
            if rec.status == "completed":
                return
            wake_at = rec.wake_at if rec.wake_at is not None else cur.now()
        else:
            wake_at = cur.now() + max(0.0, float(seconds))
            rec = cur.put(cur.new(seq, "sleep", "sleep", status="started", wake_at=wake_at))
        await self.until(wake_at, reason="sleep")
        cur.put(rec, status="completed", finished_at=cur.now())

    async def until(self, wake_at: float, *, reason: str, keeps_slot: bool = False) -> None:
        """Wait until ``wake_at`` (journaling nothing): inline when it is near, else
        parked, so that the run suspends and wakes on time. ``keeps_slot``: a retry
        back-off; a run whose every parked wait is one keeps its queue slot."""
        cur, life = self.cur, self.life
        while True:  # a sticky execution's parked sleep checks again when it wakes
            delay = wake_at - cur.now()
            if delay <= 0:
                return
            if delay <= cur.engine.inline_wait_s:
                await cur.commit()
                life.busy_began()  # a short sleep is activity: the run does not suspend under it
                try:
                    await cur.engine.clock.sleep(delay)
                finally:
                    life.busy_ended()
                life.boundary()
                return
            self._sleeps += 1  # parked sleeps take negative keys: seqs are for waits
            key = -self._sleeps
            if keeps_slot:
                self._slot_keys.add(key)
            try:
                await self._park(key, None, wake_at, reason)
            finally:
                self._slot_keys.discard(key)

    # -- signals ----------------------------------------------------------------------

    async def wait_for(self, signal: str, *, timeout: float | None, default: Any) -> Any:
        if is_request_signal(signal):
            raise ConfigError(
                f"ctx.wait_for({signal!r}): that name is reserved for requests to humans "
                "and no raw signal can answer it; use ctx.approval(...) or ctx.ask(...), "
                "or wait for another name",
                run_id=self.cur.run_id,
            )
        return await self._wait(signal, timeout=timeout, default=default)

    async def request(
        self,
        request_id: str,
        *,
        kind: RequestKind,
        title: str | None,
        preview: Any,
        choices: Sequence[str] | None,
        timeout: float | None,
        default: Any,
    ) -> Approval | str:
        _check_request(request_id, kind, choices, default)
        options = tuple(choices) if choices is not None else None
        if title is None:
            title = f"approve {request_id}" if kind == "approval" else request_id
        on_timeout: OnTimeout | None = None
        default_answer: str | None = None
        if timeout is not None:
            if kind == "approval":
                on_timeout = "approve" if default == "approve" else "reject"
            elif default is MISSING:
                on_timeout = "fail"
            else:
                on_timeout, default_answer = "answer", str(default)
        meta = dumps(
            request_meta(
                kind, title, preview, options, on_timeout=on_timeout, default_answer=default_answer
            )
        )
        payload = await self._wait(request_id, timeout=timeout, default=_TIMED_OUT, request=meta)
        if kind == "approval":
            return _decision(payload, timeout, "reject" if default is MISSING else default)
        if payload is not _TIMED_OUT:
            return str(payload.get("answer", "")) if isinstance(payload, dict) else str(payload)
        if default is MISSING:
            raise WaitTimeout(
                f"no answer to {title!r} within {timeout:g} s", run_id=self.cur.run_id
            )
        return str(default)

    async def _wait(
        self,
        signal: str,
        *,
        timeout: float | None,
        default: Any = MISSING,
        request: str | None = None,
        reason: str | None = None,
    ) -> Any:
        """``wait_for``; ``request`` (JSON) marks the wait as a request to a human and
        stays in the journal row, listed while pending and kept once answered;
        ``reason``: the run's wait reason while parked here (``signal:<name>``)."""
        if WAIT_SIGNAL_SEP in signal:
            raise ValueError(f"a signal name cannot contain {WAIT_SIGNAL_SEP!r}: {signal!r}")
        cur = self.cur
        self.life.boundary()
        seq = cur.take("signal", signal)
        rec = cur.journal.get(seq)
        if rec is not None and rec.status == "completed":
            if (loads(rec.output) or {}).get("cancelled") is True:
                await self._forever()  # the workflow cancelled this wait: it will again
            return self._result(rec, signal, default)
        if rec is None:
            deadline = None if timeout is None else cur.now() + max(0.0, timeout)
            rec = cur.put(
                cur.new(
                    seq,
                    "signal",
                    signal,
                    status="started",
                    wake_at=deadline,
                    output=None if request is None else '{"request":' + request + "}",
                )
            )
        while True:  # a sticky execution's parked wait checks again when it wakes
            done = await self._answered(rec, signal)
            if done is not None:
                return self._result(done, signal, default)
            await self._park_wait(rec, signal, reason)

    async def _answered(self, rec: StepRecord, signal: str) -> StepRecord | None:
        """The wait's row completed by a stored signal or by its deadline, if either."""
        cur = self.cur
        meta = "" if rec.output is None else rec.output[1:-1] + ","  # '"request":{…},'
        # A signal another wait of this run took but has not committed is not ours.
        taken = [sid for sid, _ in cur.consume]
        try:
            found = cur.engine.store.next_signal(cur.run_id, signal, skip=taken)
        except (StoreUnavailable, StoreError) as exc:
            raise self.life.fail(exc) from exc
        if found is not None:
            done = cur.put(
                rec,
                status="completed",
                output="{" + meta + '"signal":' + found.payload + "}",
                finished_at=cur.now(),
            )
            cur.consumed(found.id, f"{cur.session}:{rec.seq}")
            await cur.commit()
            return done
        if rec.wake_at is not None and cur.now() >= rec.wake_at:
            return cur.put(
                rec,
                status="completed",
                output="{" + meta + '"timeout":true}',
                finished_at=cur.now(),
            )
        return None

    async def _park_wait(self, rec: StepRecord, signal: str, reason: str | None = None) -> None:
        cur = self.cur
        try:
            await self._park(rec.seq, signal, rec.wake_at, reason or f"signal:{signal}")
        except asyncio.CancelledError:
            if self.life.stop is None:  # the workflow cancelled it (the loser of a race)
                meta = "" if rec.output is None else rec.output[1:-1] + ","
                cur.put(
                    rec,
                    status="completed",
                    output="{" + meta + '"cancelled":true}',
                    finished_at=cur.now(),
                )
            raise

    def _result(self, rec: StepRecord, signal: str, default: Any) -> Any:
        out = loads(rec.output) or {}
        if "signal" in out:
            return out["signal"]
        if default is not MISSING:
            return default
        raise WaitTimeout(
            f"no signal {signal!r} arrived before the wait's timeout",
            run_id=self.cur.run_id,
            step=self.cur.where(rec.seq, signal),
        )

    # -- parking ----------------------------------------------------------------------

    async def _forever(self) -> NoReturn:
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable: the future is never resolved")

    async def _park(self, key: int, signal: str | None, wake_at: float | None, reason: str) -> None:
        """Wait here until the run suspends: it wakes on any parked wait's signal and at
        the earliest parked deadline, and replays; each wait then checks again. A
        sticky execution instead returns here when it is resumed (see ._sticky), and
        the wait checks again as a replay reaching it would.

        A wait in the workflow's own task with no other task using the context
        suspends at once (the common case). Otherwise the run suspends when the
        context has been quiet (no step running, no commit, no call) for
        :data:`_QUIET_ROUNDS` loop iterations, so that all of ``gather(wait_for("a"),
        wait_for("b"))`` is parked, and an ``asyncio.wait`` whose other wait just
        completed gets to see it first.
        """
        life = self.life
        waker = life.park_wait(key, (signal, wake_at, reason))
        try:
            alone = (
                asyncio.current_task() is life.main
                and not life.running
                and not life.busy
                and all(t.done() for t in life.tasks)
            )
            if waker is not None:
                if alone:
                    self._suspend_now()
                else:
                    life.touch()
                await waker
                life.boundary()  # as a replay reaching this wait: cancelled, draining
                return
            if alone:
                raise life.decide(_Suspend(self._suspension()))
            life.touch()
            await self._forever()
        finally:
            life.unpark_wait(key)

    def _watch(self) -> None:
        """Activity while some wait is parked: start watching for quiet."""
        if not self._quiet_polling and self.life.stop is None:
            self._quiet_polling = True
            self._quiet_rounds = 0
            asyncio.get_running_loop().call_soon(self._check_quiet)

    def _check_quiet(self) -> None:
        life = self.life
        if life.stop is not None or not life.parked or life.running or life.busy:
            self._quiet_polling = False  # a step or commit ends with touch(): watch again
            return
        if life.activity != self._quiet_seen:
            self._quiet_seen = life.activity
            self._quiet_rounds = 0
        else:
            self._quiet_rounds += 1
            if self._quiet_rounds >= _QUIET_ROUNDS:
                self._quiet_polling = False
                self._suspend_now()
                return
        asyncio.get_running_loop().call_soon(self._check_quiet)

    def _suspend_now(self) -> None:
        life = self.life
        if life.parking is not None and life.state == "running":
            # Sticky: from here on nothing may use the context; it is as suspended.
            life.park(self._suspension())
            return
        life.decide(_Suspend(self._suspension()))
        life.cancel_tasks()

    def _suspension(self) -> RunTransition:
        """One suspension for every parked wait: any of their signals wakes the run, and
        so does the earliest of their deadlines."""
        parked = self.life.parked
        waits = [parked[key] for key in sorted(parked)]
        signals = list(dict.fromkeys(s for s, _, _ in waits if s is not None))
        deadlines = [w for _, w, _ in waits if w is not None]
        return RunTransition(
            kind="suspend",
            status="waiting" if signals else "sleeping",
            wake_at=min(deadlines) if deadlines else None,
            wait_reason=" | ".join(dict.fromkeys(r for _, _, r in waits)),
            wait_signal=join_wait_signals(signals) if signals else None,
            # Only when every wait is a back-off: a run that also waits for a person
            # or a signal gives its slot up.
            keeps_slot=bool(parked) and all(key in self._slot_keys for key in parked),
        )


def _check_request(request_id: str, kind: str, choices: Sequence[str] | None, default: Any) -> None:
    if kind not in ("approval", "question"):
        raise ValueError(f"kind must be 'approval' or 'question', got {kind!r}")
    if not is_request_signal(request_id):
        raise ConfigError(
            f"ctx.request({request_id!r}): a request's id must be a name reserved for "
            "requests, so that only an answer (App.answer, the API, the CLI) can satisfy "
            "it: 'approval:<name>' or 'question:<name>' (or 'budget:…', 'checkpoint:…', "
            "'resume')"
        )
    if kind == "approval" and choices is not None:
        raise ValueError("choices are for questions; an approval is approved or rejected")
    if kind == "approval" and default not in (MISSING, "approve", "reject"):
        raise ValueError(f"an approval's default must be 'approve' or 'reject', not {default!r}")


def _decision(payload: Any, timeout: float | None, default: str) -> Approval:
    """The decision a reviewer sent, or, when nobody answered in time, the default."""
    if payload is not _TIMED_OUT:
        return approval_from(payload)
    return Approval(
        approved=default == "approve",
        reason=f"no decision within {timeout:g} s; the default is {default!r}",
        timed_out=True,
    )
