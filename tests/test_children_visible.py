"""Child runs are visible: ``mainspring show`` (text and JSON), the HTTP API's run
view, the dashboard's run page, each with a child's parent-close policy, and the trace
export nests a child under the step of its parent that started it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fastapi.testclient import TestClient
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli
from mainspring.server import create_app
from mainspring.storage import ParentClose


def _family(db: str, on_parent_close: ParentClose = "cancel") -> tuple[str, str]:
    app = ms.App(db)

    @app.workflow
    async def kid(ctx: ms.RunContext, n: int) -> int:
        return await ctx.step(lambda: n + 1, name="add")

    @app.workflow
    async def parent(ctx: ms.RunContext) -> int:
        return await ctx.child(kid, 1, on_parent_close=on_parent_close)

    try:
        run_id = app.submit(parent).run_id
        asyncio.run(app.worker().run(until_idle=True))
        (child,) = app.children(run_id)
        return run_id, child.id
    finally:
        app.close()


def test_show_api_and_dashboard_list_children_and_parents(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'kids.db'}"
    parent, child = _family(db)
    app = ms.App(db)
    try:
        _, admin = app.store.create_api_key("ops", ["admin"], app.clock.now())
        auth = {"Authorization": f"Bearer {admin}"}
        with TestClient(create_app(app, webhooks=False)) as client:
            body = client.get(f"/runs/{parent}", headers=auth).json()
            assert body["output"] == 2
            [seen] = body["children"]
            assert seen["duration_s"] >= 0
            assert seen["usage"] == {
                "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0, "model_calls": 0,
            }  # fmt: skip
            del seen["duration_s"], seen["usage"]
            assert seen == {
                "id": child,
                "workflow": "kid",
                "status": "succeeded",
                "parent_step": "0:0",
                "parent_close": "cancel",
                "url": f"/runs/{child}",
            }
            assert body["usage"]["with_children"]["model_calls"] == 0
            body = client.get(f"/runs/{child}", headers=auth).json()
            assert (
                body["parent"],
                body["parent_step"],
                body["parent_kind"],
                body["parent_close"],
            ) == (parent, "0:0", "child", "cancel")
            schema = client.get("/openapi.json").json()["components"]["schemas"]
            assert "children" in schema["RunOut"]["properties"]
            r = client.post(
                "/ui/login",
                content=f"key={admin}",
                headers={
                    "Origin": "http://testserver",
                    "Content-Type": "application/x-www-form-urlencoded",
                },
                follow_redirects=False,
            )
            assert r.status_code in (302, 303), r.text
            page = client.get(f"/ui/runs/{parent}").text
            assert f'href="/ui/runs/{child}" class="child-run"' in page
            page = client.get(f"/ui/runs/{child}").text
            assert f'<dt>child of</dt><dd><a href="/ui/runs/{parent}" id="run-parent"' in page
            assert '<span id="run-parent-close">on parent close: cancel</span>' in page
    finally:
        app.close()
    shown = CliRunner().invoke(cli, ["show", parent, "--db", db])
    assert f"{child} kid succeeded (step 0:0, on parent close: cancel)" in shown.output
    shown = CliRunner().invoke(cli, ["show", child, "--db", db])
    assert f"child of     run {parent}, step 0:0 (on parent close: cancel)" in shown.output
    data = json.loads(CliRunner().invoke(cli, ["show", parent, "--db", db, "--json"]).stdout)
    [seen] = data["run"]["children"]
    assert seen.pop("duration_s") >= 0
    assert {k: seen.pop(k) for k in ("tokens_in", "tokens_out", "cost_usd", "model_calls")} == {
        "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0, "model_calls": 0,
    }  # fmt: skip
    assert seen == {
        "run": child, "workflow": "kid", "status": "succeeded", "step": "0:0", "close": "cancel",
    }  # fmt: skip
    assert data["run"]["usage"]["with_children"]["model_calls"] == 0


def test_an_abandoned_childs_policy_shows_and_a_fork_has_none(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'kids.db'}"
    parent, child = _family(db, on_parent_close="abandon")
    app = ms.App(db)
    try:
        fork = app.fork(child, from_step=0).run_id
        _, admin = app.store.create_api_key("ops", ["admin"], app.clock.now())
        auth = {"Authorization": f"Bearer {admin}"}
        with TestClient(create_app(app, webhooks=False)) as client:
            body = client.get(f"/runs/{parent}", headers=auth).json()
            assert [c["parent_close"] for c in body["children"]] == ["abandon"]
            assert client.get(f"/runs/{child}", headers=auth).json()["parent_close"] == "abandon"
            body = client.get(f"/runs/{fork}", headers=auth).json()
            assert (body["parent_kind"], body["parent_close"]) == ("fork", None)
            r = client.post(
                "/ui/login",
                content=f"key={admin}",
                headers={
                    "Origin": "http://testserver",
                    "Content-Type": "application/x-www-form-urlencoded",
                },
                follow_redirects=False,
            )
            assert r.status_code in (302, 303), r.text
            page = client.get(f"/ui/runs/{child}").text
            assert '<span id="run-parent-close">on parent close: abandon</span>' in page
            assert "on parent close" not in client.get(f"/ui/runs/{fork}").text
    finally:
        app.close()
    shown = CliRunner().invoke(cli, ["show", parent, "--db", db])
    assert f"{child} kid succeeded (step 0:0, on parent close: abandon)" in shown.output
    shown = CliRunner().invoke(cli, ["show", child, "--db", db])
    assert f"child of     run {parent}, step 0:0 (on parent close: abandon)" in shown.output
    shown = CliRunner().invoke(cli, ["show", fork, "--db", db])
    assert f"forked from  run {child}, step 0:0\n" in shown.output
    assert "on parent close" not in shown.output
    data = json.loads(CliRunner().invoke(cli, ["show", child, "--db", db, "--json"]).stdout)
    assert data["run"]["parent"] == {
        "run": parent,
        "step": "0:0",
        "kind": "child",
        "close": "abandon",
    }
    data = json.loads(CliRunner().invoke(cli, ["show", fork, "--db", db, "--json"]).stdout)
    assert (data["run"]["parent"]["kind"], data["run"]["parent"]["close"]) == ("fork", None)


def test_trace_export_nests_a_child_under_its_parents_step(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from mainspring.observability import export_trace

    db = f"sqlite:///{tmp_path / 'trace.db'}"
    parent, child = _family(db)
    app = ms.App(db)
    try:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        export_trace(app.observe.trace(parent), tracer_provider=provider)
        export_trace(app.observe.trace(child), tracer_provider=provider)
    finally:
        app.close()
    spans = exporter.get_finished_spans()
    assert len({s.context.trace_id for s in spans}) == 1  # one trace for the family
    starts = [s for s in spans if s.attributes.get("mainspring.step.position") == "0:0"]
    start = next(s for s in starts if s.name.endswith("child:kid"))
    child_root = next(s for s in spans if s.attributes.get("mainspring.run.id") == child)
    assert child_root.parent is not None
    assert child_root.parent.span_id == start.context.span_id


def test_show_aligns_every_child_line(tmp_path: Path) -> None:
    """Three children: each line of the value sits in the value column, not at the
    left margin."""
    db = f"sqlite:///{tmp_path / 'kids.db'}"
    app = ms.App(db)

    @app.workflow
    async def kid(ctx: ms.RunContext, n: int) -> int:
        return await ctx.step(lambda: n + 1, name="add")

    @app.workflow
    async def parent(ctx: ms.RunContext) -> list[int]:
        return [await ctx.child(kid, n, key=f"k{n}") for n in range(3)]

    try:
        run_id = app.submit(parent).run_id
        asyncio.run(app.worker().run(until_idle=True))
        children = [c.id for c in app.children(run_id)]
    finally:
        app.close()
    output = CliRunner().invoke(cli, ["show", run_id, "--db", db]).output
    facts = output.split("\n\n")[0].splitlines()  # the run's facts, before its steps
    rows = [line for line in facts if any(c in line for c in children)]
    assert len(rows) == 3 and rows[0].startswith("children (3)  "), rows
    column = rows[0].index(children[0])
    assert [row.index(c) for row, c in zip(rows, children, strict=True)] == [column] * 3, rows
