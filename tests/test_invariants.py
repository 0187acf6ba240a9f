"""The testing tools themselves: FaultyStore injects what it says, and each invariant
catches the breach it names (planted by hand in a real store)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mainspring as ms
from mainspring.storage import RunTransition, RunWrite, StepRecord, Store, open_store
from mainspring.testing import (
    EffectLedger,
    Fault,
    FaultyStore,
    StoreHistory,
    assert_invariants,
    check_invariants,
    commits_with,
)

NOW = 1_767_225_600.0


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = open_store(db_url)
    yield s
    s.close()


def _run(store: Store, run_id: str = "r1") -> str:
    store.create_run(run_id=run_id, workflow="wf", input="[[],{}]", key=None, now=NOW)
    [claimed] = store.claim(
        worker="w", now=NOW, lease_s=10, limit=1, workflows=None, max_recoveries=5
    )
    assert claimed.id == run_id
    return run_id


def _row(run_id: str, seq: int, status: str = "completed", **kw: Any) -> StepRecord:
    fields: dict[str, Any] = {"kind": "step", "name": f"s{seq}", "output": "1"}
    fields.update(kw)
    return StepRecord(
        run_id=run_id,
        session=0,
        seq=seq,
        status=status,  # type: ignore[arg-type]
        attempt=1,
        epoch=1,
        started_at=NOW,
        **fields,
    )


def _sql(store: Store, sql: str, params: tuple[Any, ...] = ()) -> None:
    with store._write() as cur:
        cur.execute(sql, params)


def _kinds(store: Store, **kw: Any) -> list[str]:
    return [v.kind for v in check_invariants(store, now=NOW, **kw)]


async def test_a_clean_engine_run_has_no_violation(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'a.db'}", poll_interval_s=0.01)

    async def one() -> int:
        return 1

    @app.workflow
    async def wf(ctx: ms.RunContext) -> int:
        a = await ctx.step(one)
        return a + int(await ctx.wait_for("go"))

    run_id = app.submit(wf).run_id
    app.signal(run_id, "go", 2)
    await app.worker().run(until_idle=True)
    assert app.get_run(run_id).status == "succeeded"
    assert_invariants(app.store, history=StoreHistory(), settled=True)
    app.close()


def test_parked_runs_must_have_a_reason_that_fires(store: Store) -> None:
    rid = _run(store)
    _sql(store, "UPDATE ms_runs SET status = 'sleeping', wake_at = NULL WHERE id = ?", (rid,))
    assert _kinds(store) == ["stuck"]
    _sql(
        store,
        "UPDATE ms_runs SET status = 'waiting', wait_signal = 'go', wake_at = NULL WHERE id = ?",
        (rid,),
    )
    assert _kinds(store) == []  # waiting for a signal that has not come: legitimate
    _sql(
        store,
        "INSERT INTO ms_signals (run_id, name, payload, created_at) VALUES (?, 'go', '1', ?)",
        (rid, NOW),
    )
    assert _kinds(store) == ["unwoken_signal"]
    _sql(store, "UPDATE ms_runs SET wake_at = 0 WHERE id = ?", (rid,))
    assert _kinds(store) == []
    assert _kinds(store, settled=True) == ["not_finished"]  # due, and nobody ran it
    _sql(
        store,
        "UPDATE ms_runs SET wait_signal = 'other', wake_at = ?, cancel_requested = 1 WHERE id = ?",
        (NOW + 60, rid),
    )
    assert _kinds(store) == ["uncancelled"]


def test_a_wait_for_a_child_whose_end_never_came_is_caught(store: Store) -> None:
    rid = _run(store)
    store.create_run(
        run_id="kid", workflow="wf", input="[[],{}]", key=None, now=NOW, parent=rid,
        parent_step="0:0",
    )  # fmt: skip
    _sql(
        store,
        "UPDATE ms_runs SET status = 'waiting', wait_signal = 'child:kid', wake_at = NULL"
        " WHERE id = ?",
        (rid,),
    )
    assert _kinds(store) == []  # the child runs: a wait with a reason that will fire
    _sql(store, "UPDATE ms_runs SET status = 'succeeded', finished_at = ? WHERE id = 'kid'", (NOW,))
    assert _kinds(store) == ["child_end_undelivered"]  # ended, and nobody told this run
    _sql(
        store,
        "INSERT INTO ms_signals (run_id, name, payload, created_at)"
        " VALUES (?, 'child:kid', '{}', ?)",
        (rid, NOW),
    )
    _sql(store, "UPDATE ms_runs SET wake_at = 0 WHERE id = ?", (rid,))
    assert _kinds(store) == []  # told, and woken
    _sql(store, "DELETE FROM ms_signals WHERE run_id = ?", (rid,))
    _sql(store, "DELETE FROM ms_runs WHERE id = 'kid'")
    [gone] = check_invariants(store, now=NOW)
    assert gone.kind == "child_end_undelivered" and "no longer exists" in gone.detail


def test_completed_rows_and_finished_runs_never_change(store: Store) -> None:
    rid = _run(store)
    history = StoreHistory()
    store.commit([RunWrite(run_id=rid, epoch=1, steps=[_row(rid, 0), _row(rid, 1)])], NOW)
    assert history.capture(store) == []
    _sql(store, "UPDATE ms_steps SET status = 'started', output = NULL WHERE seq = 0")
    _sql(store, "DELETE FROM ms_steps WHERE seq = 1")
    assert [v.kind for v in history.capture(store)] == [
        "completed_row_changed",
        "completed_row_deleted",
    ]
    rid2 = _run(store, "r2")
    done = RunTransition(kind="finish", status="succeeded", output='"ok"')
    store.commit([RunWrite(run_id=rid2, epoch=1, steps=[_row(rid2, 0)], transition=done)], NOW)
    assert history.capture(store, [rid2]) == []
    _sql(store, "UPDATE ms_runs SET output = '\"other\"' WHERE id = ?", (rid2,))
    [v] = history.capture(store, [rid2])
    assert v.kind == "finished_run_modified" and "output" in v.detail
    history.reopen(rid2)  # a retry re-opens a finished run on purpose...
    _sql(store, "UPDATE ms_runs SET status = 'queued' WHERE id = ?", (rid2,))
    [v] = history.capture(store, [rid2])  # ...and moves its epoch on: this did not
    assert v.kind == "finished_run_modified" and "status" in v.detail
    _sql(store, "UPDATE ms_runs SET epoch = epoch + 1 WHERE id = ?", (rid2,))
    assert history.capture(store, [rid2]) == []


def test_effects_once_and_at_most_once(store: Store, tmp_path: Path) -> None:
    ledger = EffectLedger(tmp_path / "ledger.db")
    ledger.apply("r1:0:0", "pay")
    ledger.apply("r1:0:0", "pay")  # a deduplicated re-execution: fine
    assert _kinds(store, ledger=ledger, at_most_once_effects={"launch"}) == []
    ledger.apply("r1:0:1", "launch")
    ledger.apply("r1:0:1", "launch")  # deduplicated, but an at_most_once step ran twice
    ledger.apply_unsafe("r1:0:2", "write")
    ledger.apply_unsafe("r1:0:2", "write")
    assert sorted(_kinds(store, ledger=ledger, at_most_once_effects={"launch"})) == [
        "at_most_once_twice",
        "duplicate_effect",
    ]
    ledger.close()


def test_each_signal_is_consumed_by_one_wait(store: Store) -> None:
    rid = _run(store)
    wait = _row(rid, 0, kind="signal", name="go", output='{"signal":1}')
    store.commit([RunWrite(run_id=rid, epoch=1, steps=[wait])], NOW)
    assert _kinds(store) == ["wait_without_signal"]  # its payload came from nowhere
    for _ in range(2):
        _sql(
            store,
            "INSERT INTO ms_signals (run_id, name, payload, created_at, consumed_at,"
            " consumed_by) VALUES (?, 'go', '1', ?, ?, '0:0')",
            (rid, NOW, NOW),
        )
    assert _kinds(store) == ["signal_consumed_twice"]
    _sql(
        store,
        "INSERT INTO ms_signals (run_id, name, payload, created_at, consumed_at,"
        " consumed_by) VALUES (?, 'go', '1', ?, ?, '0:7')",
        (rid, NOW, NOW),
    )
    assert sorted(_kinds(store)) == ["signal_consumed_twice", "signal_lost"]


def test_nothing_in_flight_after_success_and_one_final_event(store: Store) -> None:
    store.add_webhook("http://127.0.0.1:9/hook", NOW)
    rid = _run(store)
    done = RunTransition(kind="finish", status="succeeded", output='"ok"')
    store.commit([RunWrite(run_id=rid, epoch=1, steps=[_row(rid, 0)], transition=done)], NOW)
    assert _kinds(store) == []
    _sql(store, "UPDATE ms_steps SET status = 'started' WHERE run_id = ?", (rid,))
    assert _kinds(store) == ["unended_row"]
    _sql(store, "UPDATE ms_steps SET status = 'completed' WHERE run_id = ?", (rid,))
    # A re-sent finish is applied once (issue 12 item 7): no second event...
    store.commit([RunWrite(run_id=rid, epoch=1, transition=done)], NOW)
    assert _kinds(store) == []
    # ...and a second final event planted by hand is what the invariant reports.
    _sql(
        store,
        "INSERT INTO ms_outbox (event_id, webhook_id, run_id, workflow, event, payload,"
        " created_at, next_at) SELECT 'evt_planted', webhook_id, run_id, workflow, event,"
        " payload, created_at, next_at FROM ms_outbox WHERE run_id = ?",
        (rid,),
    )
    assert _kinds(store) == ["duplicate_event"]


def test_an_acknowledged_cancel_is_honoured(store: Store) -> None:
    rid = _run(store)
    assert store.cancel(rid, NOW, "stop") == "running"  # acknowledged: asked
    done = RunTransition(kind="finish", status="succeeded", output='"ok"')
    store.commit([RunWrite(run_id=rid, epoch=1, transition=done)], NOW)
    assert _kinds(store) == []  # the finish honoured it: cancelled
    # A finish that wrote its result over the request (the bug) is what it reports.
    _sql(store, "UPDATE ms_runs SET status = 'succeeded', output = '1' WHERE id = ?", (rid,))
    assert _kinds(store) == ["cancel_ignored"]
    # A finish that committed first leaves no request: the cancel answered its end.
    other = _run(store, "r2")
    store.commit([RunWrite(run_id=other, epoch=1, transition=done)], NOW)
    assert store.cancel(other, NOW, "late") == "succeeded"
    assert _kinds(store, run_ids=[other]) == []


# -- FaultyStore ---------------------------------------------------------------------


def _create(store: Store, run_id: str) -> Any:
    return store.create_run(run_id=run_id, workflow="wf", input="[]", key=None, now=NOW)


def test_busy_does_nothing_and_ambiguous_does_everything(store: Store) -> None:
    faulty = FaultyStore(
        store, [Fault(kind="busy", at=0), Fault(kind="ambiguous", method="create_run", nth=1)]
    )
    with pytest.raises(ms.StoreUnavailable, match="busy"):
        _create(faulty, "a")
    assert store.get_run("a") is None
    _create(faulty, "b")
    with pytest.raises(ms.StoreUnavailable, match="ambiguous"):
        _create(faulty, "c")
    assert store.get_run("c") is not None  # committed; only the answer was lost
    assert [(c.method, c.fault, c.error) for c in faulty.calls] == [
        ("create_run", "busy", "StoreUnavailable"),
        ("create_run", None, None),
        ("create_run", "ambiguous", "StoreUnavailable"),
    ]
    assert faulty.count("create_run") == 3 and len(faulty.injected) == 2


def test_locked_commit_answers_busy_and_writes_nothing(store: Store) -> None:
    rid = _run(store)
    seen: list[str] = []
    faulty = FaultyStore(
        store,
        [Fault(kind="locked", when=commits_with(step_status="completed"), times=2)],
        after_call=lambda method, *_: seen.append(method),
    )
    write = RunWrite(run_id=rid, epoch=1, steps=[_row(rid, 0)])
    assert faulty.commit([write], NOW) == [ms.storage.WriteResult(ok=False, busy=True)]
    assert store.load_steps(rid) == []
    assert faulty.commit([write], NOW)[0].busy
    assert faulty.commit([write], NOW)[0].ok  # `times` spent
    assert len(store.load_steps(rid)) == 1
    assert seen == ["commit"] * 3


def test_delay_runs_its_hook_inside_the_call(store: Store) -> None:
    clock = ms.FakeClock(start=NOW)
    faulty = FaultyStore(
        store, [Fault(kind="delay", method="get_run", delay_s=0.0, during=lambda: clock.advance(5))]
    )
    assert faulty.get_run("nope") is None
    assert clock.now() == NOW + 5
    assert faulty.dialect == store.dialect  # everything else is the inner store's


def test_a_fault_needs_a_target() -> None:
    with pytest.raises(ValueError, match="needs"):
        Fault(kind="busy")
    with pytest.raises(ValueError, match="fault kind"):
        Fault(kind="boom", at=0)  # type: ignore[arg-type]


# -- issue 12 bugs the invariants find by themselves ---------------------------------


async def test_one_signal_is_not_delivered_to_two_waits(db_url: str) -> None:
    import asyncio

    app = ms.App(db_url, poll_interval_s=0.01)

    async def pause() -> None:
        await asyncio.sleep(0.3)

    @app.workflow
    async def two(ctx: ms.RunContext) -> list[Any]:
        return list(await asyncio.gather(ctx.wait_for("x"), ctx.wait_for("x")))

    @app.workflow
    async def neighbour(ctx: ms.RunContext) -> None:
        await ctx.step(pause)  # two runs at once: commits go through the group committer

    app.submit(neighbour)
    run_id = app.submit(two).run_id
    app.signal(run_id, "x", 1)
    await asyncio.wait_for(app.worker().run(until_idle=True), 30)
    try:
        assert check_invariants(app.store, run_ids=[run_id]) == []
    finally:
        app.close()


async def test_no_step_writes_into_a_finished_run(db_url: str) -> None:
    import asyncio

    inner = open_store(db_url)
    history = StoreHistory()
    app = ms.App(FaultyStore(inner, after_call=history.after_commit(inner)), poll_interval_s=0.01)

    async def slow() -> int:
        await asyncio.sleep(0.3)
        return 1

    async def bad() -> int:
        raise ValueError("no")

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        try:
            await asyncio.gather(ctx.step(slow), ctx.step(bad, retry=ms.RetryPolicy.never()))
        except ms.StepFailed:
            return "gave up"
        return "both"

    run_id = app.submit(wf).run_id
    worker = app.worker()
    task = asyncio.create_task(worker.run())
    try:
        for _ in range(200):  # until the sibling has had time to finish and write
            await asyncio.sleep(0.01)
            if inner.get_run(run_id).finished:  # type: ignore[union-attr]
                break
        await asyncio.sleep(0.5)
        assert check_invariants(inner, history=history, run_ids=[run_id]) == []
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)
        app.close()
