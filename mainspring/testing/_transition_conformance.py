"""The run state machine part of the Store conformance suite (mixed into
:class:`~mainspring.testing.conformance.StoreConformance`): every edge of
:data:`~mainspring.storage.RUN_EDGES`, taken from every status, writes what the table
says or, from a status it does not leave, nothing at all; and what a dialect sends
its own way (a claim in one statement, a commit in one round trip) leaves the row
the edge leaves."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, get_args

from ..storage import RUN_EDGES, RunRecord, RunStatus, RunTransition, RunWrite, Store, take_edge

__all__ = ["TransitionConformance"]

T0 = 1_000_000.0
T1 = T0 + 1.0
LEASE = 15.0
_ERROR = '{"type": "Boom", "message": "boom"}'
_CANCEL = '{"type": "Cancelled", "message": "stop"}'

# The keywords each edge's function is walked with (at T1).
_ARGS: dict[str, dict[str, Any]] = {
    "claim": {"worker": "w2", "at": ("?", [T1]), "lease_s": LEASE, "recoveries": 0, "now": T1},
    "suspend": {
        "t": RunTransition(kind="suspend", status="sleeping", wake_at=T1 + 60, wait_reason="sleep"),
        "now": T1,
        "cancel_requested": False,
    },
    "refuse": {"status": "sleeping", "wake_at": 0.0, "note": _ERROR, "now": T1},
    "release": {"now": T1},
    "wake": {"now": T1},
    "next_session": {"session": None, "handoff": '"h"', "now": T1},
    "ask_cancel": {"error": _CANCEL, "now": T1},
    "finish": {
        "t": RunTransition(kind="finish", status="succeeded", output="2"),
        "now": T1,
        "cancel_requested": False,
    },
    "dead_letter": {"recoveries": 4, "error": _ERROR, "now": T1},
    "cancel": {"error": _CANCEL, "now": T1},
    "cancel_at_birth": {"error": _CANCEL, "now": T1},
    "retry": {"now": T1},
}

# How a run is brought to each status, by the edges themselves (at T0).
_CLAIM = {"worker": "w1", "at": ("?", [T0]), "lease_s": LEASE, "recoveries": 0, "now": T0}
_TO: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "queued": [],
    "running": [("claim", _CLAIM)],
    "sleeping": [
        ("claim", _CLAIM),
        (
            "suspend",
            {
                "t": RunTransition(
                    kind="suspend", status="sleeping", wake_at=T0 + 60, wait_reason="sleep"
                ),
                "now": T0,
                "cancel_requested": False,
            },
        ),
    ],
    "waiting": [
        ("claim", _CLAIM),
        (
            "suspend",
            {
                "t": RunTransition(
                    kind="suspend", status="waiting", wait_signal="go", wait_reason="signal"
                ),
                "now": T0,
                "cancel_requested": False,
            },
        ),
    ],
    "succeeded": [
        ("claim", _CLAIM),
        (
            "finish",
            {
                "t": RunTransition(kind="finish", status="succeeded", output="1"),
                "now": T0,
                "cancel_requested": False,
            },
        ),
    ],
    "failed": [
        ("claim", _CLAIM),
        (
            "finish",
            {
                "t": RunTransition(kind="finish", status="failed", error=_ERROR),
                "now": T0,
                "cancel_requested": False,
            },
        ),
    ],
    "cancelled": [("cancel", {"error": _CANCEL, "now": T0})],
}

_COUNTS = ("ms_outbox", "ms_signals")


class TransitionConformance:
    """The run's state machine, walked from its table."""

    if TYPE_CHECKING:  # what StoreConformance provides

        def store(self) -> AbstractContextManager[Store]: ...

    def _at(self, s: Store, run_id: str, status: str) -> None:
        s.create_run(run_id=run_id, workflow="wf", input="{}", key=None, now=T0)
        for edge, args in _TO[status]:
            applied, _, _ = take_edge(s, edge, run_id, **args)
            assert applied, f"{edge} on the way to {status}"
        run = s.get_run(run_id)
        assert run is not None and run.status == status

    def test_the_table_covers_every_status(self) -> None:
        statuses = set(get_args(RunStatus))
        assert set(_TO) == statuses
        assert {s for e in RUN_EDGES.values() for s in (*e.sources, *e.targets)} == statuses
        assert set(_ARGS) == set(RUN_EDGES)
        for edge in RUN_EDGES.values():
            assert not edge.writes & edge.clears, edge.name
            # A holder's edge leaves only from running (its fence says so).
            assert not edge.fence or edge.sources == ("running",), edge.name
            assert ("status" in edge.writes) == (set(edge.targets) != set(edge.sources))
            if edge.ends:  # every end clears the same columns and moves the fence on
                assert edge.bumps_epoch and set(edge.targets) <= {
                    "succeeded",
                    "failed",
                    "cancelled",
                }
                assert edge.clears >= {"owner", "lease_until", "wake_at", "wait_reason"}

    def test_every_edge_from_every_status_writes_what_the_table_says(self) -> None:
        with self.store() as s:
            s.add_webhook("http://127.0.0.1:9/hook", T0)  # so that an end's event is queued
            for name, edge in RUN_EDGES.items():
                for status in _TO:
                    rid = f"{name}-{status}"
                    self._at(s, rid, status)
                    applied, before, after = take_edge(s, name, rid, **_ARGS[name])
                    where = f"{name} from {status}"
                    if status not in edge.sources:
                        assert not applied, f"{where}: an illegal edge applied"
                        assert after == before, f"{where}: an illegal edge wrote"
                        continue
                    assert applied, f"{where}: refused"
                    assert after["status"] in edge.targets, where
                    assert after["epoch"] == before["epoch"] + edge.bumps_epoch, where
                    for column in edge.clears:
                        assert after[column] is None, f"{where}: {column} not cleared"
                    changed = {c for c in before if before[c] != after[c]} - set(_COUNTS)
                    assert changed <= edge.writes | edge.clears, f"{where} wrote {changed}"
                    # An end queues its one event; no edge walked here queues another.
                    assert after["ms_outbox"] - before["ms_outbox"] == edge.ends, where
                    assert after["ms_signals"] == before["ms_signals"], where

    def test_a_holders_edge_at_another_epoch_writes_nothing(self) -> None:
        with self.store() as s:
            for name, edge in RUN_EDGES.items():
                if not edge.fence:
                    continue
                rid = f"stale-{name}"
                self._at(s, rid, "running")
                for held in (-1, 1):
                    epoch = s.get_run(rid).epoch + held  # type: ignore[union-attr]
                    applied, before, after = take_edge(s, name, rid, epoch=epoch, **_ARGS[name])
                    assert not applied and after == before, f"{name} at epoch {epoch}"

    def test_what_a_dialect_sends_its_way_leaves_the_row_its_edge_leaves(self) -> None:
        """A claim, a finish and a suspend through the store's own methods (on
        PostgreSQL: a claim in one statement, a finish in one round trip) leave the
        run's row as the edge's function does."""

        def row(s: Store, rid: str) -> dict[str, Any]:
            run = s.get_run(rid)
            assert run is not None
            fields = asdict(run)
            for other in ("id", "created_at"):
                fields.pop(other)
            return {**fields, "wait_signal": s.snapshot([rid]).wait_signals[rid]}

        def claimed(s: Store, rid: str, now: float = T1) -> RunRecord:
            runs = s.claim(
                worker="w2",
                now=now,
                lease_s=LEASE,
                limit=1,
                workflows=["wf"],
                max_recoveries=3,
                run_id=rid,
            )
            assert [r.id for r in runs] == [rid], rid
            return runs[0]

        with self.store() as s:
            for status in ("queued", "running", "sleeping"):
                self._at(s, f"a-{status}", status)
                self._at(s, f"b-{status}", status)
            # Due: the sleeper's wake time and the takeover's lease have come.
            late = T0 + LEASE + 61
            args = {**_ARGS["claim"], "at": ("?", [late]), "now": late}
            for status in ("sleeping", "running"):
                rid = f"a-{status}"
                claimed(s, rid, now=late)
                recoveries = 1 if status == "running" else 0
                take_edge(s, "claim", f"b-{status}", **{**args, "recoveries": recoveries})
                assert row(s, rid) == row(s, f"b-{status}"), f"claim from {status}"
            claimed(s, "a-queued")
            take_edge(s, "claim", "b-queued", **_ARGS["claim"])
            assert row(s, "a-queued") == row(s, "b-queued"), "claim from queued"
            for rid, t in (
                ("queued", RunTransition(kind="finish", status="succeeded", output="3")),
                ("sleeping", RunTransition(kind="finish", status="failed", error=_ERROR)),
                (
                    "running",
                    RunTransition(kind="suspend", status="waiting", wait_signal="go", wake_at=T1),
                ),
            ):
                epoch = s.get_run(f"a-{rid}").epoch  # type: ignore[union-attr]
                [result] = s.commit([RunWrite(run_id=f"a-{rid}", epoch=epoch, transition=t)], T1)
                assert result.ok, rid
                edge = "finish" if t.kind == "finish" else "suspend"
                extra: dict[str, Any] = {"t": t, "now": T1, "cancel_requested": False}
                assert take_edge(s, edge, f"b-{rid}", **extra)[0], rid
                assert row(s, f"a-{rid}") == row(s, f"b-{rid}"), f"{edge} of {rid}"
