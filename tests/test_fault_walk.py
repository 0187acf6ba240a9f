"""The fault walk: every store call of a representative workflow set, each fault there.

One clean run of the scenario counts its store calls (N). Then, for each call index
and each fault kind, the scenario runs again on a fresh store with that one fault
injected at that call, is driven to the end (a worker, a fake clock moved past
leases, sleeps and timeouts, outside actions retried as a client would), and the
invariants of :mod:`mainspring.testing` are checked: at every commit (a
``StoreHistory`` hook) and at the end.

The workflow set includes a schedule fired by the workers' ticks, a family of runs
(a parent holding a child's start, a fork of it that ends, a fork of that fork that
waits for the child, children that the parents' ends cancel) and a ``prune`` while the
middle fork is finished and the last still waits: it must keep the middle fork.

The default suite walks a deterministic sample (spread evenly over the calls) on
SQLite and a smaller one on PostgreSQL; ``-m slow`` walks every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pg
import pytest

import mainspring as ms
from mainspring.storage import SQLiteStore, Store
from mainspring.testing import (
    EffectLedger,
    Fault,
    FaultKind,
    FaultyStore,
    StoreHistory,
    Violation,
    check_invariants,
    commits_with,
)

LEASE_S = 10.0
TICK_S = LEASE_S + 1  # each round moves time past a lease: abandoned runs are recovered
MAX_ROUNDS = 60


class Crash(BaseException):
    """Stands for the worker process dying inside a step (nothing after it is written)."""


# What each keyed run must end as, whatever single fault was injected.
EXPECTED = {
    "modes": "succeeded",
    "waiter": "succeeded",
    "sessions": "succeeded",
    "cancel_me": "cancelled",
    "cancel_last": "cancelled",
    "retried": "succeeded",
    "poison": "failed",
    "tree": "succeeded",
    "kid": "succeeded",
}


# (session, output) of runs whose result no single fault may change.
RESULTS: dict[str, tuple[int, Any]] = {
    "waiter": (0, [1, 2]),
    "sessions": (2, 2),
    "retried": (0, "xy"),
    "tree": (0, "got go"),
}


@dataclass
class Scenario:
    """One execution of the workflow set over one store."""

    store: FaultyStore
    clock: ms.FakeClock
    ledger: EffectLedger
    history: StoreHistory
    app: ms.App
    state: dict[str, Any] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    # Runs as they ended, read before the prune deleted them.
    pruned: dict[str, ms.RunRecord] = field(default_factory=dict)


def build(inner: Store, ledger_path: Path, faults: list[Fault]) -> Scenario:
    clock = ms.FakeClock()
    ledger = EffectLedger(ledger_path)
    history = StoreHistory()
    store = FaultyStore(inner, faults, after_call=history.after_commit(inner))
    app = ms.App(
        store,
        clock=clock,
        rng=random.Random(0),
        lease_s=LEASE_S,
        max_recoveries=2,
        inline_wait_s=0.0,
        poll_interval_s=0.005,
        default_retry=ms.RetryPolicy(max_attempts=3, initial_s=5.0, max_s=5.0),
        redact=None,
    )
    scenario = Scenario(store, clock, ledger, history, app, state={"fixed": False})
    # An endpoint, so that every final transition queues an event (never delivered here).
    inner.add_webhook("http://127.0.0.1:9/hook", clock.now())

    def pay(n: int) -> int:
        ledger.apply(ms.current_step().idempotency_key, "pay", n)
        return n

    def launch(n: int) -> int:
        # No deduplication on the other side: it must run at most once.
        ledger.apply_unsafe(ms.current_step().idempotency_key, "launch", n)
        return n

    attempts: Counter[str] = Counter()

    def flaky(tag: str) -> str:
        key = ms.current_step().idempotency_key
        attempts[key] += 1
        if attempts[key] == 1:
            raise ConnectionError("reset by peer")  # retried after a durable back-off
        ledger.apply(key, "pay", tag)
        return tag

    def doomed(tag: str) -> str:
        if not scenario.state["fixed"]:
            raise ValueError(f"bad input {tag!r}")  # fails the run; the test retries it
        ledger.apply(ms.current_step().idempotency_key, "pay", tag)
        return tag

    def crash() -> None:
        raise Crash

    def cancel_self() -> str:
        # Asked while the run's last step runs: answered "running" (or "cancelled"
        # when a fault made the run leave its worker meanwhile), and the run's end
        # must honour it.
        return app.cancel(ms.current_step().run_id, "during the last step")

    @app.workflow
    async def modes(ctx: ms.RunContext, n: int) -> dict[str, Any]:
        a = await ctx.step(pay, n)
        try:
            b = await ctx.step(launch, n, mode="at_most_once")
        except ms.StepInterrupted:
            b = -1
        c, d = await asyncio.gather(
            ctx.step(pay, n + 1, name="pay_a"), ctx.step(pay, n + 2, name="pay_b")
        )
        await ctx.sleep(30)
        go = await ctx.wait_for("go", timeout=100, default="timed out")
        return {"sum": a + b + c + d, "go": go}

    @app.workflow
    async def waiter(ctx: ms.RunContext) -> list[Any]:
        a = await ctx.wait_for("a")
        b = await ctx.wait_for("b", timeout=50, default="late")
        return [a, b]

    @app.workflow
    async def sessions(ctx: ms.RunContext) -> int:
        n = int(ctx.handoff or 0)
        await ctx.step(pay, 100 + n, name="session_pay")
        if n < 2:
            ctx.continue_as_new(n + 1)
        return n

    @app.workflow
    async def cancel_me(ctx: ms.RunContext) -> str:
        await ctx.step(pay, 7, name="before_cancel")
        await ctx.wait_for("never")
        return "not cancelled"

    @app.workflow
    async def cancel_last(ctx: ms.RunContext) -> str:
        await ctx.step(pay, 3, name="before_last")
        return await ctx.step(cancel_self, name="last")

    @app.workflow
    async def retried(ctx: ms.RunContext) -> str:
        x = await ctx.step(flaky, "x")
        y = await ctx.step(doomed, "y", retry=ms.RetryPolicy.never())
        return x + y

    @app.workflow
    async def poison(ctx: ms.RunContext) -> str:
        await ctx.step(pay, 1, name="before_poison")
        await ctx.step(crash)
        return "never"

    @app.workflow
    async def kid(ctx: ms.RunContext) -> str:
        return str(await ctx.wait_for("go"))

    @app.workflow
    async def idle(ctx: ms.RunContext) -> str:
        return str(await ctx.wait_for("never"))  # cancelled by its parent's end

    @app.workflow
    async def tree(ctx: ms.RunContext) -> str:
        child = await ctx.start_child(kid, key="kid", on_parent_close="abandon")  # step 0
        if await ctx.wait_for("decide") == "skip":
            return "skipped"
        await ctx.start_child(idle)
        return f"got {await child}"

    @app.workflow
    async def tick(ctx: ms.RunContext) -> int:
        return await ctx.step(pay, 1, name="scheduled_pay")

    app.schedules.add("two-minutes", "*/2 * * * *", tick)
    return scenario


async def _outside(action: Callable[[], Any]) -> Any:
    """An outside action as a client makes it: an unavailable store is tried again
    (after an ambiguous answer the action may so happen twice, as it would)."""
    for attempt in range(8):
        try:
            return action()
        except ms.StoreUnavailable:
            if attempt == 7:
                raise
            await asyncio.sleep(0.01)
    raise AssertionError("unreachable")


async def drive(s: Scenario) -> None:
    app, inner = s.app, s.store.inner
    submits: list[tuple[str, tuple[Any, ...]]] = [
        ("modes", (10,)),
        ("waiter", ()),
        ("sessions", ()),
        ("cancel_me", ()),
        ("cancel_last", ()),
        ("retried", ()),
        ("poison", ()),
        ("tree", ()),
    ]
    for name, args in submits:
        handle = await _outside(lambda n=name, a=args: app.submit(n, *a, key=n))
        s.ids[name] = handle.run_id
    done: set[str] = set()
    for _ in range(MAX_ROUNDS):
        worker = app.worker(concurrency=8)
        await asyncio.wait_for(worker.run(until_idle=True), 60)
        s.history.capture(inner)
        runs = {name: inner.get_run(rid) for name, rid in s.ids.items()}
        waiter = runs["waiter"]
        if "a" not in done and waiter is not None and waiter.status == "waiting":
            await _outside(lambda: app.signal(s.ids["waiter"], "a", 1))
            # "b" arrives before its wait begins: stored, then consumed by it.
            await _outside(lambda: app.signal(s.ids["waiter"], "b", 2))
            done.add("a")
        cancel_me = runs["cancel_me"]
        if "cancel" not in done and cancel_me is not None and cancel_me.status == "waiting":
            await _outside(lambda: app.cancel(s.ids["cancel_me"], "walk"))
            done.add("cancel")
        retried = runs["retried"]
        if "retry" not in done and retried is not None and retried.status == "failed":
            s.state["fixed"] = True
            s.history.reopen(s.ids["retried"])
            # An ambiguous retry that did happen: the second one finds it queued.
            with contextlib.suppress(ms.RunConflict):
                await _outside(lambda: app.retry(s.ids["retried"]))
            done.add("retry")
        modes = runs["modes"]
        if "fork" not in done and modes is not None and modes.status == "succeeded":
            fork = await _outside(lambda: app.fork(s.ids["modes"], from_step=1))
            s.ids["fork"] = fork.run_id
            done.add("fork")
        await _grow_tree(s, done)
        if {"a", "cancel", "retry", "fork", "pruned"} <= done and not inner.list_runs(
            statuses=["queued", "running", "sleeping", "waiting"], limit=1
        ):
            return
        s.clock.advance(TICK_S)
    raise AssertionError(f"the scenario did not settle in {MAX_ROUNDS} rounds: {s.ids!r}")


def _forks(s: Scenario, of: list[str]) -> list[str]:
    """The forks of these runs (an ambiguous fork may have made two)."""
    inner = s.store.inner
    return [r.id for p in of for r in inner.list_runs(parent=p) if r.parent_kind == "fork"]


async def _grow_tree(s: Scenario, done: set[str]) -> None:
    """The family of runs, a step per round: fork the parent past the child's start
    (f1, which ends without waiting for the child), fork f1 (f2, which waits for
    it), prune while f1 has ended and f2 waits (f1 must stay: the child's end
    reaches f2 through it), then end the child and the parent."""
    app, inner = s.app, s.store.inner
    tree = inner.get_run(s.ids["tree"])
    if tree is None or tree.status != "waiting":
        return
    if "f1" not in done:
        await _outside(lambda: app.fork(s.ids["tree"], from_step=0))
        done.add("f1")
        return
    f1s = _forks(s, [s.ids["tree"]])
    runs = {rid: inner.get_run(rid) for rid in f1s}
    for rid, run in runs.items():
        if run is not None and run.status == "waiting" and f"f1:{rid}" not in done:
            await _outside(lambda r=rid: app.signal(r, "decide", "skip"))
            done.add(f"f1:{rid}")
    ended = [rid for rid, run in runs.items() if run is not None and run.status == "succeeded"]
    if not ended or len(ended) < len(f1s):
        return
    if "f2" not in done:
        await _outside(lambda: app.fork(ended[0], from_step=0))
        done.add("f2")
        return
    f2s = _forks(s, f1s)
    kid_id = inner.load_steps(s.ids["tree"])[0].output or ""
    for rid in f2s:
        run = inner.get_run(rid)
        if run is not None and run.wait_reason == "signal:decide" and f"f2:{rid}" not in done:
            await _outside(lambda r=rid: app.signal(r, "decide", "wait"))
            done.add(f"f2:{rid}")
    waiting = [inner.get_run(rid) for rid in f2s]
    if not all(r is not None and (r.wait_reason or "").startswith("child:") for r in waiting):
        return
    if "pruned" not in done:
        s.ids["kid"] = json.loads(kid_id)["run_id"]
        s.ids |= {f"f1-{i}": rid for i, rid in enumerate(f1s)}
        s.ids |= {f"f2-{i}": rid for i, rid in enumerate(f2s)}
        ended_now = {n: r for n, rid in s.ids.items() if (r := inner.get_run(rid)) and r.finished}
        await _outside(lambda: s.store.prune(0, s.clock.now() + 1))
        s.pruned |= {n: r for n, r in ended_now.items() if inner.get_run(r.id) is None}
        done.add("pruned")
        await _outside(lambda: app.signal(s.ids["kid"], "go", "go"))
        await _outside(lambda: app.signal(s.ids["tree"], "decide", "wait"))


def outcome(s: Scenario) -> list[str]:
    """What went wrong: invariant violations and runs that ended unexpectedly."""
    found = [
        str(v)
        for v in check_invariants(
            s.store.inner,
            history=s.history,
            ledger=s.ledger,
            at_most_once_effects={"launch"},
            now=s.clock.now(),
            settled=True,
        )
    ]
    family = {n: "succeeded" for n in s.ids if n.startswith(("f1-", "f2-"))}
    for name, want in {**EXPECTED, "fork": "succeeded", **family}.items():
        record = s.store.inner.get_run(s.ids[name]) or s.pruned.get(name)
        status = None if record is None else record.status
        if status != want:
            # The run's error says why (a dead-letter, an exception): a rare failure of
            # the slow walk must be diagnosable from its report alone.
            why = "" if record is None or record.error is None else f" ({record.error[:300]})"
            found.append(f"[outcome] {name} ended {status!r}, expected {want!r}{why}")
    for name, f1 in ((n, rid) for n, rid in s.ids.items() if n.startswith("f1-")):
        if s.store.inner.get_run(f1) is None:  # ended, but the fork below it waited
            found.append(f"[prune] deleted {name} {f1}, which a waiting fork needed")
    for name, (session, output) in RESULTS.items():
        record = s.store.inner.get_run(s.ids[name]) or s.pruned.get(name)
        got = None if record is None else (record.session, json.loads(record.output or "null"))
        if got != (session, output):
            found.append(
                f"[outcome] {name} ended (session, output) {got!r}, not {(session, output)!r}"
            )
    return found


class Stores:
    """Fresh stores on one backend, one per execution of the scenario."""

    def __init__(self, backend: str, tmp: Path) -> None:
        self.backend, self.tmp, self.n = backend, tmp, 0
        self.dsn = pg.create_database()[0] if backend == "postgres" else None

    def fresh(self) -> tuple[Store, Path]:
        self.n += 1
        ledger = self.tmp / f"ledger-{self.n}.db"
        if self.dsn is None:
            return SQLiteStore(self.tmp / f"walk-{self.n}.db"), ledger
        from mainspring.storage.postgres import PostgresStore

        pg.reset_migrated(self.dsn)  # as the store would leave it: cheaper
        return PostgresStore(self.dsn, max_size=4), ledger

    def close(self) -> None:
        if self.dsn is not None:
            pg.drop_database(self.dsn.rsplit("/", 1)[1])


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    if request.param == "postgres" and not os.environ.get(pg.DSN_VAR):
        pytest.skip(f"{pg.DSN_VAR} is not set")
    found = Stores(request.param, tmp_path)
    yield found
    found.close()


async def run_once(stores: Stores, faults: list[Fault]) -> tuple[Scenario, list[str]]:
    inner, ledger = stores.fresh()
    s = build(inner, ledger, faults)
    try:
        await drive(s)
        return s, outcome(s)
    finally:
        s.ledger.close()
        inner.close()


def fault_for(kind: FaultKind, index: int, s_clock: list[ms.FakeClock]) -> Fault:
    if kind == "delay":
        # A stall that outlives the lease: time moves on while the call hangs, and
        # the write lands after the run may have been taken over.
        return Fault(kind="delay", at=index, delay_s=0.0, during=lambda: s_clock[0].advance(TICK_S))
    if kind == "locked":  # only a commit answers "locked": aim at the next one
        return Fault(kind="locked", at=index, method="commit")
    return Fault(kind=kind, at=index)


# Violations of known, not yet fixed bugs (signature -> issue item), each also pinned by
# a strict xfail test: the walk reports them apart and fails on anything else. Issue 12's
# items 2 and 7, which the walk found, are fixed; keep this empty unless a bug is
# pinned while its fix is under way.
KNOWN: dict[str, str] = {}


def known_item(problem: str, s: Scenario) -> str | None:
    return next((why for sig, why in KNOWN.items() if problem.startswith(sig)), None)


@dataclass
class WalkReport:
    backend: str
    calls: int
    cases: int = 0
    faults: int = 0
    checks: int = 0
    failures: dict[str, list[str]] = field(default_factory=dict)
    known: Counter[str] = field(default_factory=Counter)


async def walk(stores: Stores, kinds: tuple[FaultKind, ...], sample: int | None) -> WalkReport:
    """Count the calls of a clean run, then inject each kind at each sampled index."""
    clean, problems = await run_once(stores, [])
    assert problems == [], problems
    calls = clean.store.methods()
    report = WalkReport(stores.backend, len(calls), checks=clean.history.captures)
    for kind in kinds:
        indexes = [i for i, m in enumerate(calls) if m != "listen"]  # never faulted
        if kind == "locked":  # only a commit can answer "locked" rather than raise
            indexes = [i for i, m in enumerate(calls) if m == "commit"]
        if sample is not None and len(indexes) > sample:
            step = len(indexes) / sample
            indexes = [indexes[int(i * step)] for i in range(sample)]
        for index in indexes:
            clock_box: list[ms.FakeClock] = []
            fault = fault_for(kind, index, clock_box)
            inner, ledger = stores.fresh()
            s = build(inner, ledger, [fault])
            clock_box.append(s.clock)
            try:
                await drive(s)
                problems = outcome(s)
            except AssertionError as exc:
                problems = [f"[drive] {exc}"]
            finally:
                s.ledger.close()
                inner.close()
            report.cases += 1
            report.faults += len(s.store.injected)
            report.checks += s.history.captures
            for why in {known_item(p, s) for p in problems} - {None}:
                report.known[str(why)] += 1
            unknown = [p for p in problems if known_item(p, s) is None]
            if unknown:
                hit = s.store.injected[0].method if s.store.injected else "?"
                report.failures[f"{kind}@{index}({hit})"] = unknown
    print(
        f"\nfault walk on {report.backend}: {report.calls} store calls in a clean run; "
        f"{report.cases} cases, {report.faults} faults injected ({', '.join(kinds)}); "
        f"{report.checks} invariant captures; {len(report.failures)} cases failed; "
        f"known bugs seen: {dict(report.known)}"
    )
    for case, problems in sorted(report.failures.items()):
        print(f"  {case}: {problems[:3]}")
    return report


async def test_clean_run_keeps_every_invariant(stores: Stores) -> None:
    s, problems = await run_once(stores, [])
    assert problems == []
    methods = Counter(s.store.methods())
    # The walk below is only as good as the calls it reaches.
    assert methods["commit"] >= 20 and methods["claim"] >= 5, methods
    for name in ("send_signal", "cancel", "retry_run", "fork_run", "create_run", "prune"):
        assert methods[name] >= 1, (name, methods)
    assert methods["fire_schedule"] >= 2, methods  # the schedule fired twice at least


# Spread evenly over the calls; the full walk is under -m slow.
SAMPLE = {"sqlite": 28, "postgres": 8}
KINDS: tuple[FaultKind, ...] = ("busy", "locked", "ambiguous", "delay")


@pytest.mark.parametrize("kind", KINDS)
async def test_fault_walk_sample(stores: Stores, kind: FaultKind) -> None:
    report = await walk(stores, (kind,), SAMPLE[stores.backend])
    assert report.faults > 0
    assert report.failures == {}


@pytest.mark.slow
# About 380 cases a kind, each a fresh scenario: about 1 s each on PostgreSQL on an idle
# machine, 3-7 s on two shared cores (7 to 40 minutes), past the suite's 300 s per test.
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("kind", KINDS)
async def test_fault_walk_every_call(stores: Stores, kind: FaultKind) -> None:
    report = await walk(stores, (kind,), None)
    # A run's call sequence varies a little (claims, timing): a fault aimed past the
    # end of a shorter run never fires. Nearly all must.
    assert report.faults >= 0.9 * report.cases > 0
    assert report.failures == {}


# -- the bugs the walk found (issue 12 items 2, 4, 7), one case each ------------------


async def test_ambiguous_continue_as_new_commit(stores: Stores) -> None:
    fault = Fault(kind="ambiguous", when=commits_with("next_session"))
    s, problems = await run_once(stores, [fault])
    assert s.store.injected, "the fault never fired"
    assert problems == []


async def test_ambiguous_finish_commit(stores: Stores) -> None:
    fault = Fault(kind="ambiguous", when=commits_with("finish"))
    s, problems = await run_once(stores, [fault])
    assert s.store.injected, "the fault never fired"
    assert problems == []


async def test_stall_past_the_lease_while_dead_lettered(stores: Stores) -> None:
    inner, ledger_path = stores.fresh()
    clock = ms.FakeClock()
    history = StoreHistory()
    ledger = EffectLedger(ledger_path)

    def dead_letter() -> None:
        # The holder stalls past its lease; meanwhile another worker's claim finds the
        # run out of recoveries and dead-letters it.
        clock.advance(LEASE_S + 1)
        inner.claim(
            worker="other", now=clock.now(), lease_s=LEASE_S, limit=10, workflows=None,
            max_recoveries=0,
        )  # fmt: skip

    stall = Fault(kind="delay", delay_s=0.0, when=commits_with(step_status="started"),
                  during=dead_letter)  # fmt: skip
    store = FaultyStore(inner, [stall], after_call=history.after_commit(inner))
    app = ms.App(store, clock=clock, lease_s=LEASE_S, inline_wait_s=0.0, poll_interval_s=0.005)

    def charge() -> str:
        ledger.apply(ms.current_step().idempotency_key, "charge")
        return "charged"

    @app.workflow
    async def pay(ctx: ms.RunContext) -> str:
        return await ctx.step(charge)

    try:
        handle = app.submit(pay)
        await asyncio.wait_for(app.worker().run(until_idle=True), 30)
        assert store.injected, "the stall never happened"
        found = check_invariants(inner, history=history, ledger=ledger, now=clock.now())
        assert app.get_run(handle.run_id).status == "failed"  # dead-lettered, and stays so
        assert ledger.calls_by_key() == {}  # no step of a dead run ran
        assert found == []
    finally:
        ledger.close()
        inner.close()


async def test_a_store_outage_is_not_catchable_by_workflow_code(stores: Stores) -> None:
    inner, _ = stores.fresh()
    clock = ms.FakeClock()
    # Busy for longer than a commit's retries: the store is down for a while.
    outage = Fault(kind="busy", when=commits_with(step_status="started"), times=6)
    app = ms.App(
        FaultyStore(inner, [outage]),
        clock=clock,
        lease_s=LEASE_S,
        inline_wait_s=0.0,
        poll_interval_s=0.005,
    )
    ran: list[str] = []

    def charge() -> str:
        ran.append(ms.current_step().idempotency_key)
        return "charged"

    @app.workflow
    async def guarded(ctx: ms.RunContext) -> str:
        try:
            return await ctx.step(charge)
        except Exception as exc:  # what user code does; an engine failure must not land here
            return f"took the failure branch: {type(exc).__name__}"

    try:
        run_id = app.submit(guarded).run_id
        for _ in range(5):
            await asyncio.wait_for(app.worker().run(until_idle=True), 60)
            if inner.get_run(run_id).finished:  # type: ignore[union-attr]
                break
            clock.advance(TICK_S)  # abandoned to recovery: another claim takes it over
        assert await app.result(run_id, timeout=5) == "charged"
        assert len(ran) == 1
    finally:
        inner.close()


# -- a schedule's tick answered by a fault while a family of runs ends ---------------------
#
# The slow walk on PostgreSQL once reported its `tree` failed in the case
# `ambiguous@231(due_schedules)` (without the run's error). Neither that case, nor the
# whole ambiguous walk again (351 cases), nor about 3,000 more runs of the scenario on a
# loaded machine (the fault at a tick, store calls jittered, a schedule every minute,
# outages of 30 to 100 calls) reproduced it. A failed tick can only do this: a read of
# the due schedules that fails fires nothing, and the next tick fires; a fire whose
# answer was lost has started its run, which the workers claim like any other. Pinned
# here with the tick failing in the round where a parent, its child and the parent's
# second child end, and the scheduled run starting a child of its own.


@pytest.mark.parametrize("kind", ["ambiguous", "busy"])
@pytest.mark.parametrize("method", ["due_schedules", "fire_schedule"])
async def test_a_failed_schedule_tick_fires_once_and_leaves_a_family_alone(
    stores: Stores, method: str, kind: FaultKind
) -> None:
    due = ms.FakeClock().now() + 120  # the walk's "*/2 * * * *" from its clock's 00:00

    def at_due(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return method != "due_schedules" or args[0] >= due  # a read that finds it due

    inner, ledger = stores.fresh()
    # The walk's workflows and schedule (its tree, kid and idle among them), the tick at
    # the due time failing.
    s = build(inner, ledger, [Fault(kind=kind, method=method, when=at_due)])
    app = s.app

    @app.workflow
    async def leaf(ctx: ms.RunContext) -> int:
        return 1

    @app.workflow
    async def nightly(ctx: ms.RunContext) -> int:
        return await ctx.child(leaf) + 1

    app.schedules.add("nightly", "*/2 * * * *", nightly)

    async def round_() -> None:
        await asyncio.wait_for(app.worker(concurrency=8).run(until_idle=True), 60)

    try:
        tree = app.submit("tree").run_id
        await round_()  # the tree starts its child; both wait
        kid = json.loads(inner.load_steps(tree)[0].output or "null")["run_id"]
        s.clock.advance(due - s.clock.now())
        app.signal(kid, "go", "go")
        app.signal(tree, "decide", "wait")
        for _ in range(4):  # the failed tick's round, then the next ticks
            await round_()
            s.clock.advance(TICK_S)
        assert s.store.injected, "the fault never fired"
        runs = {r.workflow: r for r in inner.list_runs(limit=100)}
        assert Counter(r.workflow for r in inner.list_runs(limit=100)) == {
            w: 1 for w in ("tree", "kid", "idle", "tick", "nightly", "leaf")
        }  # each scheduled workflow started once for 00:02
        ended = {w: (r.status, json.loads(r.output or "null")) for w, r in runs.items()}
        assert ended == {
            "tree": ("succeeded", "got go"),
            "kid": ("succeeded", "go"),
            "idle": ("cancelled", None),  # by its parent's end
            "tick": ("succeeded", 1),
            "nightly": ("succeeded", 2),
            "leaf": ("succeeded", 1),
        }
        assert runs["leaf"].parent == runs["nightly"].id
        found = check_invariants(
            inner, history=s.history, ledger=s.ledger, now=s.clock.now(), settled=True
        )
        assert found == []
    finally:
        s.ledger.close()
        inner.close()
