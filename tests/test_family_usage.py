"""A parent's spending with and without its children: tokens, cost and duration of each
child (and its own children), the same in ``app.observe.family``, ``mainspring show`` and the
API's run view; a list of runs reads every run's usage in one query."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.limits import Price
from mainspring.models import ModelResponse, Usage
from mainspring.server import create_app
from mainspring.testing import ScriptedModel

PRICES = {"scripted": Price(input=3.0, output=15.0)}


def _spent(reply: ModelResponse, tokens_in: int, tokens_out: int) -> ModelResponse:
    return dataclasses.replace(reply, usage=Usage(input_tokens=tokens_in, output_tokens=tokens_out))


def _family(db: str) -> tuple[str, list[str]]:
    """A planner agent that spends 1,000 tokens itself and delegates to a researcher
    (11,000 tokens) and to a lead that spends 165 tokens itself and delegates to a
    researcher of its own (11,000 tokens)."""
    app = ms.App(db, poll_interval_s=0.02, inline_wait_s=0.0)
    researcher = app.agent(
        "researcher",
        model=ScriptedModel(
            [_spent(ScriptedModel.call("finish", {"answer": "notes"}), 10_000, 1_000)],
            turn_from="history",
        ),
        instructions="Research.",
        prices=PRICES,
    )
    lead = app.agent(
        "lead",
        model=ScriptedModel(
            [
                _spent(ScriptedModel.call("deeper", {"task": "research deeper"}), 100, 10),
                _spent(ScriptedModel.call("finish", {"answer": "led"}), 50, 5),
            ],
            turn_from="history",
        ),
        instructions="Lead.",
        tools=[researcher.as_tool(name="deeper")],
        prices=PRICES,
    )
    planner = app.agent(
        "planner",
        model=ScriptedModel(
            [
                _spent(
                    ScriptedModel.calls(
                        ("researcher", {"task": "research"}), ("lead", {"task": "lead"})
                    ),
                    600,
                    60,
                ),
                _spent(ScriptedModel.call("finish", {"answer": "planned"}), 300, 40),
            ],
            turn_from="history",
        ),
        instructions="Plan.",
        tools=[researcher.as_tool(), lead.as_tool()],
        prices=PRICES,
    )
    run_id = app.submit(planner, "plan it").run_id
    asyncio.run(app.worker().run(until_idle=True))
    assert app.get_run(run_id).status == "succeeded", app.get_run(run_id).error
    children = [c.id for c in app.children(run_id)]
    app.close()
    return run_id, children


def test_a_parent_counts_its_children_and_theirs(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'family.db'}"
    parent, children = _family(db)
    app = ms.App(db)
    family = app.observe.family(parent)
    assert family.own.tokens == 1_000 and family.own.model_calls == 2
    assert [c.run.id for c in family.children] == children
    first, middle = family.children
    assert (first.total.tokens, first.descendants) == (11_000, 0)
    assert (middle.run.workflow, middle.own.tokens, middle.own.model_calls) == ("lead", 165, 2)
    assert (middle.total.tokens, middle.descendants) == (11_165, 1)
    assert first.total.cost_usd == pytest.approx(10_000 * 3e-6 + 1_000 * 15e-6)
    assert family.children_total.tokens == 22_165
    assert family.with_children.tokens == 23_165
    assert all(c.duration_s > 0 for c in family.children) and family.duration_s > 0
    # A list's usage: one query for every run, each its own calls only.
    usage = app.observe.usage(app.list_runs(summary=True))
    assert usage[parent].tokens == 1_000 and usage[children[1]].tokens == 165

    # mainspring show: the run's own usage, each child's, and the totals.
    shown = CliRunner().invoke(cli, ["show", parent, "--db", db])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert any(
        line.startswith("usage ") and "1,000 tokens (900 in, 100 out)" in line for line in lines
    )
    assert any(line.startswith("with children") and "23,165 tokens" in line for line in lines)
    assert any(children[0] in line and "11,000 tokens" in line for line in lines)
    data = json.loads(CliRunner().invoke(cli, ["show", parent, "--db", db, "--json"]).stdout)
    assert data["run"]["usage"]["with_children"]["tokens_in"] == 900 + 150 + 2 * 10_000
    assert data["run"]["usage"]["children"]["tokens_out"] == 15 + 2_000
    assert [c["tokens_in"] for c in data["run"]["children"]] == [10_000, 10_150]

    # The API's run view: the same numbers.
    _, key = app.store.create_api_key("ops", ["read"], app.clock.now())
    with TestClient(create_app(app, webhooks=False)) as http:
        body = http.get(f"/runs/{parent}", headers={"Authorization": f"Bearer {key}"}).json()
    assert body["usage"]["own"]["model_calls"] == 2
    assert body["usage"]["with_children"]["tokens_out"] == 100 + 15 + 2_000
    assert [c["usage"]["tokens_in"] for c in body["children"]] == [10_000, 10_150]
    assert all(c["duration_s"] > 0 for c in body["children"])
    app.close()
