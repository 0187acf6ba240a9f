"""A stateful property test of the Store against a small reference model.

Hypothesis drives random sequences of store calls (create with and without a key,
claim, commit of steps and transitions at the holder's epoch or a stale one,
heartbeat, signal, cancel, retry, fork, release, time passing) against a real
SQLite file or PostgreSQL database, and after every call compares the store with
what the model predicts: statuses, epochs moving on at each claim, fenced writes
refused, completed journal rows never changing, signals consumed once, plus the
shared invariants of :mod:`mainspring.testing`.

The default suite runs a modest number of examples; ``-m slow`` many more.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from mainspring import RunConflict, RunNotFound
from mainspring.storage import (
    FINISHED,
    RunTransition,
    RunWrite,
    SQLiteStore,
    StepRecord,
    Store,
)
from mainspring.testing import StoreHistory, check_invariants

LEASE_S = 10.0
MAX_RECOVERIES = 2
KEYS = ["k1", "k2", None, None]
SIGNALS = ["a", "b"]
STATS: Counter[str] = Counter()  # what the machine did, over all examples


@dataclass
class MRun:
    """The model of one run."""

    status: str = "queued"
    epoch: int = 0  # the last epoch a claim handed out (the store's may be higher)
    key: str | None = None
    session: int = 0
    lease_until: float | None = None
    wake_at: float | None = None
    wait_signal: str | None = None
    recoveries: int = 0
    cancel_requested: bool = False
    rows: dict[tuple[int, int], StepRecord] = field(default_factory=dict)
    # epochs handed out by earlier claims or ended by a finish, dead-letter, cancel or
    # retry: writes carrying them are refused (but for an identical re-sent finish)
    stale: list[int] = field(default_factory=list)
    output: str | None = None
    error: str | None = None


class StoreMachine(RuleBasedStateMachine):
    """Random store calls, checked against :class:`MRun` models."""

    backend = "sqlite"

    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_767_225_600.0
        self.model: dict[str, MRun] = {}
        self.keys: dict[str, str] = {}
        self.signals: dict[int, tuple[str, str, str | None]] = {}  # id -> run, name, by
        self.history = StoreHistory()
        if self.backend == "sqlite":
            self._tmp = tempfile.TemporaryDirectory()
            self.store: Store = SQLiteStore(Path(self._tmp.name) / "m.db")
        else:
            from mainspring.storage.postgres import PostgresStore

            pg.reset_migrated(PG_DSN[0])  # as the store would leave it: cheaper
            self.store = PostgresStore(PG_DSN[0], max_size=2)

    def teardown(self) -> None:
        self.store.close()
        if self.backend == "sqlite":
            self._tmp.cleanup()

    # -- rules ---------------------------------------------------------------------------

    @initialize(target=runs)
    def a_running_run(self) -> str:
        """Every example starts with a run held by a worker, so that commits, fences
        and heartbeats are reached early rather than by luck."""
        rid = self.create(None)
        self.claim(rid)
        return rid

    @rule(target=runs, key=st.sampled_from(KEYS))
    def create(self, key: str | None) -> str:
        rid = uuid.uuid4().hex
        record, created = self.store.create_run(
            run_id=rid, workflow="wf", input="[[],{}]", key=key, now=self.now
        )
        if key is not None and key in self.keys:
            assert not created and record.id == self.keys[key]
            return record.id
        assert created and record.id == rid and record.status == "queued"
        self.model[rid] = MRun(key=key)
        if key is not None:
            self.keys[key] = rid
        return rid

    @rule(run=runs)
    def claim(self, run: str) -> None:
        m = self.model[run]
        got = self.store.claim(
            worker="w",
            now=self.now,
            lease_s=LEASE_S,
            limit=1,
            workflows=None,
            max_recoveries=MAX_RECOVERIES,
            run_id=run,
        )
        due = m.wake_at is not None and m.wake_at <= self.now
        expired = m.status == "running" and m.lease_until is not None and m.lease_until < self.now
        if m.status == "queued" or (m.status in ("sleeping", "waiting") and due) or expired:
            recoveries = m.recoveries + 1 if expired else m.recoveries
            if expired and recoveries > MAX_RECOVERIES:
                STATS["dead-lettered"] += 1
                assert got == []
                # Dead-lettered; one asked to cancel ends as its finish would have.
                self._end(m, "cancelled" if m.cancel_requested else "failed")
                return
            [record] = got
            STATS["recovered" if expired else "claimed"] += 1
            assert record.epoch > m.epoch, "a claim must move the epoch on"
            if m.epoch:
                m.stale.append(m.epoch)
            m.epoch = record.epoch
            m.status, m.lease_until, m.recoveries = "running", self.now + LEASE_S, recoveries
            m.wake_at = m.wait_signal = None
        else:
            assert got == [], f"claimed a {m.status} run"

    def _pick(self, pick: int, stale: bool) -> str | None:
        """A run a writer could hold: with ``stale``, one with earlier epochs; else any
        run at all, running or not: the fence (DESIGN.md §11) refuses a commit unless
        the run is ``running`` at the writer's epoch."""
        found = [rid for rid, m in self.model.items() if m.stale or not stale]
        return found[pick % len(found)] if found else None

    @rule(
        pick=st.integers(0, 50),
        stale=st.booleans(),
        n=st.integers(0, 2),
        transition=st.sampled_from([None, "sleep", "wait", "finish", "fail", "next_session"]),
        signal=st.sampled_from(SIGNALS),
        consume=st.booleans(),
    )
    def commit(
        self, pick: int, stale: bool, n: int, transition: str | None, signal: str, consume: bool
    ) -> None:
        run = self._pick(pick, stale)
        if run is None:
            return
        m = self.model[run]
        epoch = m.stale[-1] if stale else m.epoch
        seq0 = max((s for (sess, s) in m.rows if sess == m.session), default=-1) + 1
        steps = [
            StepRecord(
                run_id=run,
                session=m.session,
                seq=seq0 + i,
                kind="step",
                name=f"s{seq0 + i}",
                status="completed",
                attempt=1,
                epoch=epoch,
                output=str(seq0 + i),
                started_at=self.now,
                finished_at=self.now,
            )
            for i in range(n)
        ]
        pending = [sid for sid, (r, name, by) in self.signals.items() if r == run and by is None]
        consumed: list[tuple[int, str]] = []
        if consume and pending:
            wait = StepRecord(
                run_id=run,
                session=m.session,
                seq=seq0 + n,
                kind="signal",
                name=self.signals[pending[0]][1],
                status="completed",
                attempt=1,
                epoch=epoch,
                output='{"signal":1}',
                started_at=self.now,
                finished_at=self.now,
            )
            steps.append(wait)
            consumed = [(pending[0], f"{m.session}:{seq0 + n}")]
        t = {
            None: None,
            "sleep": RunTransition(kind="suspend", status="sleeping", wake_at=self.now + 5),
            "wait": RunTransition(
                kind="suspend", status="waiting", wait_signal=signal, wait_reason=f"signal:{signal}"
            ),
            "finish": RunTransition(kind="finish", status="succeeded", output='"ok"'),
            "fail": RunTransition(kind="finish", status="failed", error='{"type":"X"}'),
            "next_session": RunTransition(kind="next_session", handoff='"h"'),
        }[transition]
        [result] = self.store.commit(
            [RunWrite(run_id=run, epoch=epoch, steps=steps, consume=consumed, transition=t)],
            self.now,
        )
        fenced_ok = not stale and m.status == "running"
        # A finish or suspend re-sent after it applied (an ambiguous commit) is answered
        # ok, already applied, and changes nothing; a finish that a cancel asked before
        # it turned into a cancel, too.
        already = t is not None and (
            (t.kind == "finish" and epoch + 1 == m.epoch and m.status == "cancelled")
            or (
                m.status == t.status
                and (
                    (t.kind == "suspend" and epoch == m.epoch)
                    or (
                        t.kind == "finish"
                        and epoch + 1 == m.epoch
                        and (m.output, m.error) == (t.output, t.error)
                    )
                )
            )
        )
        assert result.ok == (fenced_ok or already), (
            f"commit at epoch {epoch} ({'stale' if stale else 'holder'}) of a {m.status} run "
            f"answered {result!r}"
        )
        assert result.already == (already and not fenced_ok), result
        STATS[f"commit {'ok' if result.ok else 'refused'}"] += 1
        if not result.ok or result.already:
            STATS["commit already applied"] += result.already
            return
        STATS[f"commit {transition or 'steps'}"] += 1
        STATS["signal consumed"] += len(consumed)
        assert result.cancel_requested == m.cancel_requested
        for s in steps:
            m.rows[(s.session, s.seq)] = s
        for sid, by in consumed:
            self.signals[sid] = (run, self.signals[sid][1], by)
        if t is None:
            return
        if t.kind == "finish" and m.cancel_requested:
            # A cancel answered "asked" is honoured by the finish: cancelled, the
            # cancel's reason kept.
            self._end(m, "cancelled")
        elif t.kind == "finish":
            self._end(m, str(t.status), output=t.output, error=t.error)
        elif t.kind == "next_session":
            m.session += 1
        else:
            m.status, m.lease_until = str(t.status), None
            m.wake_at, m.wait_signal = t.wake_at, t.wait_signal
            waiting_for = [
                sid
                for sid, (r, name, by) in self.signals.items()
                if r == run and name == t.wait_signal and by is None
            ]
            if m.cancel_requested or waiting_for:
                m.wake_at = 0.0  # woken at once

    @rule(run=runs, stale=st.booleans())
    def heartbeat(self, run: str, stale: bool) -> None:
        m = self.model[run]
        if stale and not m.stale:
            return
        epoch = m.stale[-1] if stale else m.epoch
        beat = self.store.heartbeat(runs=[(run, epoch)], now=self.now, lease_s=LEASE_S)
        alive = not stale and m.status == "running"
        assert (run in beat.lost) == (not alive)
        if alive:
            m.lease_until = self.now + LEASE_S
            assert (run in beat.cancel) == m.cancel_requested

    @rule(run=runs, name=st.sampled_from(SIGNALS))
    def signal(self, run: str, name: str) -> None:
        m = self.model[run]
        if m.status in FINISHED:
            with pytest.raises(RunConflict):
                self.store.send_signal(run, name, "1", self.now)
            return
        sid = self.store.send_signal(run, name, "1", self.now)
        STATS["signal sent"] += 1
        assert sid not in self.signals
        self.signals[sid] = (run, name, None)
        if m.status == "waiting" and m.wait_signal == name:
            m.wake_at = 0.0

    @rule(run=runs)
    def cancel(self, run: str) -> None:
        m = self.model[run]
        status = self.store.cancel(run, self.now, "stop")
        if m.status in FINISHED:
            assert status == m.status
        elif m.status == "running":
            assert status == "running"
            m.cancel_requested = True
        else:
            assert status == "cancelled"
            m.cancel_requested = True
            self._end(m, "cancelled")

    @rule(run=runs)
    def retry(self, run: str) -> None:
        m = self.model[run]
        if m.status != "failed":
            with pytest.raises(RunConflict):
                self.store.retry_run(run, from_seq=None, now=self.now)
            return
        self.history.reopen(run)
        record = self.store.retry_run(run, from_seq=None, now=self.now)
        STATS["retried"] += 1
        assert record.status == "queued"
        self._bump(m)  # re-opening moves the fence on
        m.status, m.recoveries, m.cancel_requested = "queued", 0, False
        m.output = m.error = None
        m.wake_at = m.wait_signal = m.lease_until = None

    @rule(target=runs, run=runs, upto=st.integers(0, 3))
    def fork(self, run: str, upto: int) -> str:
        source = self.store.get_run(run)
        assert source is not None
        m = self.model[run]
        rid = uuid.uuid4().hex
        record = self.store.fork_run(
            source, run_id=rid, session=m.session, upto_seq=upto, output=None, now=self.now
        )
        assert record.status == "queued" and record.session == m.session
        copied = {
            k: StepRecord(**{**_fields(s), "run_id": rid, "epoch": 0})
            for k, s in m.rows.items()
            if k[0] == m.session and k[1] <= upto
        }
        self.model[rid] = MRun(session=m.session, rows=copied)
        return rid

    @rule(run=runs)
    def release(self, run: str) -> None:
        m = self.model[run]
        released = self.store.release(run, m.epoch, self.now)
        assert released == (m.status == "running")
        if released:
            m.status, m.lease_until = "queued", None

    @rule(seconds=st.sampled_from([1.0, 6.0, LEASE_S + 1]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule(run=runs)
    def lookup_missing(self, run: str) -> None:
        with pytest.raises(RunNotFound):
            self.store.send_signal(run + "x", "a", "1", self.now)

    # -- checks after every rule ---------------------------------------------------------

    @invariant()
    def store_matches_model(self) -> None:
        for rid, m in self.model.items():
            record = self.store.get_run(rid)
            assert record is not None
            assert record.status == m.status, (rid, record.status, m)
            assert record.epoch == m.epoch, (rid, record.epoch, m)
            assert record.session == m.session
            assert record.cancel_requested == m.cancel_requested
            if m.status in ("sleeping", "waiting"):
                assert record.wake_at == m.wake_at, (record.wake_at, m.wake_at)
            rows = {(s.session, s.seq): s for s in self.store.load_steps(rid)}
            for k, s in m.rows.items():
                assert k in rows and rows[k].status == s.status and rows[k].output == s.output
        stored = {sig.id: sig.consumed_by for sig in self.store.list_signals()}
        assert stored == {sid: by for sid, (_, _, by) in self.signals.items()}

    @invariant()
    def shared_invariants_hold(self) -> None:
        found = check_invariants(self.store, history=self.history, now=self.now)
        # A model run parked for a signal that no rule will send is legitimate here,
        # and so are "unended" rows: the machine writes rows, not workflows.
        assert [v for v in found if v.kind not in ("unended_row",)] == []

    def _end(
        self, m: MRun, status: str, *, output: str | None = None, error: str | None = "?"
    ) -> None:
        """A run ends: the epoch moves on, so its last holder is fenced off."""
        self._bump(m)
        m.status, m.lease_until, m.wake_at, m.wait_signal = status, None, None, None
        m.output, m.error = output, error

    def _bump(self, m: MRun) -> None:
        if m.epoch:
            m.stale.append(m.epoch)
        m.epoch += 1


def _fields(s: StepRecord) -> dict[str, Any]:
    return {f: getattr(s, f) for f in StepRecord.__dataclass_fields__}


PG_DSN: list[str] = []
FAST = settings(
    max_examples=80,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
PG_FAST = settings(FAST, max_examples=30)
THOROUGH = settings(FAST, max_examples=500, stateful_step_count=80)


def _machine(backend: str, config: settings) -> Any:
    cls = type(f"StoreMachine_{backend}", (StoreMachine,), {"backend": backend})
    return settings(config)(cls).TestCase


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> Any:
    if request.param == "postgres":
        if not os.environ.get(pg.DSN_VAR):
            pytest.skip(f"{pg.DSN_VAR} is not set")
        dsn, name = pg.create_database()
        PG_DSN[:] = [dsn]
        yield "postgres"
        pg.drop_database(name)
    else:
        yield "sqlite"


def _run_machine(backend: str, config: settings) -> None:
    STATS.clear()
    _machine(backend, config)().runTest()
    print(f"\nstore model on {backend}: {dict(sorted(STATS.items()))}")
    # The examples reached what the model is about (else it checked little).
    for what in ("claimed", "commit ok", "signal sent"):
        assert STATS[what] > 0, (what, STATS)


def test_store_against_its_model(backend: str) -> None:
    _run_machine(backend, FAST if backend == "sqlite" else PG_FAST)


@pytest.mark.slow
def test_store_against_its_model_thoroughly(backend: str) -> None:
    _run_machine(backend, THOROUGH)
