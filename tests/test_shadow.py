"""The shadow lab: ``app.shadow()`` re-runs recorded agent runs against a candidate (a
changed script, prompt or model) with every effect stubbed, in a scratch database, and
says where the decisions part.

A "production" App records a run on ``db_url`` (both stores): its agent looks an order
up (a ``read`` tool) and refunds it (an ``irreversible`` tool that applies an effect to
an :class:`EffectLedger`, as a payment API would). A candidate App, over a database of
its own, shadows that run: the ledger holds no new call after it, and the recorded
database is byte for byte what it was.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import drain

import mainspring as ms
from mainspring.limits import Price
from mainspring.models import Message, ToolSpec
from mainspring.testing import EffectLedger, ScriptedModel

PRICES = {"scripted": Price(input=2.0, output=8.0)}

RECORDED = [
    ScriptedModel.call("lookup_order", {"order": 7}, id="c1"),
    ScriptedModel.call("refund", {"order": 7, "amount": 10}, id="c2"),
    ScriptedModel.call("finish", {"answer": "refunded 10"}, id="c3"),
]


def _script(amount: int, *, finish: str | None = None) -> list[Any]:
    return [
        ScriptedModel.call("lookup_order", {"order": 7}, id="c1"),
        ScriptedModel.call("refund", {"order": 7, "amount": amount}, id="c2"),
        ScriptedModel.call("finish", {"answer": finish or f"refunded {amount}"}, id="c3"),
    ]


class World:
    """The outside world of the tests: an effect ledger and a count of reads."""

    def __init__(self, tmp_path: Path) -> None:
        self.ledger = EffectLedger(tmp_path / "ledger.db")
        self.reads = 0

    def app(
        self,
        url: str,
        script: Sequence[Any],
        instructions: str = "Refund what the customer paid.",
        approval: bool = True,
        **agent: Any,
    ) -> ms.App:
        app = ms.App(url, inline_wait_s=0.5, poll_interval_s=0.02)
        world = self

        @app.tool
        def lookup_order(order: int) -> dict[str, Any]:
            """Look an order up."""
            world.reads += 1
            return {"order": order, "paid": 10}

        @app.tool(effect="irreversible", requires_approval=approval)
        def refund(order: int, amount: int) -> str:
            """Refund an order."""
            world.ledger.apply(f"refund:{order}:{amount}", "refund", {"amount": amount})
            return f"refunded {amount} on order {order}"

        model = agent.pop("model", None) or ScriptedModel(list(script), turn_from="history")
        app.agent(
            "refunder",
            model=model,
            instructions=instructions,
            tools=[lookup_order, refund],
            prices=PRICES,
            **agent,
        )
        return app


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.ledger.close()


async def _record(app: ms.App, task: str = "refund order 7") -> str:
    """Run the agent for real, approving its refund as a reviewer would."""
    run_id = app.submit("refunder", task).run_id
    for _ in range(200):
        await drain(app)
        if app.get_run(run_id).status != "waiting":
            break
        for r in app.requests(run_id):
            app.answer(run_id, r.id, decision="approve", by="reviewer")
    assert app.get_run(run_id).status == "succeeded", app.get_run(run_id)
    return run_id


def _rows(app: ms.App) -> Any:
    snap = app.store.snapshot()
    return (
        sorted((r.id, r.status, r.updated_at, r.output) for r in snap.runs.values()),
        {k: [(s.seq, s.name, s.status, s.output) for s in v] for k, v in snap.steps.items()},
    )


async def test_a_changed_script_diverges_at_the_refund_and_reaches_nothing(
    db_url: str, tmp_path: Path, world: World
) -> None:
    prod = world.app(db_url, RECORDED)
    candidate = world.app(
        f"sqlite:///{tmp_path / 'candidate.db'}", _script(25), "Refund generously."
    )
    try:
        run_id = await _record(prod)
        assert world.ledger.report().calls == 1 and world.reads == 1
        before = _rows(prod)

        report = await candidate.shadow([run_id], database=db_url, prices=PRICES)

        # nothing reached the world, nothing was written to the recorded database
        assert world.ledger.report().calls == 1
        assert world.reads == 1  # reads come from the journal by default
        assert _rows(prod) == before
    finally:
        prod.close()
        candidate.close()

    [r] = report.runs
    assert r.verdict == "diverged"
    assert r.turn == 2
    assert r.before == 'refund({"amount": 10, "order": 7})'
    assert r.after == 'refund({"amount": 25, "order": 7})'
    assert [(c.turn, c.tool, c.changes) for c in r.arguments] == [
        (2, "refund", ("amount: 10 → 25",)),
        (3, "finish", ('answer: "refunded 10" → "refunded 25"',)),
    ]
    # tokens and cost of both sides, from the journal's model steps
    assert r.recorded is not None and r.shadow is not None
    assert r.recorded.input_tokens > 0 and r.shadow.input_tokens > 0
    assert r.recorded.cost_usd > 0 and r.shadow.cost_usd > 0
    assert (r.recorded.result, r.recorded.answer) == ("done", "refunded 10")
    assert (r.shadow.result, r.shadow.answer) == ("done", "refunded 25")
    # how each effect was answered: the read by its arguments, the refund (whose
    # arguments changed) by its name and order; the real tool never ran
    sources = {(a.step, a.source) for a in r.stubbed}
    assert sources == {
        ("tool:lookup_order", "journal: name and arguments"),
        ("tool:refund", "journal: name and order"),
    }
    assert r.effects_stubbed == 1
    out = json.loads(json.dumps(report.to_dict(), default=str))
    assert out["diverged"] == 1 and out["runs"][0]["arguments"][0]["tool"] == "refund"


async def test_an_unchanged_candidate_is_the_same(tmp_path: Path, world: World) -> None:
    """The candidate's App holds the production database itself: it is only read."""
    url = f"sqlite:///{tmp_path / 'prod.db'}"
    prod = world.app(url, RECORDED)
    try:
        run_id = await _record(prod)
        before = _rows(prod)
        report = await prod.shadow([run_id], model=ScriptedModel(_script(10), turn_from="history"))
        assert _rows(prod) == before
    finally:
        prod.close()
    [r] = report.runs
    assert r.verdict == "same", r
    assert r.arguments == ()
    assert world.ledger.report().calls == 1


async def test_a_shadow_from_a_later_step_keeps_the_past(tmp_path: Path, world: World) -> None:
    url = f"sqlite:///{tmp_path / 'prod.db'}"
    prod = world.app(url, RECORDED)
    try:
        run_id = await _record(prod)
        models = [s for s in prod.store.load_steps(run_id) if s.role == "model"]
        second = models[1].seq  # the reply that refunds
        # a candidate that would look up another order first, and refund 30
        script = [
            ScriptedModel.call("lookup_order", {"order": 99}, id="c1"),
            ScriptedModel.call("refund", {"order": 7, "amount": 30}, id="c2"),
            ScriptedModel.call("finish", {"answer": "refunded 30"}, id="c3"),
        ]
        report = await prod.shadow(
            [run_id], from_step=second, model=ScriptedModel(script, turn_from="history")
        )
    finally:
        prod.close()
    [r] = report.runs
    assert r.from_step == f"0:{second}"
    # the first reply was kept from the journal (no lookup of order 99): the
    # decisions part at the refund
    assert (r.verdict, r.turn) == ("diverged", 2)
    assert r.after == 'refund({"amount": 30, "order": 7})'
    kept = [a for a in r.stubbed if a.source == "journal: position"]
    assert [a.step for a in kept][:1] == [models[0].name]
    assert world.ledger.report().calls == 1


async def test_a_call_with_no_recorded_result_gets_a_stub_error_or_the_given_stub(
    tmp_path: Path, world: World
) -> None:
    url = f"sqlite:///{tmp_path / 'prod.db'}"
    prod = world.app(url, RECORDED)
    seen: list[str] = []

    def refund_twice(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Any:
        turn = sum(1 for m in messages if m.kind == "assistant")
        if turn == 0:
            return ScriptedModel.call("refund", {"order": 7, "amount": 10}, id="r1")
        if turn == 1:
            return ScriptedModel.call("refund", {"order": 8, "amount": 5}, id="r2")
        seen.append(next(m.content for m in reversed(messages) if m.kind == "tool_result"))
        return ScriptedModel.call("finish", {"answer": "done"}, id="f")

    try:
        run_id = await _record(prod)
        report = await prod.shadow([run_id], model=ScriptedModel(refund_twice))
        stubbed: list[dict[str, Any]] = []
        given = await prod.shadow(
            [run_id],
            model=ScriptedModel(refund_twice),
            stubs={"refund": lambda args: stubbed.append(args) or "stubbed refund"},
        )
    finally:
        prod.close()
    [r] = report.runs
    # the first refund matched the recorded one exactly; the second had nothing left
    assert [(a.step, a.source) for a in r.stubbed] == [
        ("tool:refund", "journal: name and arguments"),
        ("tool:refund", "missing"),
    ]
    assert "ShadowStubMissing" in seen[0] and "no stub was given" in seen[0]
    [g] = given.runs
    assert {a.source for a in g.stubbed} == {"stub"}
    assert stubbed == [{"order": 7, "amount": 10}, {"order": 8, "amount": 5}]
    assert seen[1] == "stubbed refund"
    assert world.ledger.report().calls == 1  # the recorded refund only


async def test_reads_can_run_live_and_runs_are_chosen_by_filter(
    tmp_path: Path, world: World
) -> None:
    url = f"sqlite:///{tmp_path / 'prod.db'}"
    prod = world.app(url, RECORDED)
    try:
        first = await _record(prod)
        broken = world.app(url, [ms.ConfigError("the model is down")])
        try:
            failed = broken.submit("refunder", "refund order 8").run_id
            await drain(broken)
        finally:
            broken.close()
        assert prod.get_run(failed).status == "failed"
        report = await prod.shadow(
            statuses=["failed"],
            since=timedelta(days=7),
            reads="live",
            model=ScriptedModel(_script(10), turn_from="history"),
        )
        everything = await prod.shadow(
            workflows=["refunder"], model=ScriptedModel(_script(10), turn_from="history")
        )
    finally:
        prod.close()
    [r] = report.runs
    assert r.run_id == failed
    assert r.recorded is not None and r.recorded.status == "failed"
    assert r.shadow is not None and r.shadow.status == "succeeded"
    assert r.verdict == "diverged"
    assert ("tool:lookup_order", "live") in {(a.step, a.source) for a in r.stubbed}
    assert {x.run_id for x in everything.runs} == {first, failed}
    assert world.ledger.report().calls == 1


def test_a_100_step_agent_run_under_a_changed_prompt(tmp_path: Path, world: World) -> None:
    """The "done when" of the shadow lab: a 100-reply agent run, shadowed under a new
    prompt that changes one argument at reply 60, gives that diff and no real effect."""
    import asyncio

    steps = 100

    def player() -> ScriptedModel:
        """Plays reply after reply (counted: older turns leave the prompt); under a
        prompt that says "carefully" it refunds 11 instead of 10 at reply 60."""
        made = [0]

        def play(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Any:
            turn = made[0]
            made[0] += 1
            careful = "carefully" in str(getattr(messages[0], "content", ""))
            if turn == steps - 1:
                return ScriptedModel.call("finish", {"answer": "all refunded"}, id=f"f{turn}")
            if turn % 2 == 0:
                return ScriptedModel.call("lookup_order", {"order": turn}, id=f"l{turn}")
            amount = 11 if careful and turn == 59 else 10
            return ScriptedModel.call("refund", {"order": turn, "amount": amount}, id=f"r{turn}")

        return ScriptedModel(play)

    url = f"sqlite:///{tmp_path / 'prod.db'}"
    limits = ms.Limits(max_steps=steps + 5)
    prod = world.app(url, [], model=player(), limits=limits, approval=False)
    candidate = world.app(
        f"sqlite:///{tmp_path / 'candidate.db'}",
        [],
        "Refund carefully.",
        model=player(),
        limits=limits,
        approval=False,
    )

    async def go() -> ms.ShadowReport:
        run_id = await _record(prod, "refund every order")
        assert world.ledger.report().calls == steps // 2 - 1
        return await candidate.shadow([run_id], database=url)

    try:
        report = asyncio.run(go())
    finally:
        prod.close()
        candidate.close()
    [r] = report.runs
    assert r.recorded is not None and r.recorded.turns == steps
    assert r.shadow is not None and r.shadow.turns == steps
    assert (r.verdict, r.turn) == ("diverged", 60)
    [change] = r.arguments
    assert change.changes == ("amount: 10 → 11",)
    assert world.ledger.report().calls == steps // 2 - 1  # no new effect
    assert r.effects_stubbed == steps // 2 - 1
    assert r.recorded.answer == r.shadow.answer == "all refunded"


async def test_a_plain_workflow_step_nobody_declared_read_is_answered_from_the_journal(
    tmp_path: Path, world: World
) -> None:
    """A ``ctx.step`` function is no tool: with no effect class, the shadow takes it for
    a write and answers it from the recorded journal (by name and order)."""
    url = f"sqlite:///{tmp_path / 'prod.db'}"

    def charge(amount: int) -> str:
        world.ledger.apply(f"charge:{amount}", "charge", amount)
        return f"charged {amount}"

    def build() -> ms.App:
        app = ms.App(url, inline_wait_s=0.5, poll_interval_s=0.02)

        @app.workflow(name="billing")
        async def billing(ctx: ms.RunContext, amount: int) -> str:
            return await ctx.step(charge, amount)

        return app

    prod = build()
    try:
        run_id = prod.submit("billing", 42).run_id
        await drain(prod)
        assert world.ledger.report().calls == 1
        report = await prod.shadow([run_id])
    finally:
        prod.close()
    [r] = report.runs
    assert r.verdict == "same"
    assert r.recorded is not None and r.shadow is not None
    assert r.shadow.answer == r.recorded.answer == "charged 42"
    assert [(a.effect, a.source) for a in r.stubbed] == [("write", "journal: name and order")]
    assert world.ledger.report().calls == 1


async def test_requests_are_answered_as_the_recorded_run_s_people_answered(
    tmp_path: Path, world: World
) -> None:
    """A question gets the recorded answer, an approval the recorded decision (here a
    rejection with its reason), so the candidate meets what the recorded run met."""
    url = f"sqlite:///{tmp_path / 'prod.db'}"
    script = [
        ScriptedModel.call("ask_human", {"question": "Which order?"}, id="q1"),
        ScriptedModel.call("refund", {"order": 7, "amount": 10}, id="c2"),
        ScriptedModel.call("finish", {"answer": "not refunded"}, id="c3"),
    ]
    prod = world.app(url, script, ask_human=True)
    seen: list[str] = []

    def watch(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Any:
        turn = sum(1 for m in messages if m.kind == "assistant")
        seen.extend(m.content for m in messages[-1:] if m.kind == "tool_result")
        return script[turn]

    try:
        run_id = prod.submit("refunder", "refund the order").run_id
        for _ in range(10):
            await drain(prod)
            if prod.get_run(run_id).finished:
                break
            for r in prod.requests(run_id):
                if r.kind == "question":
                    prod.answer(run_id, r.id, answer="order 7", by="customer")
                else:
                    prod.answer(run_id, r.id, decision="reject", reason="too much", by="lead")
        assert prod.get_run(run_id).status == "succeeded"
        report = await prod.shadow([run_id], model=ScriptedModel(watch))
    finally:
        prod.close()
    [r] = report.runs
    assert r.verdict == "same", r
    assert any("order 7" in text for text in seen), seen
    assert any("too much" in text for text in seen), seen
    assert world.ledger.report().calls == 0  # rejected then, never run since
