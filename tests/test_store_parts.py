"""The store's public methods that tools build on instead of SQL: a consistent
snapshot of runs and journals, every signal, the rate limiters' rows, the schema
stamp; and the wrapper that faults every store call reaches them too."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import mainspring.storage as storage
from mainspring import StoreUnavailable
from mainspring.storage import (
    RateRow,
    RateTxn,
    RunTransition,
    RunWrite,
    StepRecord,
    Store,
    open_store,
)
from mainspring.testing import Fault, FaultyStore
from mainspring.testing._faults import STORE_METHODS

NOW = 1_767_225_600.0


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = open_store(db_url)
    yield s
    s.close()


def _claimed(store: Store, run_id: str) -> int:
    store.create_run(run_id=run_id, workflow="wf", input="[[],{}]", key=None, now=NOW)
    [run] = store.claim(
        worker="w", now=NOW, lease_s=10, limit=1, workflows=None, max_recoveries=5, run_id=run_id
    )
    return run.epoch


def _row(run_id: str, seq: int, epoch: int, **kw: object) -> StepRecord:
    fields: dict[str, object] = {
        "kind": "step",
        "name": f"s{seq}",
        "status": "completed",
        "attempt": 1,
        "output": "1",
        "started_at": NOW,
        "finished_at": NOW,
    }
    fields.update(kw)
    return StepRecord(run_id=run_id, session=0, seq=seq, epoch=epoch, **fields)  # type: ignore[arg-type]


def test_snapshot_holds_runs_their_waits_and_journals(store: Store) -> None:
    epoch = _claimed(store, "a")
    _claimed(store, "b")
    wait = _row("a", 1, epoch, kind="signal", name="go", status="started", output=None)
    suspend = RunTransition(kind="suspend", status="waiting", wait_signal="go", wait_reason="go")
    [ok] = store.commit(
        [RunWrite(run_id="a", epoch=epoch, steps=[_row("a", 0, epoch), wait], transition=suspend)],
        NOW,
    )
    assert ok.ok

    snap = store.snapshot()
    assert set(snap.runs) == {"a", "b"}
    assert snap.runs["a"] == store.get_run("a")
    assert snap.wait_signals == {"a": "go", "b": None}
    assert [(s.seq, s.name, s.status) for s in snap.steps["a"]] == [
        (0, "s0", "completed"),
        (1, "go", "started"),
    ]
    assert "b" not in snap.steps

    only_b = store.snapshot(["b"])
    assert set(only_b.runs) == {"b"} and only_b.steps == {}
    assert store.snapshot([]).runs == {}


def test_list_signals_shows_consumed_and_pending_ones(store: Store) -> None:
    epoch = _claimed(store, "a")
    first = store.send_signal("a", "go", '"x"', NOW)
    second = store.send_signal("a", "go", '"y"', NOW + 1)
    [ok] = store.commit([RunWrite(run_id="a", epoch=epoch, consume=[(first, "0:3")])], NOW + 2)
    assert ok.ok
    signals = store.list_signals()
    assert [(s.id, s.name, s.payload, s.consumed_by) for s in signals] == [
        (first, "go", '"x"', "0:3"),
        (second, "go", '"y"', None),
    ]
    assert store.list_signals("a") == signals and store.list_signals("nobody") == []


def test_a_rate_limiter_row_round_trips(store: Store) -> None:
    assert store.rate_limit("k") is None
    store.ensure_rate_limit("k")
    store.ensure_rate_limit("k")  # idempotent
    fresh = store.rate_limit("k")
    assert fresh == RateRow()

    wanted = RateRow(
        learned={"rpm": 60.0, "tpm": None, "itpm": None, "otpm": 1000.0},
        tat={"rpm": NOW + 1, "tpm": 0.0, "itpm": 0.0, "otpm": NOW + 2},
        blocked_until=NOW + 3,
        bookings=7,
        barriers={"rpm": [[3.0, 1.5]], "tpm": [], "itpm": [], "otpm": []},
        contacted=True,
        probe_seq=7,
        probe_until=NOW + 4,
        probe_run="a",
        holds=[[7, "a", NOW, {"rpm": 1.0}]],
        outside={"rpm": 2.0},
        synced_at={"rpm": NOW},
    )

    def write(txn: RateTxn) -> float:
        assert txn.key == "k" and txn.row == fresh
        txn.save(wanted, last_start=NOW)
        txn.blend_input_ratio(1.5)
        txn.record_output(40)
        txn.record_output(50)
        return txn.at

    assert store.update_rate_limit("k", NOW, write) == NOW
    assert store.rate_limit("k") == wanted
    assert store.rate_limit_samples("k") == (1.5, [50, 40])
    assert store.update_rate_limit("k", lambda: NOW + 9, lambda txn: txn.at) == NOW + 9


def test_a_rate_limiter_update_sees_which_runs_ended(store: Store) -> None:
    _claimed(store, "live")
    store.create_run(run_id="gone", workflow="wf", input="[[],{}]", key=None, now=NOW)
    store.cancel("gone", NOW)
    store.ensure_rate_limit("k")
    ended = store.update_rate_limit("k", NOW, lambda txn: txn.ended({"live", "gone", "never"}))
    assert ended == {"gone", "never"}


def test_a_rate_limiter_update_without_a_time_uses_the_database_clock(store: Store) -> None:
    store.ensure_rate_limit("k")
    if store.dialect == "postgresql":
        at = store.update_rate_limit("k", None, lambda txn: txn.at)
        assert abs(at - time.time()) < 60
    else:
        with pytest.raises(ValueError, match="no clock of its own"):
            store.update_rate_limit("k", None, lambda txn: txn.at)


def test_stamp_schema_version_is_what_the_database_then_says(store: Store) -> None:
    version = store.schema_version()
    store.stamp_schema_version(version + 1)
    assert store.stored_schema_version() == version + 1


def test_the_fault_wrapper_reaches_the_new_calls(store: Store) -> None:
    for name in ("snapshot", "list_signals", "update_rate_limit", "ensure_rate_limit"):
        assert name in STORE_METHODS
    faulty = FaultyStore(store, [Fault(kind="busy", method="update_rate_limit")])
    faulty.ensure_rate_limit("k")
    with pytest.raises(StoreUnavailable):
        faulty.update_rate_limit("k", NOW, lambda txn: txn.at)
    assert faulty.update_rate_limit("k", NOW, lambda txn: txn.at) == NOW
    assert faulty.methods() == ["ensure_rate_limit", "update_rate_limit", "update_rate_limit"]


def test_key_and_webhook_types_are_public() -> None:
    for name in ("ApiKey", "Webhook", "Delivery", "Scope", "SCOPES", "WebhookEvent"):
        assert name in storage.__all__ and hasattr(storage, name)
    assert storage.SCOPES == ("read", "submit", "approve", "admin", "metrics")


def test_a_journal_row_is_read_into_the_field_its_column_names() -> None:
    """``_step`` spells its fields out (the replay's hot path); each must take the
    column the SELECT list puts at its index, and writing a record and reading it back
    gives the record."""
    from mainspring.storage import StepRecord
    from mainspring.storage._rows import _STEP_FIELDS, _step, _step_params

    row = tuple(f"v{i}" for i in range(len(_STEP_FIELDS)))
    rec = _step(row)
    assert [getattr(rec, name) for name in _STEP_FIELDS] == list(row)
    assert {f for f in StepRecord.__dataclass_fields__} == set(_STEP_FIELDS)
    assert _step(_step_params(rec)) == rec
