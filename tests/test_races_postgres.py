"""PostgreSQL races: every outside action against every run transition.

A worker executes runs on a real server while, at the moment a run commits one of
its transitions (a step's completion, a suspend on a wait, its finish, a
continue-as-new), a thread acts on that run from outside: sends a signal, cancels
it, answers its request, submits with its key, retries it, forks it or prunes every
finished run (which must take only finished runs and keep the rest). The commit
and the action race for real (the action is started from inside the commit call,
a moment before its transaction). Each round runs several such runs at once;
after it, every run must have ended and the invariants of :mod:`mainspring.testing`
must hold (checked at every commit, too).

Schedules race too: workers whose clocks are 150 s apart tick around a due time at
once, and it must start one run, never early (``test_skewed_ticks``).

The default suite runs a round or two per pair; ``-m slow`` runs many.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
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
from mainspring._cron import next_due
from mainspring.storage import RunWrite, Store
from mainspring.testing import EffectLedger, Fault, FaultyStore, StoreHistory, check_invariants

ACTIONS = ["signal", "cancel", "answer", "submit", "retry", "fork", "prune"]
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
            elif self.action == "prune":
                app.store.prune(0, time.time() + 1)  # every finished run that nothing needs
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
                # A run that is gone was pruned, which only a finished run can be.
                pending = [r for r in ids if not getattr(self.inner.get_run(r), "finished", True)]
                if not pending:
                    return
                for rid in pending:
                    record = self.inner.get_run(rid)
                    if record is None:
                        continue
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
            if record is None:
                if self.action != "prune" or not self.history.seen_finished(rid):
                    problems.append(f"run {rid} is gone, and it was never seen finished")
                continue
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


# -- schedules: workers whose clocks disagree tick around one due time at once ----------

SKEW_S = 150.0
TICK_ROUNDS = 3
SLOW_TICK_ROUNDS = 30


class _SkewedClock(ms.SystemClock):
    """The real clock of a machine whose time is ``offset`` seconds off."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset


def _ticking(dsn: str, offset: float) -> ms.App:
    app = ms.App(dsn, clock=_SkewedClock(offset))

    @app.workflow
    async def report(ctx: ms.RunContext) -> str:
        return "report"

    app.schedules.add("minutely", "* * * * *", report)
    return app


def _tick_rounds(dsn: str, rounds: int) -> None:
    """Each round makes the schedule due a moment from now; three workers (150 s
    ahead, on time, 150 s behind) tick from threads, at random moments, until a
    moment after it: one run for the due time, none before it."""
    pg.reset_migrated(dsn)
    apps = [_ticking(dsn, offset) for offset in (SKEW_S, 0.0, -SKEW_S)]
    try:
        for app in apps:
            app.schedules.sync()
        for _ in range(rounds):
            _tick_round(apps)
    finally:
        for app in apps:
            app.close()


def _tick_round(apps: list[ms.App]) -> None:
    store = apps[0].store
    now = store.database_now()
    boundary = next_due("* * * * *", "UTC", now)
    # A whole second, as cron times are: the run's key names its due time to the second.
    due = min(float(math.ceil(now + 0.2)), boundary)
    assert store.set_schedule_paused("minutely", False, now=now, next_at=due)
    started: list[str] = []
    errors: list[BaseException] = []

    def tick(app: ms.App) -> None:
        try:
            while time.time() < due + 0.3:
                started.extend(app.schedules.tick())
                time.sleep(random.uniform(0, 0.01))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=tick, args=(app,)) for app in apps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [], errors
    assert len(started) == 1, (started, due, store.get_schedule("minutely"))
    run = store.get_run(started[0])
    assert run is not None and run.created_at >= due
    found = check_invariants(store)
    assert found == [], found
    stored = store.get_schedule("minutely")
    assert stored is not None and stored.next_at == next_due("* * * * *", "UTC", due)
    if due == boundary:  # the next round's due time must be within a minute again
        time.sleep(max(0.0, boundary - time.time()) + 0.01)


def test_skewed_ticks(pg_dsn: str) -> None:
    _tick_rounds(pg_dsn, TICK_ROUNDS)


@pytest.mark.slow
def test_skewed_ticks_many_rounds(pg_dsn: str) -> None:
    _tick_rounds(pg_dsn, SLOW_TICK_ROUNDS)
