"""The journal cursor: one execution's place in its session's journal, and its writes.

Each durable call takes the next sequence number (:meth:`Cursor.take`). On replay a
journaled record at that number answers it; a different kind or name there is
:class:`NondeterminismError`. New rows are buffered (:meth:`Cursor.put`) and committed
together with the next intent row, in one fenced transaction (:meth:`Cursor.flush`).

The cursor keeps the position, the lookup, the buffer and the flush. Everything else
about the execution (how it ends, its tasks, its steps running, its parked waits) is
its :class:`~._lifecycle.Lifecycle`'s, which the cursor tells what a commit found.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from .._errors import (
    LeaseLost,
    NondeterminismError,
    StoreError,
    StoreUnavailable,
)
from .._serde import dumps, loads
from ..storage import RunRecord, RunTransition, RunWrite, StepKind, StepRecord, StepStatus
from ._engine import Engine
from ._lifecycle import Lifecycle

__all__ = ["Cursor"]


def _same_name(engine: Engine, journaled: str, asked: str) -> bool:
    """Whether a journaled step name and the one the workflow asks for are the same
    step: equal, or equal once the floor that names steps maps the journaled one to
    today's spelling (the engine's ``canonical_step_name``)."""
    if journaled == asked:
        return True
    canonical = engine.canonical_step_name
    return canonical is not None and canonical(journaled) == asked


class Cursor:
    """The records of one session as one execution reads and extends them."""

    def __init__(
        self, *, run: RunRecord, journal: list[StepRecord], engine: Engine, life: Lifecycle
    ) -> None:
        self.run_id = run.id
        self.session = run.session
        self.epoch = run.epoch
        self.engine = engine
        self.life = life
        # The engine's clock, read several times a step: bound once.
        self.now: Callable[[], float] = engine.clock.now
        self.journal = {rec.seq: rec for rec in journal}
        self.last_journaled = max(self.journal, default=-1)
        self.seq = -1
        self.pending: dict[int, StepRecord] = {}
        self.consume: list[tuple[int, str]] = []
        self.reset_recoveries = run.recoveries > 0
        # When the run was last proven this execution's: claimed, or a commit the
        # fence let through (see Engine.lease_s).
        self.proven_at = engine.clock.now()

    def reclaim(self, run: RunRecord) -> None:
        """Go on at ``run``'s claim (a sticky execution woken): its epoch fences what
        this cursor commits from now on."""
        self.epoch = run.epoch
        self.reset_recoveries = run.recoveries > 0
        self.proven_at = self.now()  # just claimed

    # -- position ---------------------------------------------------------------------

    @property
    def is_replaying(self) -> bool:
        return self.seq < self.last_journaled

    def where(self, seq: int, name: str) -> str:
        return f"{self.session}:{seq} {name!r}"

    def next_seq(self) -> int:
        """The sequence number the next durable call will take (past the markers of
        patches the code no longer checks, see :meth:`patch`)."""
        seq = self.seq + 1
        while (rec := self.journal.get(seq)) is not None and rec.kind == "patch":
            seq += 1
        return seq

    def upcoming(self) -> StepRecord | None:
        """The journal's record at the position the next durable call will take
        (``None`` past the journal: a first execution from there)."""
        return self.journal.get(self.next_seq())

    def take(self, kind: StepKind, name: str) -> int:
        """The next sequence number, checked against the journal's record there.

        A patch marker the code does not ask for is passed over: its patch was removed
        once every run that predates it had finished, and the steps after the marker
        are the patched code's, which the code asks for now (and checks, by name).
        """
        first = seq = self.seq + 1
        journal = self.journal
        rec = journal.get(seq)
        while rec is not None and rec.kind == "patch":  # as next_seq, inline: every call
            seq += 1
            rec = journal.get(seq)
        self.seq = seq
        if rec is not None and (rec.kind != kind or not _same_name(self.engine, rec.name, name)):
            passed = [self.journal[s].name for s in range(first, seq)]
            took = (
                f"; the run took the change(s) {', '.join(map(repr, passed))} just before, "
                "which this code does not check (ctx.patched): code that does can replay it"
                if passed
                else ""
            )
            raise self.life.fail(
                NondeterminismError(
                    f"replay expected {rec.kind} {rec.name!r} at position {seq} of session "
                    f"{self.session} but the workflow asked for {kind} {name!r}: the "
                    f"workflow's code changed while the run was in flight{took}",
                    run_id=self.run_id,
                    step=self.where(seq, name),
                    position=seq,
                    expected=(rec.kind, rec.name),
                    got=(kind, name),
                )
            )
        return seq

    def consumed(self, signal_id: int, at: str) -> None:
        """A wait took the stored signal ``signal_id`` (at ``session:seq``): consumed in
        the next commit, and skipped by the other waits until then."""
        self.consume.append((signal_id, at))

    # -- records ----------------------------------------------------------------------

    def new(self, seq: int, kind: StepKind, name: str, **fields: Any) -> StepRecord:
        return StepRecord(
            run_id=self.run_id,
            session=self.session,
            seq=seq,
            kind=kind,
            name=name,
            attempt=1,
            epoch=self.epoch,
            started_at=self.now(),
            **fields,
        )

    def put(
        self,
        rec: StepRecord,
        *,
        status: StepStatus | None = None,
        output: str | None = None,
        error: str | None = None,
        finished_at: float | None = None,
        wake_at: float | None = None,
    ) -> StepRecord:
        """Buffer a journal row: a fresh copy of ``rec`` with these fields changed
        (``None`` keeps the old value), so buffered rows never alias. New output and
        error text is redacted here, before it can reach the store."""
        redact = self.engine.redact
        if redact is not None:
            if output is not None:
                output = redact(output)
            if error is not None:
                error = redact(error)
        new = StepRecord(
            run_id=rec.run_id,
            session=rec.session,
            seq=rec.seq,
            kind=rec.kind,
            name=rec.name,
            status=status or rec.status,
            attempt=rec.attempt,
            epoch=self.epoch,
            output=rec.output if output is None else output,
            error=rec.error if error is None else error,
            started_at=rec.started_at,
            finished_at=rec.finished_at if finished_at is None else finished_at,
            wake_at=rec.wake_at if wake_at is None else wake_at,
            role=rec.role,
        )
        self.pending[new.seq] = new
        return new

    def add(self, rec: StepRecord) -> StepRecord:
        """Buffer a row made afresh for this execution (at its epoch) as it is, without
        the copy :meth:`put` makes; its error text is redacted like there."""
        if rec.error is not None and self.engine.redact is not None:
            return self.put(rec)
        self.pending[rec.seq] = rec
        return rec

    def record(self, kind: StepKind, make: Callable[[], Any]) -> Any:
        """A journaled value (``now``, ``uuid``, ``random``): made once, then replayed."""
        self.life.boundary()
        seq = self.take(kind, kind)
        rec = self.journal.get(seq)
        if rec is not None:
            return loads(rec.output)
        value = make()
        now = self.now()
        self.put(
            self.new(seq, kind, kind, status="completed", output=dumps(value), finished_at=now)
        )
        return value

    def patch(self, change_id: str, newest: int) -> int | None:
        """The version of the change ``change_id`` this run took here: the one its
        marker holds, ``newest`` (marked now) on a first execution, or ``None`` when the
        journal was written before the change (no marker where the code asks: nothing
        is consumed, so the old code's steps line up with the old journal).

        Markers of other changes met first are passed over (patches removed since);
        if nothing but such markers lies ahead, this is a first execution from there.
        """
        self.life.boundary()
        probe = self.seq + 1
        while (rec := self.journal.get(probe)) is not None and rec.kind == "patch":
            if rec.name == change_id:
                self.seq = probe
                return int(loads(rec.output))
            probe += 1
        if probe <= self.last_journaled:
            return None  # replaying a journal from before the change
        self.seq = probe
        self.put(
            self.new(
                probe,
                "patch",
                change_id,
                status="completed",
                output=dumps(newest),
                finished_at=self.now(),
            )
        )
        return newest

    # -- commits ----------------------------------------------------------------------

    async def commit(self) -> None:
        """Flush on behalf of workflow code. A store that stays down or a lost lease
        becomes an :class:`_EngineFailure`, which ``except Exception`` cannot catch."""
        life = self.life
        if life.stop is not None:
            raise life.stopped()
        life.busy_began()
        try:
            await self.flush()
        except (StoreUnavailable, StoreError, LeaseLost) as exc:
            raise life.fail(exc) from exc
        finally:
            life.busy_ended()

    def _redacted(self, transition: RunTransition) -> RunTransition:
        redact = self.engine.redact
        if redact is None:
            return transition
        return dataclasses.replace(
            transition,
            output=None if transition.output is None else redact(transition.output),
            error=None if transition.error is None else redact(transition.error),
            handoff=None if transition.handoff is None else redact(transition.handoff),
        )

    def _write(self, sent: dict[int, StepRecord], transition: RunTransition | None) -> RunWrite:
        return RunWrite(
            run_id=self.run_id,
            epoch=self.epoch,
            steps=list(sent.values()),
            consume=list(self.consume),
            transition=transition,
            # Only real progress (a step ended, or the run moved on) clears the count
            # of recoveries: an intent row alone is what a poison step writes forever.
            reset_recoveries=self.reset_recoveries
            and (
                transition is not None
                or any(r.status in ("completed", "failed") for r in sent.values())
            ),
        )

    async def flush(self, transition: RunTransition | None = None) -> None:
        """Commit buffered rows (and a status change) in one fenced transaction.

        Retried on store errors: the writes are idempotent upserts, so a commit
        that succeeded but reported failure (an ambiguous commit) is harmless to
        repeat, and a completed step is never re-run because of it.
        """
        if not self.pending and not self.consume and transition is None:
            return
        if transition is not None:
            transition = self._redacted(transition)
        engine = self.engine
        delay = 0.05
        for attempt in range(1, engine.commit_attempts + 1):
            # Built anew for each attempt: a retry sends the rows buffered now, never
            # the snapshot of a failed attempt, which a parallel step's flush may
            # have overtaken meanwhile.
            sent = dict(self.pending)
            write = self._write(sent, transition)
            sent_at = self.now()  # a fence it passes proves the run ours since (at least)
            try:
                result = await engine.committer.commit(write)
                if result.busy:  # the run's row is locked elsewhere: back off and retry
                    raise StoreUnavailable(
                        f"the row of run {self.run_id!r} is locked by another transaction",
                        run_id=self.run_id,
                    )
                break
            except (StoreUnavailable, StoreError):
                if attempt == engine.commit_attempts:
                    raise
                await asyncio.sleep(delay)  # real time: the database needs it, not the run
                delay = min(delay * 2, 2.0)
        if not result.ok:
            raise LeaseLost(
                result.conflict
                or f"epoch {self.epoch} is no longer current, or the run is no longer running:"
                " another worker owns it, or it was finished, cancelled or retried",
                run_id=self.run_id,
            )
        self._committed(sent, write, result.cancel_requested)
        self.proven_at = sent_at

    def stale(self) -> bool:
        """Whether the run was last proven this execution's more than half a lease ago
        (the process was frozen or starved since): see :meth:`prove`."""
        lease = self.engine.lease_s
        return lease is not None and self.now() - self.proven_at > lease / 2

    async def prove(self, intent: StepRecord) -> None:
        """Before a step function starts, once :meth:`stale`: send its ``intent`` row
        through the fence again, so that a run taken over meanwhile is found lost (an
        :class:`_EngineFailure`) before anything of it runs here."""
        self.put(intent)
        await self.commit()

    def _committed(self, sent: dict[int, StepRecord], write: RunWrite, cancel: bool) -> None:
        # Steps running in parallel (asyncio.gather) may have buffered rows while this
        # commit was in flight: forget only what was sent and has not changed since.
        for seq, rec in sent.items():
            if self.pending.get(seq) is rec:
                del self.pending[seq]
        # Another flush may have committed some of these already: drop what was sent.
        consumed = write.consume
        if consumed:
            self.consume = [c for c in self.consume if c not in consumed]
        if write.reset_recoveries:
            self.reset_recoveries = False
            self.life.control.progressed = True
        if cancel:
            self.life.cancel_asked()
