"""The queue part of the Store conformance suite (mixed into
:class:`~mainspring.testing.conformance.StoreConformance`): a claim never starts a run
of a queue beyond its limits, whoever claims and however."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError
from ..storage import RunTransition, RunWrite, Store

__all__ = ["QueueConformance"]

T0 = 1_000_000.0
LEASE = 15.0


class QueueConformance:
    """Queues: concurrency, per-key limits, priorities, the rate of starts."""

    if TYPE_CHECKING:  # what StoreConformance provides

        def store(self) -> AbstractContextManager[Store]: ...

        def make_store(self) -> Store: ...

        def reopen(self) -> Store: ...

        def _claim(self, s: Store, now: float = T0, **kw: Any) -> list[Any]: ...

    def _queued(
        self,
        s: Store,
        run_id: str,
        queue: str | None = "q",
        *,
        key: str | None = None,
        priority: int = 0,
        now: float = T0,
    ) -> None:
        s.create_run(
            run_id=run_id,
            workflow="wf",
            input='{"args":[],"kwargs":{}}',
            key=None,
            now=now,
            queue=queue,
            queue_key=key,
            priority=priority,
        )

    def _end(self, s: Store, run: Any, now: float = T0) -> None:
        done = RunTransition(kind="finish", status="succeeded", output="1")
        assert s.commit([RunWrite(run_id=run.id, epoch=run.epoch, transition=done)], now)[0].ok

    def _ids(self, runs: Iterator[Any] | list[Any]) -> list[str]:
        return [r.id for r in runs]

    def test_queue_concurrency_is_never_exceeded(self) -> None:
        with self.store() as s:
            s.declare_queue("q", concurrency=2, now=T0)
            for i in range(5):
                self._queued(s, f"r{i}", now=T0 + i)
            first = self._claim(s, now=T0 + 10)
            assert self._ids(first) == ["r0", "r1"]
            assert self._claim(s, now=T0 + 10) == []
            # By id too (a pushed wake-up names it): the queue is full.
            assert self._claim(s, now=T0 + 10, run_id="r2") == []
            self._end(s, first[0], T0 + 11)
            # A slot is free, but r3 is not next: r2 is.
            assert self._claim(s, now=T0 + 12, run_id="r3") == []
            assert self._ids(self._claim(s, now=T0 + 12, run_id="r2")) == ["r2"]
            assert self._claim(s, now=T0 + 12) == []
            [q] = s.queues()
            assert (q.name, q.concurrency, q.running, q.queued) == ("q", 2, 2, 2)
            # What an idle worker asks: runs wait in a queue (of its workflows).
            assert s.queue_backlog(["wf"]) and s.queue_backlog(None)
            assert not s.queue_backlog(["other"]) and not s.queue_backlog([])
            assert not s.queue_backlog(["wf"], versions=["v9"])

    def test_queue_priorities_then_submission_order(self) -> None:
        with self.store() as s:
            for i, p in enumerate([0, 5, 1, 5, -2]):
                self._queued(s, f"r{i}", priority=p, now=T0 + i)
            order = [self._ids(self._claim(s, now=T0 + 10, limit=1)) for _ in range(5)]
            assert order == [["r1"], ["r3"], ["r2"], ["r0"], ["r4"]]

    def test_queue_per_key_limit(self) -> None:
        with self.store() as s:
            s.declare_queue("q", per_key=1, now=T0)
            for i, k in enumerate(["a", "a", "b", None, "a", None]):
                self._queued(s, f"r{i}", key=k, now=T0 + i)
            got = self._claim(s, now=T0 + 10)
            assert self._ids(got) == ["r0", "r2", "r3", "r5"]
            assert self._claim(s, now=T0 + 10) == []
            self._end(s, got[0], T0 + 11)  # a's slot comes free: its next run starts
            assert self._ids(self._claim(s, now=T0 + 12)) == ["r1"]

    def test_queue_rate_of_starts(self) -> None:
        with self.store() as s:
            s.declare_queue("q", rate=2.0, now=T0)  # one start every 0.5 s
            for i in range(6):
                self._queued(s, f"r{i}", now=T0 + i)
            assert self._ids(self._claim(s, lease_s=1e6, now=T0 + 10)) == ["r0"]
            assert self._claim(s, lease_s=1e6, now=T0 + 10.25) == []
            assert self._ids(self._claim(s, lease_s=1e6, now=T0 + 10.5)) == ["r1"]
            # An idle spell banks nothing beyond the burst (1 here).
            assert self._ids(self._claim(s, lease_s=1e6, now=T0 + 100)) == ["r2"]
            s.declare_queue("q", rate=2.0, burst=3, now=T0)
            assert self._ids(self._claim(s, lease_s=1e6, now=T0 + 200)) == ["r3", "r4", "r5"]

    def test_a_waiting_run_holds_no_slot_and_wakes_within_the_limit(self) -> None:
        with self.store() as s:
            s.declare_queue("q", concurrency=1, now=T0)
            for i in range(3):
                self._queued(s, f"r{i}", now=T0 + i)
            [r0] = self._claim(s, now=T0 + 10)
            sleep = RunTransition(kind="suspend", status="sleeping", wake_at=T0 + 12)
            assert s.commit([RunWrite(run_id="r0", epoch=r0.epoch, transition=sleep)], T0)[0].ok
            [r1] = self._claim(s, now=T0 + 11)  # r0 sleeps: its slot is free
            assert r1.id == "r1"
            # r0 is due but the queue is full: it stays asleep, by sweep or by id.
            assert self._claim(s, now=T0 + 13) == []
            assert self._claim(s, now=T0 + 13, run_id="r0") == []
            assert s.get_run("r0").status == "sleeping"  # type: ignore[union-attr]
            self._end(s, r1, T0 + 14)
            # A woken run goes before the queue's fresh runs.
            assert self._ids(self._claim(s, now=T0 + 15)) == ["r0"]

    def test_a_run_sleeping_on_a_retry_back_off_keeps_its_slot(self) -> None:
        """In progress is running or backing off between attempts: the back-off keeps
        its slot (and its key's), and starts again once due without needing room;
        a wait for a signal (a person, a child) gives it up."""
        with self.store() as s:
            s.declare_queue("q", concurrency=2, per_key=1, now=T0)
            self._queued(s, "r0", key="a", now=T0)
            self._queued(s, "r1", key="b", now=T0 + 1)
            self._queued(s, "r2", key="c", now=T0 + 2)
            self._queued(s, "r3", key="a", now=T0 + 3)
            r0, r1 = self._claim(s, now=T0 + 10)
            back_off = RunTransition(
                kind="suspend", status="sleeping", wake_at=T0 + 60, keeps_slot=True
            )
            assert s.commit([RunWrite(run_id="r0", epoch=r0.epoch, transition=back_off)], T0)[0].ok
            assert self._claim(s, now=T0 + 11) == []  # r0 and r1 are in progress
            [q] = s.queues()
            assert (q.running, q.retrying, q.waiting, q.queued) == (1, 1, 1, 2)
            # A wait for a signal gives the slot up: r2 starts, and the queue is full.
            wait = RunTransition(kind="suspend", status="waiting", wait_signal="go")
            assert s.commit([RunWrite(run_id="r1", epoch=r1.epoch, transition=wait)], T0)[0].ok
            assert self._ids(self._claim(s, now=T0 + 12)) == ["r2"]
            # Due, r0 starts again though no slot is free (it kept its own), by sweep
            # or by id; r3 (key a, which r0 holds) still waits.
            assert self._claim(s, now=T0 + 61, run_id="r3") == []
            assert self._ids(self._claim(s, now=T0 + 61, run_id="r0")) == ["r0"]
            assert s.get_run("r3").status == "queued"  # type: ignore[union-attr]

    def test_a_takeover_keeps_its_slot(self) -> None:
        with self.store() as s:
            s.declare_queue("q", concurrency=1, now=T0)
            self._queued(s, "r0")
            self._queued(s, "r1", now=T0 + 1)
            [r0] = self._claim(s, now=T0 + 2)
            taken = self._claim(s, now=T0 + 2 + LEASE + 1, worker="w2")
            assert self._ids(taken) == ["r0"] and taken[0].epoch == r0.epoch + 1

    def test_a_suspect_in_a_queue_starts_only_alone(self) -> None:
        with self.store() as s:
            self._queued(s, "r0")
            self._claim(s, now=T0)
            self._claim(s, now=T0 + LEASE + 1)  # its worker died: recovered once
            [r0] = self._claim(s, now=T0 + 2 * LEASE + 2)  # and twice
            assert r0.recoveries == 2
            assert s.release("r0", r0.epoch, T0 + 2 * LEASE + 3)  # queued again
            self._queued(s, "r1", now=T0 + 100)
            got = self._claim(s, now=T0 + 200, isolate_after=2, alone=False)
            assert self._ids(got) == ["r1"]
            alone = self._claim(s, now=T0 + 201, isolate_after=2, alone=True)
            assert self._ids(alone) == ["r0"]

    def test_runs_in_no_queue_are_unaffected(self) -> None:
        with self.store() as s:
            s.declare_queue("q", concurrency=1, now=T0)
            for i in range(3):
                self._queued(s, f"q{i}", now=T0 + i)
                self._queued(s, f"f{i}", queue=None, now=T0 + i)
            got = self._ids(self._claim(s, now=T0 + 10))
            assert got == ["f0", "f1", "f2", "q0"]
            free = s.get_run("f0")
            assert free is not None and (free.queue, free.queue_key, free.priority) == (
                None,
                None,
                0,
            )
            run = s.get_run("q0")
            assert run is not None and run.queue == "q"
            assert self._ids(s.list_runs(queue="q")) == ["q2", "q1", "q0"]

    def test_concurrent_claims_never_share_the_last_slot(self) -> None:
        with self.store() as s:
            s.declare_queue("q", concurrency=3, per_key=2, now=T0)
            for i in range(20):
                self._queued(s, f"r{i}", key=f"k{i % 2}", now=T0 + i)
        got: list[str] = []
        errors: list[BaseException] = []

        def take(i: int) -> None:
            st = self.reopen()
            try:
                got.extend(self._ids(self._claim(st, now=T0 + 50, worker=f"w{i}", limit=5)))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
            finally:
                st.close()

        threads = [threading.Thread(target=take, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(got) == len(set(got)) == 3
        with self.store() as s:
            running = s.list_runs(statuses=["running"])
            assert len(running) == 3
            assert max(sum(r.queue_key == k for r in running) for k in ("k0", "k1")) == 2

    def test_queue_limits_are_checked(self) -> None:
        with self.store() as s:
            for bad in ({"concurrency": 0}, {"per_key": -1}, {"rate": 0}, {"burst": 0}):
                message = ""
                try:
                    s.declare_queue("q", now=T0, **bad)
                except ConfigError as exc:
                    message = str(exc)
                assert repr(next(iter(bad.values()))) in message, f"{bad!r} was accepted"
            # A run may name a queue nobody declared: it starts with no limits.
            self._queued(s, "r0", queue="undeclared")
            assert self._ids(self._claim(s)) == ["r0"]
