"""The engine's promises, written once as checks over a store.

Every fault, race and chaos test ends with the same question: did the engine keep
its promises? :func:`check_invariants` answers it from what is durable (the store
and, when the test has one, an :class:`~mainspring.testing.EffectLedger`), and
:class:`StoreHistory` remembers what must never change so that a later look can
tell that it did.

The invariants:

* **live**: every run has ended, or is legitimately waiting with a reason that will
  fire: a sleeping run has a ``wake_at``; a waiting run has a ``wake_at`` or a
  signal name; a stored, unconsumed signal for the name a run waits on has woken it
  (``wake_at`` due); a run asked to cancel while parked has been woken to cancel.
* **completed rows never change**: a journal row once ``completed`` keeps its kind,
  name, attempt and output, and is never deleted while its run exists.
* **a finished run is never modified**: its status, output, error, session, epoch
  and journal stay as they were (a legitimate ``retry`` re-opens it: tell the
  history with :meth:`StoreHistory.reopen`).
* **at most once**: an ``at_most_once`` effect's key is called at most once.
* **effects once**: each effect key took effect once in the ledger.
* **signals once**: each consumed signal was consumed by one wait, and each wait
  that completed with a signal consumed exactly one stored signal.
* **events once**: a run's final webhook event (``run.succeeded`` ...) is queued once
  per endpoint each time it finishes, never again for a re-sent write.
* **nothing in flight after success**: a succeeded run has no journal row left
  ``started`` or ``retrying``.
* **no orphans**: a child run started with ``on_parent_close="cancel"`` whose parent
  has ended has ended too, or has been asked to cancel.
* **streams tell the journal's reply**: for every model step the journal completed,
  the output a reader of the run's live token stream assembles (docs/streaming.md:
  the attempt shown last, dropped when it ends ``interrupted``) is the journaled
  reply's text and tool calls, when that stream ended ``done``.
* **child ends delivered**: a run that waits for a child's end (``child:<id>``, a
  parent or a fork holding the child's start) while that child has ended (or is gone)
  has that end stored for it, unconsumed: otherwise it would wait for ever, and the
  liveness check, which sees a wait with a reason, would not notice.
* **one run per due time, none early, none skipped**: no run of a schedule for a
  due time after ``now`` (or created before its due time), and no schedule (not
  paused) whose next due time is past the first time its cron names after ``now``:
  the times it jumped over would start nothing. (One run per due time is the run
  key's uniqueness: ``schedule:<name>:<due time>``.)
* **an acknowledged cancel is honoured**: a run asked to cancel (``cancel_requested``,
  which a cancel sets only on a run that has not ended, answering it was asked) ends
  ``cancelled``, never ``succeeded`` or ``failed``: a finish that committed first
  leaves the flag unset, and the cancel answered with that end.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .._cron import next_due
from .._keys import schedule_key_due
from ..storage import CHILD_SIGNAL_PREFIX, FINISHED, Store, split_wait_signals
from ._faults import FaultyStore
from ._ledger import EffectLedger
from ._stream_invariant import stream_mismatches

__all__ = ["StoreHistory", "Violation", "ViolationKind", "assert_invariants", "check_invariants"]

ViolationKind = Literal[
    "stuck",
    "unwoken_signal",
    "uncancelled",
    "not_finished",
    "completed_row_changed",
    "completed_row_deleted",
    "finished_run_modified",
    "at_most_once_twice",
    "duplicate_effect",
    "signal_consumed_twice",
    "wait_without_signal",
    "signal_lost",
    "unended_row",
    "duplicate_event",
    "orphan",
    "stream_mismatch",
    "child_end_undelivered",
    "schedule_early",
    "schedule_skipped",
    "cancel_ignored",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    """One broken promise.

    Attributes:
        kind: which invariant (see the module's docstring).
        run_id: the run it concerns, when one does.
        detail: what was found, with the values.
    """

    kind: ViolationKind
    run_id: str | None
    detail: str

    def __str__(self) -> str:
        where = f" run {self.run_id}" if self.run_id else ""
        return f"[{self.kind}]{where}: {self.detail}"


@dataclass(frozen=True, slots=True)
class _Run:
    id: str
    status: str
    output: str | None
    error: str | None
    session: int
    handoff: str | None
    epoch: int
    wake_at: float | None
    wait_signal: str | None
    cancel_requested: bool
    lease_until: float | None
    parent: str | None = None
    parent_close: str | None = None
    schedule: str | None = None
    key: str | None = None
    created_at: float = 0.0


@dataclass(frozen=True, slots=True)
class _Row:
    run_id: str
    session: int
    seq: int
    kind: str
    name: str
    status: str
    attempt: int
    epoch: int
    output: str | None
    role: str = "step"

    @property
    def pos(self) -> str:
        return f"{self.session}:{self.seq}"

    def fixed(self) -> tuple[Any, ...]:
        """What a completed row must keep for ever."""
        return (self.kind, self.name, self.status, self.attempt, self.output)


def _read_state(
    store: Store, run_ids: Collection[str] | None
) -> tuple[dict[str, _Run], dict[str, list[_Row]]]:
    """Runs and their journals, read in one snapshot: a retry moves a finished run's
    status and journal together, and a capture must never see half of it."""
    if run_ids is not None and not run_ids:
        return {}, {}
    snap = _inner(store).snapshot(run_ids)
    runs = {
        rid: _Run(
            r.id,
            r.status,
            r.output,
            r.error,
            r.session,
            r.handoff,
            r.epoch,
            r.wake_at,
            snap.wait_signals.get(rid),
            r.cancel_requested,
            r.lease_until,
            r.parent if r.parent_kind == "child" else None,
            r.parent_close,
            r.schedule,
            r.key,
            r.created_at,
        )
        for rid, r in snap.runs.items()
    }
    steps = {
        rid: [
            _Row(
                s.run_id,
                s.session,
                s.seq,
                s.kind,
                s.name,
                s.status,
                s.attempt,
                s.epoch,
                s.output,
                s.role,
            )
            for s in rows
        ]
        for rid, rows in snap.steps.items()
    }
    return runs, steps


def _inner(store: Store) -> Store:
    """The store a check reads: a :class:`FaultyStore`'s inner one, so that the reads
    of a check are neither faulted nor counted as the test's calls."""
    return store.inner if isinstance(store, FaultyStore) else store


class StoreHistory:
    """Remembers completed journal rows and finished runs, and reports any later
    change to them.

    Call :meth:`capture` at checkpoints (after each round of a test), or let a
    :class:`~mainspring.testing.FaultyStore` call it after every commit::

        history = StoreHistory()
        store = FaultyStore(inner, after_call=history.after_commit(inner))

    Thread-safe: captures from a committer thread and from the test serialise.
    """

    def __init__(self) -> None:
        # run id -> (session, seq) -> what that completed row must keep
        self._completed: dict[str, dict[tuple[int, int], tuple[Any, ...]]] = {}
        self._finished: dict[str, tuple[Any, ...]] = {}
        self.reopened: set[str] = set()  # every run the test re-opens on purpose
        self._epochs: dict[str, int] = {}  # the last epoch seen of each run
        self._reported: set[tuple[Any, ...]] = set()
        self._lock = threading.Lock()
        self.violations: list[Violation] = []
        self.captures = 0

    def reopen(self, run_id: str) -> None:
        """The test re-opens this run on purpose (``retry``), now or once it has
        finished: a change of the finished run that moved its epoch on (only a retry
        re-opens a finished run, and a retry bumps the epoch) is then expected, and
        the run is watched again from its next finish. A change at the same epoch is
        still a violation. Call it before the retry."""
        with self._lock:
            self.reopened.add(run_id)

    def seen_finished(self, run_id: str) -> bool:
        """Whether a capture saw this run finished (so that a test can tell a run
        ``prune`` deleted legitimately from one that vanished while it ran)."""
        with self._lock:
            return run_id in self._finished

    def after_commit(self, store: Store) -> Any:
        """A ``FaultyStore(after_call=...)`` hook that captures the runs each
        successful ``commit`` (and every run-changing call) touched, reading
        ``store`` (the inner one, so the reads are neither counted nor faulted)."""

        def hook(method: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
            if method == "commit":
                batch = kwargs.get("batch", args[0] if args else [])
                self.capture(store, {w.run_id for w in batch})
            elif method in ("cancel", "send_signal", "retry_run", "claim", "release", "prune"):
                self.capture(store)

        return hook

    def capture(self, store: Store, run_ids: Collection[str] | None = None) -> list[Violation]:
        """Compare the store with what was seen before; remember what is new.
        Returns the violations this capture found (they are also appended to
        :attr:`violations`)."""
        found: list[Violation] = []
        # Read under the lock too: a capture that read an older state must not be
        # compared after one that read a newer state (it would look like a regression).
        with self._lock:
            runs, steps = _read_state(store, run_ids)
            self.captures += 1
            for run_id, run in runs.items():
                self._epochs[run_id] = run.epoch
                rows = steps.get(run_id, [])
                found += self._compare_rows(run_id, rows)
                found += self._compare_finished(run, rows)
            self.violations += found
        return found

    def _compare_rows(self, run_id: str, rows: Sequence[_Row]) -> list[Violation]:
        found: list[Violation] = []
        present = {(r.session, r.seq): r for r in rows}
        seen = self._completed.setdefault(run_id, {})
        for (session, seq), fixed in list(seen.items()):
            row = present.get((session, seq))
            if row is None:
                found.append(
                    Violation(
                        kind="completed_row_deleted",
                        run_id=run_id,
                        detail=f"completed row {session}:{seq} {fixed[1]!r} was deleted",
                    )
                )
                del seen[(session, seq)]
            elif row.fixed() != fixed and (run_id, session, seq, row.fixed()) not in self._reported:
                self._reported.add((run_id, session, seq, row.fixed()))  # once per new value
                found.append(
                    Violation(
                        kind="completed_row_changed",
                        run_id=run_id,
                        detail=f"completed row {session}:{seq} was {fixed!r}, now {row.fixed()!r}",
                    )
                )
        for r in rows:
            if r.status == "completed":
                seen.setdefault((r.session, r.seq), r.fixed())
        return found

    def _compare_finished(self, run: _Run, rows: Sequence[_Row]) -> list[Violation]:
        state = (
            run.status,
            run.output,
            run.error,
            run.session,
            run.handoff,
            run.epoch,
            tuple((r.session, r.seq, r.status, r.output, r.attempt) for r in rows),
        )
        before = self._finished.get(run.id)
        if before is None:
            if run.status in FINISHED:
                self._finished[run.id] = state
            return []
        if before == state:
            return []
        if run.id in self.reopened and run.epoch > before[5]:
            # Re-opened on purpose (a retry moves the epoch on): watched again from its
            # next finish.
            if run.status in FINISHED:
                self._finished[run.id] = state
            else:
                del self._finished[run.id]
            return []
        self._finished[run.id] = state
        names = ("status", "output", "error", "session", "handoff", "epoch", "journal")
        changed = [
            f"{n}: {a!r} -> {b!r}" for n, a, b in zip(names, before, state, strict=True) if a != b
        ]
        return [
            Violation(
                kind="finished_run_modified",
                run_id=run.id,
                detail=f"{before[0]} run changed after it finished ({'; '.join(changed)[:600]})",
            )
        ]


def check_invariants(
    store: Store,
    *,
    history: StoreHistory | None = None,
    ledger: EffectLedger | None = None,
    at_most_once_effects: Iterable[str] = (),
    run_ids: Collection[str] | None = None,
    now: float | None = None,
    settled: bool = False,
) -> list[Violation]:
    """Check the engine's invariants over ``store``; returns what is broken.

    Args:
        history: captures taken earlier (a last capture is taken now), for the
            "completed rows never change" and "finished runs never modified" checks.
        ledger: the effect ledger the test's steps applied their keys to.
        at_most_once_effects: the ledger ``effect`` names of ``at_most_once`` steps:
            each of their keys must have been called at most once.
        run_ids: only these runs (all runs when None).
        now: the engine's current time (``clock.now()`` with a fake clock); the
            real time when None.
        settled: the test has driven everything it could (no worker executing, the
            clock moved past every lease and due time): a run that is queued, running
            or due must not be left.
    """
    now = time.time() if now is None else now
    found: list[Violation] = []
    if history is not None:
        history.capture(store, run_ids)
        found += history.violations
    runs, steps = _read_state(store, run_ids)
    pending = _pending_signals(store, run_ids)
    for run in runs.values():
        waited = pending.get(run.id, set())
        found += _liveness(run, waited, now, settled)
        found += _unended_rows(run, steps.get(run.id, []))
        found += _orphan(run, runs)
        found += _streams(store, run, steps.get(run.id, []))
        found += _child_end_delivered(store, run, runs, waited)
        found += _cancel_ignored(run)
    found += _schedules(store, runs, now)
    found += _signals(store, steps, run_ids)
    found += _events(store, run_ids, set() if history is None else history.reopened)
    if ledger is not None:
        found += _effects(ledger, at_most_once_effects)
    return found


def _unended_rows(run: _Run, rows: list[_Row]) -> list[Violation]:
    """A run that succeeded has no journal row still started or retrying."""
    if run.status != "succeeded":
        return []
    return [
        Violation(
            kind="unended_row",
            run_id=run.id,
            detail=f"succeeded with row {r.pos} {r.kind} {r.name!r} still {r.status!r}",
        )
        for r in rows
        if r.status in ("started", "retrying")
    ]


def _streams(store: Store, run: _Run, rows: list[_Row]) -> list[Violation]:
    """Each completed model reply agrees with the token stream kept for it."""
    replies = [
        (r.session, r.seq, r.output) for r in rows if r.role == "model" and r.status == "completed"
    ]
    return [
        Violation(kind="stream_mismatch", run_id=run.id, detail=detail)
        for detail in stream_mismatches(
            _inner(store), run.id, replies, finished=run.status in FINISHED
        )
    ]


def _cancel_ignored(run: _Run) -> list[Violation]:
    """A cancel answered "asked" is honoured by the run's end (DESIGN §11)."""
    if run.cancel_requested and run.status in FINISHED and run.status != "cancelled":
        return [
            Violation(
                kind="cancel_ignored",
                run_id=run.id,
                detail=f"asked to cancel (the cancel answered that it was asked), yet "
                f"it ended {run.status} (error {run.error!r})",
            )
        ]
    return []


def _effects(ledger: EffectLedger, at_most_once_effects: Iterable[str]) -> list[Violation]:
    """Each effect key took place once, and an ``at_most_once`` step's key was even
    called at most once."""
    found = [
        Violation(
            kind="duplicate_effect",
            run_id=key.split(":", 1)[0],
            detail=f"effect of key {key!r} took place {n} times",
        )
        for key, n in sorted(ledger.report().duplicate_effects.items())
    ]
    for effect in at_most_once_effects:
        found += [
            Violation(
                kind="at_most_once_twice",
                run_id=key.split(":", 1)[0],
                detail=f"at_most_once effect {effect!r} of key {key!r} was called {n} times",
            )
            for key, n in sorted(ledger.calls_by_key(effect).items())
            if n > 1
        ]
    return found


def assert_invariants(store: Store, **options: Any) -> None:
    """:func:`check_invariants`, raising ``AssertionError`` listing every violation."""
    found = check_invariants(store, **options)
    if found:
        lines = "\n".join(f"  {v}" for v in found[:50])
        more = f"\n  ... and {len(found) - 50} more" if len(found) > 50 else ""
        raise AssertionError(f"{len(found)} invariant violation(s):\n{lines}{more}")


def _liveness(run: _Run, pending: set[str], now: float, settled: bool) -> list[Violation]:
    if run.status in FINISHED:
        return []
    due = run.wake_at is not None and run.wake_at <= now

    def bad(kind: ViolationKind, detail: str) -> list[Violation]:
        return [Violation(kind=kind, run_id=run.id, detail=detail)]

    if run.status in ("sleeping", "waiting"):
        if run.wake_at is None and (run.status == "sleeping" or run.wait_signal is None):
            return bad("stuck", f"{run.status} with no wake_at and no signal to wait for")
        if run.wait_signal is not None and run.wait_signal in pending and not due:
            return bad(
                "unwoken_signal",
                f"waits for {run.wait_signal!r}, a signal of that name is stored and "
                f"unconsumed, yet wake_at is {run.wake_at!r}",
            )
        if run.cancel_requested and not due:
            return bad("uncancelled", f"{run.status}, cancel requested, wake_at {run.wake_at!r}")
        if settled and due:
            return bad("not_finished", f"{run.status} and due (wake_at {run.wake_at!r}), not run")
        return []
    if settled:
        return bad("not_finished", f"still {run.status} after the test drove every run")
    return []


def _orphan(run: _Run, runs: dict[str, _Run]) -> list[Violation]:
    """A child its parent's end should have cancelled (or asked to), and did not."""
    parent = runs.get(run.parent) if run.parent is not None else None
    if (
        parent is None
        or parent.status not in FINISHED
        or run.parent_close != "cancel"
        or run.status in FINISHED
        or run.cancel_requested
    ):
        return []
    detail = f"still {run.status}, not asked to cancel, while its parent {parent.id} is "
    return [Violation(kind="orphan", run_id=run.id, detail=detail + parent.status)]


def _child_end_delivered(
    store: Store, run: _Run, runs: dict[str, _Run], pending: set[str]
) -> list[Violation]:
    """A run waiting for the end of a child that has ended (or is gone) has that end
    stored for it, unconsumed (a run asked to cancel is the ``uncancelled`` check's)."""
    if run.status != "waiting" or run.cancel_requested:
        return []
    found: list[Violation] = []
    for name in split_wait_signals(run.wait_signal):
        if not name.startswith(CHILD_SIGNAL_PREFIX) or name in pending:
            continue
        child_id = name[len(CHILD_SIGNAL_PREFIX) :]
        known = runs.get(child_id)
        status = known.status if known is not None else None
        if known is None:
            record = _inner(store).get_run(child_id)
            status = None if record is None else record.status
        if status is None or status in FINISHED:
            ended = "no longer exists" if status is None else f"ended {status}"
            found.append(
                Violation(
                    kind="child_end_undelivered",
                    run_id=run.id,
                    detail=f"waits for child {child_id}, which {ended}, and no end of it is "
                    "stored for this run: it would wait for ever",
                )
            )
    return found


def _schedules(store: Store, runs: dict[str, _Run], now: float) -> list[Violation]:
    """One run per due time, none early, none skipped (see the module)."""
    found: list[Violation] = []
    for run in runs.values():
        if run.schedule is None or run.key is None:
            continue
        due = schedule_key_due(run.key, run.schedule)
        if due is None:
            continue
        if due > now or run.created_at < due:
            when = f"at {run.created_at!r}" if run.created_at < due else f"by {now!r}"
            found.append(
                Violation(
                    kind="schedule_early",
                    run_id=run.id,
                    detail=f"schedule {run.schedule!r} started it for {due!r}, {when}: "
                    "before its due time",
                )
            )
    for sched in _inner(store).list_schedules():
        if sched.paused:
            continue
        first = next_due(sched.cron, sched.tz, now)
        if sched.next_at > first:
            found.append(
                Violation(
                    kind="schedule_skipped",
                    run_id=sched.last_run,
                    detail=f"schedule {sched.name!r} is next due at {sched.next_at!r}, past "
                    f"{first!r}, the first time {sched.cron!r} names after {now!r}: that "
                    "time would start nothing",
                )
            )
    return found


def _pending_signals(store: Store, run_ids: Collection[str] | None) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for sig in _inner(store).list_signals():
        if sig.consumed_at is None and (run_ids is None or sig.run_id in run_ids):
            out.setdefault(sig.run_id, set()).add(sig.name)
    return out


def _signals(
    store: Store, steps: dict[str, list[_Row]], run_ids: Collection[str] | None
) -> list[Violation]:
    """Each stored signal is consumed by at most one wait, the wait whose position it
    names and which completed with it; each wait that completed with a signal
    consumed a stored one."""
    consumed: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for sig in _inner(store).list_signals():
        if sig.consumed_at is not None and (run_ids is None or sig.run_id in run_ids):
            consumed.setdefault((sig.run_id, str(sig.consumed_by)), []).append((sig.id, sig.name))
    found = [
        Violation(
            kind="signal_consumed_twice",
            run_id=rid,
            detail=f"signals {[s for s, _ in sigs]!r} were all consumed by wait {by}",
        )
        for (rid, by), sigs in consumed.items()
        if len(sigs) > 1
    ]
    for rid, rows in steps.items():
        waits = {r.pos: r for r in rows if r.kind == "signal"}
        found += _waits_without_signal(rid, waits, consumed)
        found += _signals_lost(rid, waits, consumed)
    return found


def _waits_without_signal(
    rid: str, waits: dict[str, _Row], consumed: dict[tuple[str, str], list[tuple[int, str]]]
) -> list[Violation]:
    found: list[Violation] = []
    for r in waits.values():
        # Rows a fork copied (epoch 0) consumed their signals in the source run.
        if r.status != "completed" or r.epoch == 0 or "signal" not in _json(r.output):
            continue
        if not consumed.get((rid, r.pos)):
            found.append(
                Violation(
                    kind="wait_without_signal",
                    run_id=rid,
                    detail=f"wait {r.pos} {r.name!r} completed with a signal but no "
                    "stored signal was consumed by it (one signal given to two waits?)",
                )
            )
    return found


def _signals_lost(
    rid: str, waits: dict[str, _Row], consumed: dict[tuple[str, str], list[tuple[int, str]]]
) -> list[Violation]:
    found: list[Violation] = []
    for (crid, by), sigs in consumed.items():
        if crid != rid:
            continue
        row = waits.get(by)
        if row is None or row.status != "completed" or row.name != sigs[0][1]:
            found.append(
                Violation(
                    kind="signal_lost",
                    run_id=rid,
                    detail=f"signal {sigs[0][0]} {sigs[0][1]!r} consumed by position {by}, "
                    f"which holds {None if row is None else (row.name, row.status)!r}",
                )
            )
    return found


def _events(store: Store, run_ids: Collection[str] | None, reopened: set[str]) -> list[Violation]:
    found: list[Violation] = []
    last: dict[tuple[str, str], str] = {}
    final = ("run.succeeded", "run.failed", "run.cancelled")
    rows = [
        (o["run_id"], o["webhook_id"], o["event"])
        for o in _inner(store).outbox()
        if o["event"] in final
    ]
    for rid, hook, event in rows:
        if (run_ids is not None and rid not in run_ids) or rid in reopened:
            continue
        if (rid, hook) in last:
            found.append(
                Violation(
                    kind="duplicate_event",
                    run_id=rid,
                    detail=f"{event!r} queued for webhook {hook!r} after {last[(rid, hook)]!r}: "
                    "a run that finished once is announced once",
                )
            )
        last[(rid, hook)] = event
    return found


def _json(text: str | None) -> Any:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
