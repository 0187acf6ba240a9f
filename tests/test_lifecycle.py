"""One execution's lifecycle (journal/_lifecycle.py): its transitions and their owner.

Every transition of :data:`EDGES` is tried from every state: from a state it may
start from it leads where the table says, from any other it raises
:class:`IllegalTransition` and changes nothing. Then a scan of the package's source:
no module but the owner writes the fields of a lifecycle or of a journal cursor.
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest

from mainspring._clock import FakeClock
from mainspring._errors import Cancelled, StoreUnavailable
from mainspring.journal import RunControl
from mainspring.journal._control import _Closed, _EngineFailure, _Release, _Suspend
from mainspring.journal._cursor import Cursor
from mainspring.journal._lifecycle import EDGES, IllegalTransition, Lifecycle, LifeState
from mainspring.storage import RunRecord, RunTransition

PACKAGE = Path(__file__).resolve().parent.parent / "mainspring"
STATES: tuple[LifeState, ...] = get_args(LifeState)
SUSPEND = RunTransition(kind="suspend", status="sleeping", wake_at=10.0)


def record(*, epoch: int = 1, cancel: bool = False) -> RunRecord:
    return RunRecord(
        id="r1",
        workflow="wf",
        key=None,
        status="running",
        input="[[], {}]",
        output=None,
        error=None,
        session=0,
        handoff=None,
        epoch=epoch,
        owner="w",
        lease_until=None,
        wake_at=None,
        wait_reason=None,
        recoveries=0,
        cancel_requested=cancel,
        created_at=0.0,
        updated_at=0.0,
        finished_at=None,
    )


async def in_state(state: LifeState) -> Lifecycle:
    """A sticky lifecycle brought to ``state`` by legal transitions only, its workflow
    in a task of its own (as the executor makes it), which a drop cancels."""
    life = Lifecycle(record(), RunControl(), sticky=True)
    life.adopt(asyncio.create_task(asyncio.Event().wait()))
    if state == "closing":
        life.decide(_Release())
    elif state in ("parked", "dormant"):
        life.park(SUSPEND)
        if state == "dormant":
            life.sleep()
    elif state == "closed":
        life.drop()
    assert life.state == state
    return life


async def attempt(life: Lifecycle, edge: str) -> None:
    if edge == "park":
        life.park(SUSPEND)
    elif edge == "interrupt":
        life.interrupt(SUSPEND)
    elif edge == "sleep":
        life.sleep()
    elif edge == "wake":
        life.wake(record(epoch=2), RunControl())
    elif edge == "settle":
        await life.settle()
    elif edge == "drop":
        life.drop()
    else:
        raise AssertionError(edge)


@pytest.mark.parametrize("edge", [e for e in EDGES if e != "decide"])
@pytest.mark.parametrize("state", STATES)
async def test_each_transition_goes_where_the_table_says_or_is_refused(
    state: LifeState, edge: str
) -> None:
    allowed, target = EDGES[edge]
    life = await in_state(state)
    stop = life.stop
    if state in allowed:
        await attempt(life, edge)
        assert life.state == target
    else:
        with pytest.raises(IllegalTransition, match=f"{edge} from {state!r}"):
            await attempt(life, edge)
        assert (life.state, life.stop) == (state, stop)  # nothing changed


def test_every_state_is_reachable_and_every_edge_is_in_the_table() -> None:
    targets = {target for _, target in EDGES.values()}
    assert targets | {"running"} == set(STATES)
    methods = {name for name in dir(Lifecycle) if not name.startswith("_")}
    assert set(EDGES) <= methods


@pytest.mark.parametrize("state", STATES)
async def test_the_first_decision_stands(state: LifeState) -> None:
    life = await in_state(state)
    before = life.stop
    failure = _EngineFailure(StoreUnavailable("the store is down"))
    got = life.decide(failure)
    if state == "running":
        assert (got, life.stop, life.state) == (failure, failure, "closing")
        assert life.decide(_Release()) is failure  # a later decision is dropped
    else:
        assert got is before and life.stop is before and life.state == state
    # Deciding while parked or dormant is a use of the context: it is spoiled.
    assert life.spoiled == (state in ("parked", "dormant"))


async def test_a_use_while_parked_spoils_the_execution_explicitly() -> None:
    life = await in_state("parked")
    assert life.intact and isinstance(life.stop, _Closed)
    with pytest.raises(_Closed):
        life.boundary()
    assert not life.intact
    life.sleep()
    assert not life.resumable()  # replayed, never resumed


async def test_activity_while_dormant_keeps_it_from_resuming() -> None:
    life = await in_state("running")
    waker = life.park_wait(3, ("go", None, "signal:go"))
    assert waker is not None
    life.park(SUSPEND)
    life.sleep()
    assert life.resumable()
    life.touch()  # a task of the workflow did something of its own
    assert not life.resumable() and not life.spoiled


async def test_wake_resolves_the_parked_waits_and_takes_the_new_claim() -> None:
    life = await in_state("running")
    wakers = [life.park_wait(key, ("go", None, "signal:go")) for key in (7, -1)]
    life.park(SUSPEND)
    assert life.parking is not None and life.parking.result() == SUSPEND
    life.sleep()
    control = RunControl()
    life.wake(record(epoch=2, cancel=True), control)
    assert (life.state, life.stop, life.control, life.cancel) == ("running", None, control, True)
    assert all(w is not None and w.done() for w in wakers)
    assert life.parking is not None and not life.parking.done()
    with pytest.raises(Cancelled):
        life.boundary()  # the cancel asked meanwhile is met at the next use
    assert life.state == "closing"


async def test_interrupt_replaces_the_parked_marker_with_the_suspension() -> None:
    life = await in_state("parked")
    life.interrupt(SUSPEND)
    assert isinstance(life.stop, _Suspend) and life.stop.transition is SUSPEND


async def test_settle_waits_for_running_steps_on_a_release_and_cancels_the_rest() -> None:
    life = Lifecycle(record(), RunControl())
    order: list[str] = []

    async def step() -> None:
        life.boundary()
        life.step_began()
        await asyncio.sleep(0.01)
        order.append("step ended")
        life.step_ended()

    async def idle() -> None:
        life.boundary()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            order.append("idle cancelled")
            raise

    tasks = [asyncio.create_task(step()), asyncio.create_task(idle())]
    await asyncio.sleep(0)
    life.decide(_Release())
    await life.settle()
    assert order == ["step ended", "idle cancelled"]
    assert life.state == "closed" and not life.ending
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_adopt_only_before_anything_used_the_context() -> None:
    life = Lifecycle(record(), RunControl(), sticky=True)
    life.boundary()
    with pytest.raises(IllegalTransition):
        life.adopt(asyncio.ensure_future(asyncio.sleep(0)))
    await asyncio.sleep(0)


# -- no module but the owner writes an execution's fields --------------------------

# The names a cursor or a lifecycle goes by where other modules hold one.
_HOLDERS = {"cur", "cursor", "_cursor", "life", "_life"}
_MUTATORS = {"append", "add", "clear", "set", "pop", "discard", "update", "extend", "remove"}


def _holder(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in _HOLDERS
    return isinstance(node, ast.Attribute) and node.attr in _HOLDERS


def _written(node: ast.AST, fields: set[str]) -> Iterator[tuple[int, str]]:
    """``(line, field)`` of each write to a field of a cursor or lifecycle in ``node``:
    assigned, augmented, deleted, an item of it set or deleted, or mutated in place."""
    for sub in ast.walk(node):
        targets: list[ast.expr] = []
        if isinstance(sub, ast.Assign | ast.Delete):
            targets = list(sub.targets)
        elif isinstance(sub, ast.AugAssign | ast.AnnAssign):
            targets = [sub.target]
        elif (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr in _MUTATORS
        ):
            targets = [sub.func.value]
        for target in targets:
            for t in ast.walk(target) if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Subscript):
                    t = t.value
                if isinstance(t, ast.Attribute) and _holder(t.value) and t.attr in fields:
                    yield sub.lineno, t.attr


def owned_fields() -> dict[str, set[str]]:
    """The fields of each owner's instances, by owner module."""
    run = record()
    life = Lifecycle(run, RunControl())
    cur = Cursor(run=run, journal=[], engine=_engine(), life=life)
    return {"_lifecycle.py": set(vars(life)), "_cursor.py": set(vars(cur)) - {"life"}}


def _engine() -> Any:
    class Engine:  # the cursor reads only its clock when made
        clock = FakeClock()

    return Engine()


def foreign_writes(root: Path, fields: dict[str, set[str]]) -> list[str]:
    every = set().union(*fields.values())
    found = []
    for path in sorted(root.rglob("*.py")):
        mine = fields.get(path.name, set()) if path.parent.name == "journal" else set()
        tree = ast.parse(path.read_text(), str(path))
        for line, field in _written(tree, every - mine):
            found.append(f"{path.relative_to(root.parent)}:{line} .{field}")
    return found


def test_no_module_but_the_owner_writes_an_executions_fields() -> None:
    assert foreign_writes(PACKAGE, owned_fields()) == []


def test_the_scan_finds_each_kind_of_write() -> None:
    source = """
cur.stop = None
ex.cur.epoch = 2
self.life.running += 1
cur.consume.append((1, "0:1"))
del life.parked[3]
life.wakers[1] = f
cur.pending.clear()
x = cur.stop  # a read
cur.take("step", "s")  # a method
"""
    fields = {"stop", "epoch", "running", "consume", "parked", "wakers", "pending"}
    found = sorted(line for line, _ in _written(ast.parse(source), fields))
    assert found == [2, 3, 4, 5, 6, 7, 8]
