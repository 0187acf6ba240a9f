"""PostgreSQL races: every outside action against every run transition.

A worker executes runs on a real server while, at the moment a run commits one of
its transitions (a step's completion, a suspend on a wait, its finish, a
continue-as-new), a thread acts on that run from outside: sends a signal, cancels
it, answers its request, submits with its key, retries it or forks it. The commit
and the action race for real (the action is started from inside the commit call,
a moment before its transaction). Each round runs several such runs at once;
after it, every run must have ended and the invariants of :mod:`mainspring.testing`
must hold (checked at every commit, too).

The default suite runs a round or two per pair; ``-m slow`` runs many.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pg
import pytest

import mainspring as ms
from mainspring.storage import RunWrite, Store
from mainspring.testing import EffectLedger, Fault, FaultyStore, StoreHistory, check_invariants

ACTIONS = ["signal", "cancel", "answer", "submit", "retry", "fork"]
TRANSITIONS = ["step", "suspend", "finish", "continue_as_new"]
RUNS_PER_ROUND = 6
ROUNDS = 1
SLOW_ROUNDS = 25
# Known bugs fail only some of the time: their cases run up to this many rounds and
# stop at the first failure, so that the strict xfail is reliable.
KNOWN_ROUNDS = 12

# What commit of each transition the action races (RunWrite -> bool).
RACE_POINT: dict[str, Callable[[RunWrite], bool]] = {
    "step": lambda w: any(s.status == "completed" and s.kind == "step" for s in w.steps),
    "suspend": lambda w: w.transition is not None and w.transition.kind == "suspend",
    "finish": lambda w: w.transition is not None and w.transition.kind == "finish",
    "continue_as_new": lambda w: w.transition is not None and w.transition.kind == "next_session",
}

# (action, transition) -> a known bug it trips (a strict xfail until fixed); none now.
KNOWN: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    dsn, name = pg.create_database()
    yield dsn
    pg.drop_database(name)


class Race:
    """One round: a worker, runs of one workflow, an action fired at a commit."""

    def __init__(self, dsn: str, tmp: Path, action: str, transition: str) -> None:
        from mainspring.storage.postgres import PostgresStore

        self.action, self.transition = action, transition
        self.inner: Store = PostgresStore(dsn, max_size=12)
        self.history = StoreHistory()
        self.ledger = EffectLedger(tmp / f"ledger-{uuid.uuid4().hex[:8]}.db")
        self.targets: set[str] = set()
        self.fired: set[str] = set()
        self.threads: list[threading.Thread] = []
        self.problems: list[str] = []
        self.cancel_answers: dict[str, str] = {}
        self.forks: list[str] = []
        self.fail_once: set[str] = set()
        self._lock = threading.Lock()
        self._due: list[str] = []
        fault = Fault(kind="delay", delay_s=0.0, times=10**9, when=self._when, during=self._fire)
        self.store = FaultyStore(
            self.inner, [fault], after_call=self.history.after_commit(self.inner)
        )
        self.app = ms.App(self.store, lease_s=5.0, poll_interval_s=0.02, inline_wait_s=0.0)
        self._workflows()

    # -- the race trigger -------------------------------------------------------------

    def _when(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        batch = kwargs.get("batch", args[0] if args else None)
        if not isinstance(batch, list):
            return False
        hit = False
        with self._lock:
            for w in batch:
                if (
                    isinstance(w, RunWrite)
                    and w.run_id in self.targets
                    and w.run_id not in self.fired
                    and RACE_POINT[self.transition](w)
                ):
                    self.fired.add(w.run_id)
                    self._due.append(w.run_id)
                    hit = True
        return hit

    def _fire(self) -> None:
        with self._lock:
            due, self._due = self._due, []
        for rid in due:
            thread = threading.Thread(target=self._act, args=(rid,), daemon=True)
            self.threads.append(thread)
            thread.start()  # runs while the commit that fired it goes on
        if due:
            # Let the action get going, by a random part of a commit's length, so that
            # its transaction and the commit's overlap in every possible order.
            time.sleep(random.uniform(0, 0.004))

    def _act(self, rid: str) -> None:
        time.sleep(random.uniform(0, 0.002))
        app = self.app
        try:
            if self.action == "signal":
                with contextlib.suppress(ms.RunConflict):
                    app.signal(rid, "go", 1)
            elif self.action == "cancel":
                self.cancel_answers[rid] = app.cancel(rid, "race")
            elif self.action == "answer":
                self._answer(rid)
            elif self.action == "submit":
                record = app.get_run(rid)
                again = app.submit(record.workflow, record.key, key=record.key)
                if again.run_id != rid or again.created:
                    self.problems.append(f"submit with key {record.key!r} gave {again!r}")
                self._concurrent_submits(record.workflow)
            elif self.action == "retry":
                self.history.reopen(rid)  # re-opening it is the point
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    try:
                        app.retry(rid)
                        break
                    except ms.RunConflict:
                        time.sleep(0.001)  # not failed yet
            elif self.action == "fork":
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not self.inner.load_steps(rid, 0):
                    time.sleep(0.001)
                self.forks.append(app.fork(rid, from_step="0:0").run_id)
        except Exception as exc:  # what the action's caller would see
            self.problems.append(f"{self.action} on run {rid}: {type(exc).__name__}: {exc}")

    def _answer(self, rid: str) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            requests = self.app.requests(rid)
            if requests:
                with contextlib.suppress(ms.RunConflict, ms.RequestNotFound):  # raced: fine
                    self.app.answer(rid, requests[0].id, decision="approve", by="race")
                return True
            if self.app.get_run(rid).finished:
                return False
            time.sleep(0.002)
        return False

    def _concurrent_submits(self, workflow: str) -> None:
        key = f"dup-{uuid.uuid4().hex}"
        got: list[str] = []
        errors: list[str] = []

        def submit() -> None:
            try:
                got.append(self.app.submit(workflow, key, key=key).run_id)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=submit) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors or len(set(got)) != 1:
            self.problems.append(f"3 concurrent submits of key {key!r}: {got!r} {errors!r}")
        else:
            self.targets.discard(got[0])  # a plain run: it finishes on its own
            self.extra.append(got[0])

    # -- the workflows ----------------------------------------------------------------

    def _workflows(self) -> None:
        app, ledger = self.app, self.ledger
        self.extra: list[str] = []

        def pay(n: int) -> int:
            ledger.apply(ms.current_step().idempotency_key, "pay", n)
            return n

        def maybe_fail(label: str) -> str:
            if label in self.fail_once:
                self.fail_once.discard(label)
                raise ValueError(f"first attempt of {label!r} fails (the test retries it)")
            return label

        never = ms.RetryPolicy.never()

        @app.workflow(name="step")
        async def t_step(ctx: ms.RunContext, label: str) -> int:
            a = await ctx.step(pay, 1)
            b = await ctx.step(pay, 2)
            await ctx.step(maybe_fail, label, retry=never)
            return a + b

        @app.workflow(name="suspend")
        async def t_suspend(ctx: ms.RunContext, label: str) -> Any:
            await ctx.step(pay, 1)
            if self.action == "answer":
                decision = await ctx.approval("deploy")
                got: Any = decision.approved
            else:
                got = await ctx.wait_for("go")
            await ctx.step(maybe_fail, label, retry=never)
            return got

        @app.workflow(name="finish")
        async def t_finish(ctx: ms.RunContext, label: str) -> int:
            await ctx.step(pay, 1)
            await ctx.step(maybe_fail, label, retry=never)
            return 1

        @app.workflow(name="continue_as_new")
        async def t_can(ctx: ms.RunContext, label: str) -> int:
            n = int(ctx.handoff or 0)
            await ctx.step(pay, n)
            if n < 1:
                ctx.continue_as_new(n + 1)
            await ctx.step(maybe_fail, label, retry=never)
            return n

    # -- one round ----------------------------------------------------------------------

    async def round(self, runs: int) -> list[str]:
        ids = []
        for i in range(runs):
            label = f"{self.action}-{self.transition}-{uuid.uuid4().hex[:8]}-{i}"
            if self.action == "retry":
                self.fail_once.add(label)
            ids.append(self.app.submit(self.transition, label, key=label).run_id)
        self.targets.update(ids)
        worker = self.app.worker(concurrency=64)
        task = asyncio.create_task(worker.run())
        try:
            await self._settle(ids)
        finally:
            worker.request_stop()
            await asyncio.wait_for(task, 30)
        for t in self.threads:
            t.join(10)
        everything = [*ids, *self.forks, *self.extra]
        await self._settle(everything, worker_too=True)
        return self._check(ids, everything)

    async def _settle(self, ids: list[str], *, worker_too: bool = False) -> None:
        """Wait until every run ended, unblocking the waits the race did not answer."""
        if worker_too:
            worker = self.app.worker(concurrency=64)
            task = asyncio.create_task(worker.run())
        try:
            deadline = time.monotonic() + 8  # settled runs take well under a second
            helped: set[str] = set()
            while time.monotonic() < deadline:
                pending = [r for r in ids if not self.inner.get_run(r).finished]  # type: ignore[union-attr]
                if not pending:
                    return
                for rid in pending:
                    record = self.inner.get_run(rid)
                    assert record is not None
                    idle = all(not t.is_alive() for t in self.threads)
                    if record.status == "waiting" and idle and rid not in helped:
                        helped.add(rid)
                        # A wait the race left blocked must be one that legitimately
                        # waits (no signal for it stored, no cancel pending) ...
                        self.problems += [
                            f"before unblocking: {v}"
                            for v in check_invariants(self.inner, run_ids=[rid])
                        ]
                        if self.action == "signal" and rid in self.fired:
                            continue  # ... and the race's own signal must have woken it
                        # The race is over: answer the wait ourselves.
                        if record.wait_reason == "signal:go":
                            with contextlib.suppress(ms.RunConflict):
                                self.app.signal(rid, "go", 2)
                        elif (record.wait_reason or "").startswith("signal:approval:"):
                            await asyncio.to_thread(self._answer, rid)
                await asyncio.sleep(0.05)
        finally:
            if worker_too:
                worker.request_stop()
                await asyncio.wait_for(task, 30)

    def _check(self, ids: list[str], everything: list[str]) -> list[str]:
        problems = list(self.problems)
        problems += [
            str(v)
            for v in check_invariants(
                self.inner, history=self.history, ledger=self.ledger, run_ids=everything
            )
        ]
        for rid in everything:
            record = self.inner.get_run(rid)
            assert record is not None
            if not record.finished:
                problems.append(
                    f"run {rid} ({record.workflow}) never ended: {record.status} "
                    f"({record.wait_reason!r}, cancel_requested={record.cancel_requested})"
                )
            error = json.loads(record.error or "null")
            if record.status == "succeeded" and error is not None:
                problems.append(f"run {rid} succeeded with an error written on it: {error!r}")
            answer = self.cancel_answers.get(rid)
            if answer in ("cancelled", "running") and record.status != "cancelled":
                # "running": asked, and the run's end must honour it (DESIGN.md §11).
                problems.append(f"cancel() answered {answer!r} but run {rid} is {record.status}")
        return problems

    def close(self) -> None:
        self.ledger.close()
        self.inner.close()


PAIRS = [(a, t) for a in ACTIONS for t in TRANSITIONS if a != "answer" or t == "suspend"]


def _param(action: str, transition: str) -> Any:
    item = KNOWN.get((action, transition))
    marks = [pytest.mark.xfail(reason=item, strict=True)] if item else []
    return pytest.param(action, transition, marks=marks, id=f"{action}-vs-{transition}")


async def _race(pg_dsn: str, tmp: Path, action: str, transition: str, rounds: int) -> None:
    known = (action, transition) in KNOWN
    total = 0
    for _ in range(KNOWN_ROUNDS if known else rounds):
        pg.reset_migrated(pg_dsn)  # Race opens a store, which would migrate it
        race = Race(pg_dsn, tmp, action, transition)
        try:
            problems = await race.round(RUNS_PER_ROUND)
            total += len(race.fired)
        finally:
            race.close()
        assert problems == [], "\n".join(problems)
    print(f"\n{action} vs {transition}: {total} races, invariants held")


@pytest.mark.parametrize(("action", "transition"), [_param(*p) for p in PAIRS])
async def test_race(pg_dsn: str, tmp_path: Path, action: str, transition: str) -> None:
    await _race(pg_dsn, tmp_path, action, transition, ROUNDS)


@pytest.mark.slow
@pytest.mark.parametrize(("action", "transition"), [_param(*p) for p in PAIRS])
async def test_race_many_rounds(pg_dsn: str, tmp_path: Path, action: str, transition: str) -> None:
    await _race(pg_dsn, tmp_path, action, transition, SLOW_ROUNDS)
