"""A fault walk over child runs: each store call of a parent fanning out to children
(one of which fails, one cancelled with its parent) answered by a fault, then the
scenario driven to its end: no child started twice, no result lost, the invariants
kept. The default suite walks a sample; ``-m slow`` walks every call."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
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
    check_invariants,
)

LEASE_S = 10.0
TICK_S = LEASE_S + 1


@dataclass
class Family:
    store: FaultyStore
    clock: ms.FakeClock
    ledger: EffectLedger
    history: StoreHistory
    app: ms.App


def build(inner: Store, ledger_path: Path, faults: list[Fault]) -> Family:
    clock = ms.FakeClock()
    ledger = EffectLedger(ledger_path)
    history = StoreHistory()
    store = FaultyStore(inner, faults, after_call=history.after_commit(inner))
    app = ms.App(
        store,
        clock=clock,
        rng=random.Random(0),
        lease_s=LEASE_S,
        max_recoveries=5,
        inline_wait_s=0.0,
        poll_interval_s=0.005,
        redact=None,
    )

    def pay(n: int) -> int:
        ledger.apply(ms.current_step().idempotency_key, "pay", n)
        return n

    @app.workflow
    async def kid(ctx: ms.RunContext, n: int) -> int:
        return await ctx.step(pay, n) * 2

    @app.workflow
    async def bad(ctx: ms.RunContext) -> int:
        raise ValueError("bad child")

    @app.workflow
    async def stuck(ctx: ms.RunContext) -> str:
        return await ctx.wait_for("never")

    @app.workflow
    async def parent(ctx: ms.RunContext) -> dict[str, Any]:
        doubled = await asyncio.gather(ctx.child(kid, 1), ctx.child(kid, 2))
        try:
            await ctx.child(bad, key="bad")
            failed = "no"
        except ms.ChildFailed as exc:
            failed = exc.error["message"]
        return {"sum": sum(doubled), "failed": failed}

    @app.workflow
    async def doomed(ctx: ms.RunContext) -> str:
        return await ctx.child(stuck)

    return Family(store, clock, ledger, history, app)


async def _outside(action: Any) -> Any:
    for attempt in range(8):
        try:
            return action()
        except ms.StoreUnavailable:
            if attempt == 7:
                raise
            await asyncio.sleep(0.01)
    raise AssertionError("unreachable")


async def drive(f: Family) -> tuple[str, str]:
    app, inner = f.app, f.store.inner
    parent = (await _outside(lambda: app.submit("parent", key="parent"))).run_id
    doomed = (await _outside(lambda: app.submit("doomed", key="doomed"))).run_id
    cancelled = False
    for _ in range(40):
        await asyncio.wait_for(app.worker(concurrency=8).run(until_idle=True), 60)
        f.history.capture(inner)
        record = inner.get_run(doomed)
        kids = inner.list_runs(parent=doomed, limit=10)
        if not cancelled and record is not None and record.status == "waiting" and kids:
            await _outside(lambda: app.cancel(doomed, "walk"))
            cancelled = True
        live = inner.list_runs(statuses=["queued", "running", "sleeping", "waiting"], limit=1)
        if cancelled and not live:
            return parent, doomed
        f.clock.advance(TICK_S)
    raise AssertionError("the family did not settle")


def outcome(f: Family, parent: str, doomed: str) -> list[str]:
    inner = f.store.inner
    found = [
        str(v)
        for v in check_invariants(
            inner, history=f.history, ledger=f.ledger, now=f.clock.now(), settled=True
        )
    ]
    record = inner.get_run(parent)
    if record is None or record.status != "succeeded":
        found.append(f"parent ended {None if record is None else record.status}")
    elif record.output != '{"sum":6,"failed":"bad child"}':
        found.append(f"parent's result {record.output!r}")
    runs = inner.list_runs(limit=100)
    counts = {w: sum(r.workflow == w for r in runs) for w in ("kid", "bad", "stuck")}
    if counts != {"kid": 2, "bad": 1, "stuck": 1}:
        found.append(f"children started {counts}")
    for rid in [doomed, *(r.id for r in runs if r.workflow == "stuck")]:
        got = inner.get_run(rid)
        if got is None or got.status != "cancelled":
            found.append(f"{rid} not cancelled: {None if got is None else got.status}")
    return found


class Stores:
    def __init__(self, backend: str, tmp: Path) -> None:
        self.backend, self.tmp, self.n = backend, tmp, 0
        self.dsn = pg.create_database()[0] if backend == "postgres" else None

    def fresh(self) -> tuple[Store, Path]:
        self.n += 1
        ledger = self.tmp / f"ledger-{self.n}.db"
        if self.dsn is None:
            return SQLiteStore(self.tmp / f"walk-{self.n}.db"), ledger
        from mainspring.storage.postgres import PostgresStore

        pg.reset(self.dsn)
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


async def run_once(stores: Stores, faults: list[Fault]) -> tuple[Family, list[str]]:
    inner, ledger = stores.fresh()
    f = build(inner, ledger, faults)
    try:
        try:
            parent, doomed = await drive(f)
            return f, outcome(f, parent, doomed)
        except AssertionError as exc:
            return f, [f"[drive] {exc}"]
    finally:
        f.ledger.close()
        inner.close()


def _fault(kind: FaultKind, index: int, clock: list[ms.FakeClock]) -> Fault:
    if kind == "delay":
        return Fault(kind="delay", at=index, delay_s=0.0, during=lambda: clock[0].advance(TICK_S))
    if kind == "locked":
        return Fault(kind="locked", at=index, method="commit")
    return Fault(kind=kind, at=index)


async def walk(stores: Stores, kinds: tuple[FaultKind, ...], sample: int | None) -> None:
    clean, problems = await run_once(stores, [])
    assert problems == [], problems
    calls = clean.store.methods()
    assert "create_run" in calls and "cancel" in calls
    failures: dict[str, list[str]] = {}
    injected = 0
    for kind in kinds:
        indexes = [i for i, m in enumerate(calls) if m != "listen"]
        if kind == "locked":
            indexes = [i for i, m in enumerate(calls) if m == "commit"]
        # every child start and the cancel, then an even spread of the rest
        aimed = [i for i in indexes if calls[i] in ("create_run", "cancel")]
        if sample is not None and len(indexes) > sample:
            step = len(indexes) / sample
            indexes = sorted({*aimed, *(indexes[int(i * step)] for i in range(sample))})
        for index in indexes:
            box: list[ms.FakeClock] = []
            inner, ledger = stores.fresh()
            f = build(inner, ledger, [_fault(kind, index, box)])
            box.append(f.clock)
            try:
                parent, doomed = await drive(f)
                problems = outcome(f, parent, doomed)
            except AssertionError as exc:
                problems = [f"[drive] {exc}"]
            finally:
                f.ledger.close()
                inner.close()
            injected += len(f.store.injected)
            if problems:
                failures[f"{kind}@{index}({calls[index]})"] = problems
    assert injected > 0
    assert failures == {}, failures


KINDS: tuple[FaultKind, ...] = ("busy", "locked", "ambiguous", "delay")
SAMPLE = {"sqlite": 10, "postgres": 3}


@pytest.mark.parametrize("kind", KINDS)
async def test_child_runs_fault_walk_sample(stores: Stores, kind: FaultKind) -> None:
    await walk(stores, (kind,), SAMPLE[stores.backend])


@pytest.mark.slow
@pytest.mark.timeout(3600)  # every call, a fresh scenario each: minutes on a shared machine
@pytest.mark.parametrize("kind", KINDS)
async def test_child_runs_fault_walk_every_call(stores: Stores, kind: FaultKind) -> None:
    await walk(stores, (kind,), None)
