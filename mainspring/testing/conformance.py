"""The Store conformance suite: what every storage backend must do.

Subclass it in a test module and say how to make a fresh, empty store::

    from mainspring.testing.conformance import StoreConformance

    class TestMyStore(StoreConformance):
        def make_store(self) -> Store:
            return MyStore(...)

pytest collects the ``test_*`` methods. Each test opens its own stores through
:meth:`make_store` (twice where two processes are played) and closes them.
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .._errors import RunConflict, RunNotFound, SchemaVersionError
from ..storage import (
    SCHEMA_VERSION,
    ParentClose,
    RunStatus,
    RunTransition,
    RunWrite,
    StepRecord,
    Store,
)
from ._queue_conformance import QueueConformance
from ._stream_conformance import StreamConformance
from ._transition_conformance import TransitionConformance

__all__ = ["StoreConformance"]

T0 = 1_000_000.0
LEASE = 15.0


@contextmanager
def _refused(error: type[Exception], accepted: str, *, quoted: str = "") -> Iterator[None]:
    """The block must raise ``error``, its message quoting ``quoted``; else the test
    fails saying ``accepted`` was accepted. The suite ships in the package and runs
    under any test runner, so it spells this itself rather than ``pytest.raises``."""
    try:
        yield
    except error as exc:
        assert quoted in str(exc), exc
    else:
        raise AssertionError(f"{accepted} was accepted")


def _race(stores: list[Store], work: Callable[[int], None]) -> None:
    """Run ``work(i)`` for each of ``stores`` at once, a thread each, wait for them all
    and close the stores: how the suite makes writers meet on one database."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for extra in stores:
        extra.close()


def _step(run_id: str, seq: int, epoch: int, status: str = "completed", **kw: Any) -> StepRecord:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "session": 0,
        "seq": seq,
        "kind": "step",
        "name": f"s{seq}",
        "status": status,
        "attempt": 1,
        "epoch": epoch,
        "output": str(seq),
        "started_at": T0,
        "finished_at": T0 if status == "completed" else None,
    }
    fields.update(kw)
    return StepRecord(**fields)


class StoreConformance(QueueConformance, StreamConformance, TransitionConformance):
    """Behaviour every :class:`Store` must have. Override :meth:`make_store`."""

    @abstractmethod
    def make_store(self) -> Store:
        """A store on a fresh, empty database. Called once per test (a second call
        in the same test must open the *same* database, as a second process would)."""

    def reopen(self) -> Store:
        """A second store on the same database as the last :meth:`make_store`."""
        return self.make_store()

    @contextmanager
    def store(self) -> Iterator[Store]:
        s = self.make_store()
        try:
            yield s
        finally:
            s.close()

    def _claim(self, s: Store, now: float = T0, **kw: Any) -> list[Any]:
        args: dict[str, Any] = {
            "worker": "w1",
            "now": now,
            "lease_s": LEASE,
            "limit": 10,
            "workflows": ["wf"],
            "max_recoveries": 3,
        }
        args.update(kw)
        return s.claim(**args)

    def _new(self, s: Store, run_id: str, key: str | None = None, now: float = T0) -> None:
        s.create_run(
            run_id=run_id, workflow="wf", input='{"args":[],"kwargs":{}}', key=key, now=now
        )

    # -- schema ---------------------------------------------------------------------

    def test_migrate_is_idempotent(self) -> None:
        with self.store() as s:
            assert s.schema_version() == SCHEMA_VERSION
            assert s.migrate() == SCHEMA_VERSION
            assert s.schema_version() == SCHEMA_VERSION

    def test_newer_schema_is_refused(self) -> None:
        with self.store() as s:
            s.stamp_schema_version(SCHEMA_VERSION + 1)
            with _refused(SchemaVersionError, "a newer schema", quoted=str(SCHEMA_VERSION + 1)):
                s.migrate()

    def test_stored_schema_version_is_read_without_migrating(self) -> None:
        with self.store() as s:
            assert s.stored_schema_version() == SCHEMA_VERSION
            s.stamp_schema_version(SCHEMA_VERSION + 1)
            assert s.stored_schema_version() == SCHEMA_VERSION + 1

    # -- runs -------------------------------------------------------------------------

    def test_create_run_is_idempotent_by_key(self) -> None:
        with self.store() as s:
            a, created_a = s.create_run(run_id="a", workflow="wf", input="{}", key="k", now=T0)
            b, created_b = s.create_run(run_id="b", workflow="wf", input="{}", key="k", now=T0)
            assert (created_a, created_b) == (True, False)
            assert b.id == "a" and a.status == "queued"
            assert s.get_run("b") is None
            with _refused(RunConflict, "a key reused for another workflow", quoted="'k'"):
                s.create_run(run_id="c", workflow="other", input="{}", key="k", now=T0)

    def test_list_and_count_runs(self) -> None:
        with self.store() as s:
            for i in range(5):
                self._new(s, f"r{i}", now=T0 + i)
            self._claim(s, limit=2)
            listed = s.list_runs(limit=10)
            assert [r.id for r in listed] == ["r4", "r3", "r2", "r1", "r0"]
            assert [r.id for r in s.list_runs(statuses=["running"])] == ["r1", "r0"]
            assert [r.id for r in s.list_runs(limit=2, offset=1)] == ["r3", "r2"]
            assert s.count_runs() == {"running": 2, "queued": 3}

    # -- claims, leases, fencing ----------------------------------------------------------

    def test_claim_bumps_epoch_and_leases(self) -> None:
        with self.store() as s:
            self._new(s, "r1")
            [run] = self._claim(s)
            assert (run.status, run.epoch, run.owner) == ("running", 1, "w1")
            assert run.lease_until == T0 + LEASE
            assert self._claim(s, worker="w2") == []  # leased: nobody else gets it

    def test_claim_respects_limit_and_workflow_names(self) -> None:
        with self.store() as s:
            for i in range(3):
                self._new(s, f"r{i}", now=T0 + i)
            s.create_run(run_id="x", workflow="other", input="{}", key=None, now=T0)
            assert [r.id for r in self._claim(s, limit=2)] == ["r0", "r1"]
            assert [r.id for r in self._claim(s)] == ["r2"]
            assert self._claim(s, workflows=[]) == []
            assert [r.id for r in self._claim(s, workflows=["other"])] == ["x"]

    def test_claim_takes_only_the_versions_asked_for(self) -> None:
        with self.store() as s:
            for i, version in enumerate(["v1", "v2", None, "v1"]):
                s.create_run(
                    run_id=f"r{i}", workflow="wf", input="{}", key=None, now=T0 + i,
                    version=version,
                )  # fmt: skip
            assert [r.id for r in s.list_runs(versions=["v1"])] == ["r3", "r0"]
            assert [r.id for r in s.list_runs(versions=[None])] == ["r2"]
            assert self._claim(s, versions=[]) == []
            assert self._claim(s, versions=["v3"]) == []
            assert self._claim(s, run_id="r1", versions=["v1", None]) == []  # by id too
            # Queued runs of v1; then r0 sleeps and r3's lease runs out: a due sleeper
            # and an expired lease, each filtered like a queued run.
            claimed = self._claim(s, versions=["v1"])
            assert [r.id for r in claimed] == ["r0", "r3"]
            sleep = RunTransition(kind="suspend", status="sleeping", wake_at=T0 + 5)
            s.commit([RunWrite(run_id="r0", epoch=claimed[0].epoch, transition=sleep)], T0)
            assert s.next_wake(["wf"], versions=["v2", None]) is None
            assert s.next_wake(["wf"], versions=["v1"]) == T0 + 5
            later = T0 + LEASE + 1
            got = self._claim(s, now=later, worker="w2", versions=["v2"])
            assert [r.id for r in got] == ["r1"]
            got = self._claim(s, now=later, worker="w3", versions=["v1"])
            assert sorted(r.id for r in got) == ["r0", "r3"]
            assert all(r.epoch == 2 for r in got)
            assert [r.id for r in self._claim(s, now=later, versions=[None, "v1"])] == ["r2"]

    def test_expired_lease_is_taken_over_with_a_new_epoch(self) -> None:
        with self.store() as s:
            self._new(s, "r1")
            [first] = self._claim(s)
            assert self._claim(s, worker="w2", now=T0 + LEASE - 1) == []
            [second] = self._claim(s, worker="w2", now=T0 + LEASE + 1)
            assert second.epoch == first.epoch + 1 and second.owner == "w2"
            assert second.recoveries == 1

    def test_stale_epoch_writes_nothing(self) -> None:
        with self.store() as s:
            self._new(s, "r1")
            [old] = self._claim(s)
            [new] = self._claim(s, worker="w2", now=T0 + LEASE + 1)
            [stale, fresh] = s.commit(
                [
                    RunWrite(run_id="r1", epoch=old.epoch, steps=[_step("r1", 0, old.epoch)]),
                    RunWrite(run_id="r1", epoch=new.epoch, steps=[_step("r1", 1, new.epoch)]),
                ],
                T0,
            )
            assert not stale.ok and fresh.ok
            assert [st.seq for st in s.load_steps("r1")] == [1]
            assert not s.heartbeat(runs=[("r1", new.epoch)], now=T0, lease_s=LEASE).lost
            beat = s.heartbeat(runs=[("r1", old.epoch)], now=T0, lease_s=LEASE)
            assert beat.lost == {"r1"}
            assert not s.release("r1", old.epoch, T0)

    def test_commit_is_idempotent(self) -> None:
        with self.store() as s:
            self._new(s, "r1")
            [run] = self._claim(s)
            write = RunWrite(
                run_id="r1",
                epoch=run.epoch,
                steps=[_step("r1", 0, run.epoch, status="started", output=None)],
            )
            s.commit([write], T0)
            done = RunWrite(run_id="r1", epoch=run.epoch, steps=[_step("r1", 0, run.epoch)])
            s.commit([done], T0)
            s.commit([done], T0)  # an ambiguous commit, sent again
            [row] = s.load_steps("r1")
            assert (row.status, row.output) == ("completed", "0")

    def test_a_batch_of_runs_says_which_were_asked_to_cancel(self) -> None:
        with self.store() as s:
            for rid in ("a", "b", "c"):
                self._new(s, rid)
            runs = {r.id: r for r in self._claim(s)}
            s.cancel("b", T0)
            results = s.commit(
                [
                    RunWrite(
                        run_id=rid, epoch=runs[rid].epoch, steps=[_step(rid, 0, runs[rid].epoch)]
                    )
                    for rid in ("c", "a", "b")
                ],
                T0,
            )
            assert [(r.ok, r.cancel_requested) for r in results] == [
                (True, False),
                (True, False),
                (True, True),
            ]
            assert [len(s.load_steps(rid)) for rid in ("a", "b", "c")] == [1, 1, 1]
            for rid, asked in (("a", False), ("b", True)):  # a run alone, as a worker commits
                step = _step(rid, 1, runs[rid].epoch)
                [alone] = s.commit([RunWrite(run_id=rid, epoch=runs[rid].epoch, steps=[step])], T0)
                assert (alone.ok, alone.cancel_requested) == (True, asked)

    def test_step_role_round_trips_and_forks_copy_it(self) -> None:
        roles = ("step", "model", "tool", "rate", "wait")
        with self.store() as s:
            self._new(s, "r1")
            [run] = self._claim(s)
            steps = [_step("r1", i, run.epoch, role=r) for i, r in enumerate(roles)]
            steps[0] = _step("r1", 0, run.epoch, status="started", role="step")
            steps.append(_step("r1", len(roles), run.epoch, kind="sleep", name="sleep"))
            assert s.commit([RunWrite(run_id="r1", epoch=run.epoch, steps=steps)], T0)[0].ok
            assert [r.role for r in s.load_steps("r1")] == [*roles, "step"]
            # A later write of the row (its next attempt) carries the role it declares.
            again = _step("r1", 0, run.epoch, status="started", attempt=2, role="tool")
            s.commit([RunWrite(run_id="r1", epoch=run.epoch, steps=[again])], T0)
            assert s.load_steps("r1")[0].role == "tool"
            source = s.get_run("r1")
            assert source is not None
            s.fork_run(source, run_id="f1", session=0, upto_seq=4, output=None, now=T0)
            assert [r.role for r in s.load_steps("f1")] == ["tool", *roles[1:]]

    def test_dead_letter_after_repeated_recoveries(self) -> None:
        with self.store() as s:
            self._new(s, "r1")
            now = T0
            for expected in range(0, 4):
                [run] = self._claim(s, now=now, max_recoveries=3)
                assert run.recoveries == expected
                now += LEASE + 1
            assert self._claim(s, now=now, max_recoveries=3) == []
            dead = s.get_run("r1")
            assert dead is not None and dead.status == "failed"
            assert dead.error is not None and "dead-lettered" in dead.error

    def test_progress_resets_recoveries(self) -> None:
        with self.store() as s:
            self._new(s, "r1")
            self._claim(s)
            [run] = self._claim(s, now=T0 + LEASE + 1)
            assert run.recoveries == 1
            s.commit([RunWrite(run_id="r1", epoch=run.epoch, reset_recoveries=True)], T0)
            got = s.get_run("r1")
            assert got is not None and got.recoveries == 0

    def test_a_suspect_run_is_claimed_only_alone(self) -> None:
        with self.store() as s:
            for rid in ("poison", "n1", "n2"):
                self._new(s, rid)
            iso = {"isolate_after": 2, "max_recoveries": 5}
            now = T0
            for _ in range(2):  # two crashes of the worker that held all three
                assert len(self._claim(s, now=now, alone=True, **iso)) == 3
                now += LEASE + 1
            # Recovered twice without progress: suspects, not for a busy worker ...
            assert self._claim(s, now=now, alone=False, **iso) == []
            # ... and one at a time for an idle one.
            [first] = self._claim(s, now=now, alone=True, **iso)
            assert first.recoveries == 2
            s.commit([RunWrite(run_id=first.id, epoch=first.epoch, reset_recoveries=True)], now)
            assert self._claim(s, now=now, alone=False, **iso) == []  # the others wait
            assert len(self._claim(s, now=now, alone=True, **iso)) == 1
            # Without isolate_after the store isolates nothing (as before).
            assert len(self._claim(s, now=now)) == 1

    def test_leases_on_the_database_clock_ignore_the_callers(self) -> None:
        with self.store() as s:
            self._new(s, "r1")
            real = time.time()
            [run] = self._claim(s, now=real, db_clock=True)
            if not s.has_db_clock:  # one machine, one clock (SQLite): the caller's
                assert run.lease_until == real + LEASE
                return
            ahead = real + 3600  # a caller whose clock is an hour ahead
            assert self._claim(s, now=ahead, db_clock=True) == []
            beat = s.heartbeat(runs=[("r1", run.epoch)], now=ahead, lease_s=LEASE, db_clock=True)
            assert not beat.lost
            got = s.get_run("r1")
            assert got is not None and got.lease_until is not None
            assert got.lease_until < real + LEASE + 600  # the server's time, not the caller's

    def test_release_requeues_without_counting_a_recovery(self) -> None:
        with self.store() as s:
            self._new(s, "r1")
            [run] = self._claim(s)
            assert s.release("r1", run.epoch, T0)
            [again] = self._claim(s, worker="w2")
            assert again.recoveries == 0 and again.epoch == run.epoch + 1

    def test_concurrent_claims_never_share_a_run(self) -> None:
        with self.store() as s:
            for i in range(60):
                self._new(s, f"r{i}", now=T0 + i)
            claimed: list[list[str]] = [[], [], []]
            stores = [self.reopen() for _ in claimed]

            def take(i: int) -> None:
                while True:
                    got = self._claim(stores[i], worker=f"w{i}", limit=3)
                    if not got:
                        return
                    claimed[i].extend(r.id for r in got)

            _race(stores, take)
            everything = [rid for ids in claimed for rid in ids]
            assert sorted(everything) == sorted(f"r{i}" for i in range(60))

    # -- suspension, signals, sessions, cancellation ------------------------------------

    def test_sleeping_run_wakes_on_time(self) -> None:
        with self.store() as s:
            self._new(s, "r1")
            [run] = self._claim(s)
            t = RunTransition(kind="suspend", status="sleeping", wake_at=T0 + 60)
            s.commit([RunWrite(run_id="r1", epoch=run.epoch, transition=t)], T0)
            got = s.get_run("r1")
            assert got is not None and got.status == "sleeping" and got.owner is None
            assert self._claim(s, now=T0 + 59) == []
            [woken] = self._claim(s, now=T0 + 60)
            assert woken.epoch == run.epoch + 1 and woken.recoveries == 0

    def test_signal_before_the_wait_is_not_lost(self) -> None:
        with self.store() as s:
            self._new(s, "r1")
            [run] = self._claim(s)
            sid = s.send_signal("r1", "go", '"early"', T0)
            t = RunTransition(kind="suspend", status="waiting", wait_signal="go")
            s.commit([RunWrite(run_id="r1", epoch=run.epoch, transition=t)], T0 + 1)
            [woken] = self._claim(s, now=T0 + 1)  # woken at once: the signal was there
            found = s.next_signal("r1", "go")
            assert found is not None and found.id == sid and found.payload == '"early"'
            s.commit([RunWrite(run_id="r1", epoch=woken.epoch, consume=[(sid, "0:0")])], T0)
            assert s.next_signal("r1", "go") is None

    def test_signal_wakes_a_waiting_run(self) -> None:
        with self.store() as s:
            self._new(s, "r1")
            [run] = self._claim(s)
            t = RunTransition(kind="suspend", status="waiting", wait_signal="go")
            s.commit([RunWrite(run_id="r1", epoch=run.epoch, transition=t)], T0)
            assert self._claim(s, now=T0 + 10_000) == []  # no timeout: waits forever
            s.send_signal("r1", "other", "1", T0)
            assert self._claim(s, now=T0 + 1) == []  # not the awaited signal
            first = s.send_signal("r1", "go", "1", T0)
            second = s.send_signal("r1", "go", "2", T0)
            assert [r.id for r in self._claim(s, now=T0 + 1)] == ["r1"]
            found = s.next_signal("r1", "go")
            assert found is not None and found.id == first and second > first

    def test_signal_errors(self) -> None:
        with self.store() as s:
            with _refused(RunNotFound, "a signal to an unknown run", quoted="'nope'"):
                s.send_signal("nope", "go", "1", T0)
            self._new(s, "r1")
            [run] = self._claim(s)
            done = RunTransition(kind="finish", status="succeeded", output="1")
            s.commit([RunWrite(run_id="r1", epoch=run.epoch, transition=done)], T0)
            with _refused(RunConflict, "a signal to a finished run", quoted="succeeded"):
                s.send_signal("r1", "go", "1", T0)

    def test_next_session_filters_the_journal(self) -> None:
        with self.store() as s:
            self._new(s, "r1")
            [run] = self._claim(s)
            s.commit(
                [
                    RunWrite(
                        run_id="r1",
                        epoch=run.epoch,
                        steps=[_step("r1", 0, run.epoch)],
                        transition=RunTransition(kind="next_session", handoff='{"n":1}'),
                    )
                ],
                T0,
            )
            s.commit(
                [RunWrite(run_id="r1", epoch=run.epoch, steps=[_step("r1", 0, 1, session=1)])],
                T0,
            )
            got = s.get_run("r1")
            assert got is not None and got.session == 1 and got.handoff == '{"n":1}'
            assert [(x.session, x.seq) for x in s.load_steps("r1", 1)] == [(1, 0)]
            assert len(s.load_steps("r1")) == 2

    def test_cancel(self) -> None:
        with self.store() as s:
            self._new(s, "queued")
            self._new(s, "running", now=T0 + 1)
            [run] = self._claim(s, limit=1, now=T0 + 2)
            assert run.id == "queued"
            assert s.cancel("queued", T0) == "running"
            beat = s.heartbeat(runs=[("queued", run.epoch)], now=T0, lease_s=LEASE)
            assert beat.cancel == {"queued"}
            assert s.cancel("running", T0) == "cancelled"
            assert s.cancel("running", T0) == "cancelled"
            assert self._claim(s) == []
            with _refused(RunNotFound, "cancelling an unknown run"):
                s.cancel("nope", T0)

    def test_a_run_that_ends_cancels_the_children_its_end_reaches(self) -> None:
        """A finish (p1, committed beside another run's suspend) or a dead-letter (p2)
        cancels the unfinished children started with ``parent_close="cancel"`` and
        their own children, running or not; ``"abandon"`` children and finished ones
        are left as they are."""
        with self.store() as s:
            family: list[tuple[str, str | None, ParentClose]] = [
                ("p1", None, "cancel"),
                ("p2", None, "cancel"),
                ("p1-kept", "p1", "cancel"),
                ("p1-kept-kid", "p1-kept", "cancel"),
                ("p1-free", "p1", "abandon"),
                ("p2-kept", "p2", "cancel"),
                ("p2-free", "p2", "abandon"),
            ]
            for rid, parent, close in family:
                workflow = "wf" if parent is None else "kid"
                s.create_run(run_id=rid, workflow=workflow, input="{}", key=None, now=T0,
                             parent=parent, parent_step=None if parent is None else "0:0",
                             parent_close=close)  # fmt: skip
            self._new(s, "other")
            held = {r.id: r.epoch for r in self._claim(s, max_recoveries=0)}
            [kept] = self._claim(s, run_id="p1-kept", workflows=["kid"])
            done = RunTransition(kind="finish", status="succeeded", output="1")
            nap = RunTransition(kind="suspend", status="sleeping", wake_at=T0 + 60)
            writes = [
                RunWrite(run_id="p1", epoch=held["p1"], transition=done),
                RunWrite(run_id="other", epoch=held["other"], transition=nap),
            ]
            assert [r.ok for r in s.commit(writes, T0 + 1)] == [True, True]
            assert self._claim(s, now=T0 + LEASE + 1, max_recoveries=0) == []  # p2 dead
            runs = {rid: s.get_run(rid) for rid in ("p1-kept", "p1-kept-kid", "p2-kept")}
            runs |= {rid: s.get_run(rid) for rid in ("p1-free", "p2-free", "p2")}
            got = {rid: (r.status, r.cancel_requested) for rid, r in runs.items() if r}
            assert got == {
                "p1-kept": ("running", True),  # its worker cancels it at its next commit
                "p1-kept-kid": ("cancelled", True),
                "p2-kept": ("cancelled", True),
                "p1-free": ("queued", False),
                "p2-free": ("queued", False),
                "p2": ("failed", False),
            }
            beat = s.heartbeat(runs=[("p1-kept", kept.epoch)], now=T0 + 2, lease_s=LEASE)
            assert beat.cancel == {"p1-kept"}
            assert "its parent run 'p2' failed" in (runs["p2-kept"].error or "")  # type: ignore[union-attr]

    def test_finish_records_output(self) -> None:
        with self.store() as s:
            self._new(s, "r1")
            [run] = self._claim(s)
            done = RunTransition(kind="finish", status="succeeded", output='{"ok":true}')
            [res] = s.commit([RunWrite(run_id="r1", epoch=run.epoch, transition=done)], T0 + 5)
            assert res.ok
            got = s.get_run("r1")
            assert got is not None
            assert (got.status, got.output, got.finished_at, got.owner) == (
                "succeeded",
                '{"ok":true}',
                T0 + 5,
                None,
            )

    # -- retention ------------------------------------------------------------------------

    def _finish(self, s: Store, run_id: str, now: float, status: RunStatus = "succeeded") -> None:
        """Claim the run at ``now`` and finish it then, with two journal rows."""
        [run] = self._claim(s, now=now, run_id=run_id)
        done = RunTransition(
            kind="finish",
            status=status,
            output="1" if status == "succeeded" else None,
            error=None if status == "succeeded" else '{"type":"ValueError","message":"no"}',
        )
        steps = [_step(run_id, seq, run.epoch) for seq in range(2)]
        s.commit([RunWrite(run_id=run_id, epoch=run.epoch, steps=steps, transition=done)], now)

    def test_prune_deletes_old_finished_runs_and_their_rows(self) -> None:
        day = 86_400.0
        with self.store() as s:
            for rid in ("ok", "failed", "cancelled", "recent", "queued", "waiting", "running"):
                self._new(s, rid)
            s.send_signal("ok", "go", "1", T0)
            self._finish(s, "ok", T0)
            self._finish(s, "failed", T0, status="failed")
            assert s.cancel("cancelled", T0) == "cancelled"
            self._finish(s, "recent", T0 + 2 * day)
            # Old unfinished runs, with journal rows and a signal of their own.
            [w] = self._claim(s, run_id="waiting")
            wait = RunTransition(kind="suspend", status="waiting", wait_signal="go")
            s.commit(
                [
                    RunWrite(
                        run_id="waiting",
                        epoch=w.epoch,
                        steps=[_step("waiting", 0, w.epoch)],
                        transition=wait,
                    )
                ],
                T0,
            )
            s.send_signal("waiting", "other", "2", T0)
            [r] = self._claim(s, run_id="running")
            s.commit(
                [RunWrite(run_id="running", epoch=r.epoch, steps=[_step("running", 0, r.epoch)])],
                T0,
            )
            kept = ("recent", "queued", "waiting", "running")
            journals = {rid: s.load_steps(rid) for rid in kept}

            now = T0 + 3 * day  # cut-off: T0 + 1 day
            dry = s.prune(2 * day, now, dry_run=True)
            assert (dry.runs, dry.steps, dry.signals) == (3, 4, 1)
            assert s.get_run("ok") is not None, "a dry run deleted something"
            done = s.prune(2 * day, now)
            assert (done.runs, done.steps, done.signals) == (3, 4, 1)
            for rid in ("ok", "failed", "cancelled"):
                assert s.get_run(rid) is None and s.load_steps(rid) == []
            assert s.next_signal("ok", "go") is None
            assert sorted(r.id for r in s.list_runs()) == sorted(kept)
            assert {rid: s.load_steps(rid) for rid in kept} == journals
            assert s.next_signal("waiting", "other") is not None
            again = s.prune(2 * day, now)
            assert (again.runs, again.steps, again.signals) == (0, 0, 0)

            # However old, an unfinished run stays: only the recent finished run goes.
            late = s.prune(0, T0 + 1000 * day)
            assert (late.runs, late.steps, late.signals) == (1, 2, 0)
            assert sorted(r.id for r in s.list_runs()) == ["queued", "running", "waiting"]
            assert s.count_runs() == {"queued": 1, "running": 1, "waiting": 1}
            assert len(s.load_steps("waiting")) == 1 and len(s.load_steps("running")) == 1

    def test_prune_works_in_batches(self) -> None:
        with self.store() as s:
            for i in range(5):
                self._new(s, f"r{i}")
                self._finish(s, f"r{i}", T0 + i)
            self._new(s, "young")
            self._finish(s, "young", T0 + 100)
            dry = s.prune(50, T0 + 100, batch=2, dry_run=True)
            assert (dry.runs, dry.steps, dry.signals) == (5, 10, 0)
            done = s.prune(50, T0 + 100, batch=2)
            assert (done.runs, done.steps, done.signals) == (5, 10, 0)
            assert [r.id for r in s.list_runs()] == ["young"]
            assert [st.run_id for st in s.iter_all_steps()] == ["young", "young"]
            with _refused(ValueError, "batch=0", quoted="batch"):
                s.prune(50, T0 + 100, batch=0)

    # -- schedules --------------------------------------------------------------------

    def _schedule(self, s: Store, cron: str = "0 9 * * *", next_at: float = T0) -> bool:
        return s.put_schedule(
            name="daily",
            cron=cron,
            tz="UTC",
            workflow="wf",
            input='{"args":[],"kwargs":{}}',
            catch_up="skip",
            next_at=next_at,
            now=T0,
        )[1]

    def test_put_schedule_keeps_an_unchanged_definition_and_rewrites_a_changed_one(self) -> None:
        with self.store() as s:
            assert self._schedule(s)
            assert s.set_schedule_paused("daily", True, now=T0)
            assert not self._schedule(s, next_at=T0 + 99)  # unchanged: state kept
            kept = s.get_schedule("daily")
            assert kept is not None and kept.paused and kept.next_at == T0
            assert self._schedule(s, cron="0 10 * * *", next_at=T0 + 99)
            changed = s.get_schedule("daily")
            assert changed is not None and changed.next_at == T0 + 99 and changed.paused
            assert [r.name for r in s.list_schedules()] == ["daily"]
            assert not s.set_schedule_paused("nope", True, now=T0)
            assert s.get_schedule("nope") is None

    def test_concurrent_fires_of_one_due_time_start_one_run(self) -> None:
        with self.store() as s:
            self._schedule(s)
            assert [r.name for r in s.due_schedules(T0)] == ["daily"]
            assert s.due_schedules(T0 - 1) == []
            stores = [self.reopen() for _ in range(4)]
            started: list[str | None] = [None] * len(stores)
            barrier = threading.Barrier(len(stores))

            def fire(i: int) -> None:
                barrier.wait()
                started[i] = stores[i].fire_schedule(
                    name="daily",
                    seen_next_at=T0,
                    next_at=T0 + 86_400,
                    due_at=T0,
                    run_id=f"r{i}",
                    key="schedule:daily:T0",
                    version=None,
                    now=T0,
                )

            _race(stores, fire)
            (winner,) = [r for r in started if r is not None]
            run = s.get_run(winner)
            assert run is not None and run.key == "schedule:daily:T0" and run.status == "queued"
            row = s.get_schedule("daily")
            assert row is not None and row.next_at == T0 + 86_400 and row.last_run == winner
            assert s.due_schedules(T0 + 1) == []

    def test_a_paused_schedule_is_not_due_and_does_not_fire(self) -> None:
        with self.store() as s:
            self._schedule(s)
            s.set_schedule_paused("daily", True, now=T0)
            assert s.due_schedules(T0 + 10) == []
            fired = s.fire_schedule(
                name="daily",
                seen_next_at=T0,
                next_at=T0 + 86_400,
                due_at=T0,
                run_id="r",
                key="schedule:daily:T0",
                version=None,
                now=T0,
            )
            assert fired is None and s.get_run("r") is None
            s.set_schedule_paused("daily", False, now=T0, next_at=T0 + 86_400)
            row = s.get_schedule("daily")
            assert row is not None and not row.paused and row.next_at == T0 + 86_400
            # A skipped time moves the schedule on and starts nothing.
            assert (
                s.fire_schedule(
                    name="daily",
                    seen_next_at=T0 + 86_400,
                    next_at=T0 + 2 * 86_400,
                    due_at=None,
                    run_id="r",
                    key="schedule:daily:T1",
                    version=None,
                    now=T0,
                )
                is None
            )
            moved = s.get_schedule("daily")
            assert moved is not None and moved.next_at == T0 + 2 * 86_400 and moved.last_run is None
