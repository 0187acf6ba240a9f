"""The replay gate: ``app.replay_check()`` replays every unfinished run's journal
against the code about to be deployed and says which runs it can carry on, writing
nothing, on both stores.

Each scenario is a real deploy: runs started under one version of the code wait in the
database (for a signal, or asleep), and a second App over the same database, holding
the changed code, checks them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from _helpers import drain

import mainspring as ms

Flow = Callable[..., Awaitable[Any]]


def a(x: int) -> int:
    return x + 1


def b(x: int) -> int:
    return x * 2


def c(x: int) -> int:
    return x - 3


def x_step(x: int) -> int:
    return x


@pytest.fixture
def apps(db_url: str) -> Iterator[Callable[..., ms.App]]:
    made: list[ms.App] = []

    def make(**options: Any) -> ms.App:
        app = ms.App(db_url, poll_interval_s=0.02, inline_wait_s=0.0, **options)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


async def _started(old: ms.App, flow: Flow, inputs: list[int]) -> list[str]:
    """Runs of ``flow`` under the old code, left waiting for the signal "go"."""
    ids = [old.submit(flow, i).run_id for i in inputs]
    await drain(old)
    for run_id in ids:
        assert old.get_run(run_id).status == "waiting", old.get_run(run_id)
    return ids


async def _v1(ctx: ms.RunContext, n: int) -> int:
    n = await ctx.step(a, n)
    n = await ctx.step(b, n)
    await ctx.wait_for("go")
    return await ctx.step(c, n)


def _snapshot(app: ms.App) -> str:
    """A digest of every run and journal row: what a write would change."""
    rows: list[Any] = []
    with app.store._read() as cur:
        for table, order in (("ms_runs", "id"), ("ms_steps", "run_id, session, seq")):
            cur.execute(f"SELECT * FROM {table} ORDER BY {order}")
            rows.extend(tuple(map(str, r)) for r in cur.fetchall())
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


async def test_unchanged_code_replays_every_waiting_run_cleanly_and_writes_nothing(
    apps: Callable[..., ms.App],
) -> None:
    old = apps()
    old.workflow(name="pipeline")(_v1)
    ids = await _started(old, "pipeline", [1, 2, 3])  # type: ignore[arg-type]
    before = _snapshot(old)

    new = apps()
    new.workflow(name="pipeline")(_v1)
    report = await new.replay_check()

    assert report.ok and sorted(r.run_id for r in report.runs) == sorted(ids)
    for r in report.runs:
        assert (r.verdict, r.journaled, r.reached, r.then) == ("clean", 3, 2, "wait")
    assert report.summary() == [{"workflow": "pipeline", "version": None, "runs": 3, "clean": 3}]
    assert _snapshot(old) == before  # not a row, not a lease, not a status moved

    # And the runs go on under the new code as the check said they would.
    for run_id in ids:
        new.signal(run_id, "go")
    await drain(new)
    assert [new.get_run(i).status for i in ids] == ["succeeded"] * 3


@pytest.mark.parametrize(
    ("change", "position", "expected", "got"),
    [
        ("inserted", 1, ("step", "b"), ("step", "x_step")),
        ("renamed", 1, ("step", "b"), ("step", "b_renamed")),
        ("removed", 1, ("step", "b"), ("signal", "go")),
    ],
)
async def test_a_changed_step_order_diverges_where_it_changed(
    apps: Callable[..., ms.App],
    change: str,
    position: int,
    expected: tuple[str, str],
    got: tuple[str, str],
) -> None:
    old = apps()
    old.workflow(name="pipeline")(_v1)
    [run_id] = await _started(old, "pipeline", [5])  # type: ignore[arg-type]

    async def v2(ctx: ms.RunContext, n: int) -> int:
        n = await ctx.step(a, n)
        if change == "inserted":
            n = await ctx.step(x_step, n)
        if change != "removed":
            n = await ctx.step(b, n, name="b_renamed" if change == "renamed" else None)
        await ctx.wait_for("go")
        return await ctx.step(c, n)

    new = apps()
    new.workflow(name="pipeline")(v2)
    report = await new.replay_check()

    assert not report.ok
    [r] = report.failed
    assert (r.run_id, r.verdict, r.position, r.expected, r.got) == (
        run_id, "diverged", position, expected, got,
    )  # fmt: skip
    assert "ctx.patched" in (r.hint or "")
    assert f"position {position}" in r.message
    # The check wrote nothing: the old code still carries the run to its end.
    old.signal(run_id, "go")
    await drain(old)
    assert old.get_run(run_id).status == "succeeded"


async def test_a_change_behind_ctx_patched_replays_the_old_runs_cleanly(
    apps: Callable[..., ms.App],
) -> None:
    old = apps()
    old.workflow(name="pipeline")(_v1)
    [before_patch] = await _started(old, "pipeline", [5])  # type: ignore[arg-type]

    async def patched(ctx: ms.RunContext, n: int) -> int:
        n = await ctx.step(a, n)
        if ctx.patched("add-x"):
            n = await ctx.step(x_step, n)
        n = await ctx.step(b, n)
        await ctx.wait_for("go")
        return await ctx.step(c, n)

    mid = apps()
    mid.workflow(name="pipeline")(patched)
    assert (await mid.replay_check()).ok
    # A run started under the patched code takes the change (its marker is journaled).
    [after_patch] = await _started(mid, "pipeline", [6])  # type: ignore[arg-type]
    assert (await mid.replay_check()).ok

    # The patch removed (the new code alone): the run that took it replays cleanly;
    # the one from before the change no longer can, and the check says so.
    async def removed(ctx: ms.RunContext, n: int) -> int:
        n = await ctx.step(a, n)
        n = await ctx.step(x_step, n)
        n = await ctx.step(b, n)
        await ctx.wait_for("go")
        return await ctx.step(c, n)

    new = apps()
    new.workflow(name="pipeline")(removed)
    report = await new.replay_check()
    verdicts = {r.run_id: r.verdict for r in report.runs}
    assert verdicts == {before_patch: "diverged", after_patch: "clean"}

    # ctx.deprecate_patch: the old path refused in so many words.
    async def deprecated(ctx: ms.RunContext, n: int) -> int:
        n = await ctx.step(a, n)
        ctx.deprecate_patch("add-x")
        n = await ctx.step(x_step, n)
        n = await ctx.step(b, n)
        await ctx.wait_for("go")
        return await ctx.step(c, n)

    last = apps()
    last.workflow(name="pipeline")(deprecated)
    [r] = (await last.replay_check()).failed
    assert (r.run_id, r.got) == (before_patch, ("patch", "add-x"))
    assert "still in flight" in (r.hint or "")


async def test_a_new_version_draining_beside_the_old_checks_only_its_own_runs(
    apps: Callable[..., ms.App],
) -> None:
    """Runs of version 1 drain under version 1's workers; version 2's check is about the
    runs version 2's workers will claim (its own and unversioned ones), unless asked."""
    old = apps(version="1")
    old.workflow(name="pipeline")(_v1)
    [v1_run] = await _started(old, "pipeline", [5])  # type: ignore[arg-type]

    async def v2(ctx: ms.RunContext, n: int) -> int:
        n = await ctx.step(x_step, n)
        await ctx.wait_for("go")
        return n

    new = apps(version="2")
    new.workflow(name="pipeline")(v2)
    [v2_run] = await _started(new, "pipeline", [7])  # type: ignore[arg-type]
    report = await new.replay_check()
    assert report.ok and [r.run_id for r in report.runs] == [v2_run]
    every = await new.replay_check(versions="any")
    assert {r.run_id: r.verdict for r in every.runs} == {v1_run: "diverged", v2_run: "clean"}
    assert every.summary() == [
        {"workflow": "pipeline", "version": "1", "runs": 1, "diverged": 1},
        {"workflow": "pipeline", "version": "2", "runs": 1, "clean": 1},
    ]


async def test_a_missing_workflow_and_an_input_that_no_longer_fits_are_named(
    apps: Callable[..., ms.App],
) -> None:
    old = apps()
    old.workflow(name="pipeline")(_v1)
    old.workflow(name="gone")(_v1)
    [kept] = await _started(old, "pipeline", [5])  # type: ignore[arg-type]
    [gone] = await _started(old, "gone", [6])  # type: ignore[arg-type]

    async def needs_more(ctx: ms.RunContext, n: int, m: int) -> int:
        return n + m

    new = apps()
    new.workflow(name="pipeline")(needs_more)
    report = await new.replay_check()
    by_id = {r.run_id: r for r in report.runs}
    assert by_id[gone].verdict == "unknown workflow" and "'gone'" in by_id[gone].message
    assert by_id[kept].verdict == "bad input" and by_id[kept].got is not None


async def test_a_run_mid_step_and_an_asleep_run_replay_to_their_next_write(
    apps: Callable[..., ms.App],
) -> None:
    """A run asleep replays to its sleep; a chosen run is checked whatever its status;
    a finished run replays to its end (``then: finish``)."""
    app = apps()

    @app.workflow(name="nap")
    async def nap(ctx: ms.RunContext, n: int) -> int:
        n = await ctx.step(a, n)
        await ctx.sleep(3600)
        return await ctx.step(b, n)

    @app.workflow(name="quick")
    async def quick(ctx: ms.RunContext, n: int) -> int:
        return await ctx.step(a, n)

    asleep = app.submit(nap, 1).run_id
    done = app.submit(quick, 1).run_id
    await drain(app)
    assert app.get_run(asleep).status == "sleeping"
    report = await app.replay_check()
    assert [(r.run_id, r.verdict, r.then) for r in report.runs] == [(asleep, "clean", "wait")]
    [r] = (await app.replay_check([done])).runs
    assert (r.verdict, r.then, r.status) == ("clean", "finish", "succeeded")
    # A run asked for that is not there is named: a gate that checked nothing says no.
    report = await app.replay_check(iter([done, "no-such-run"]))
    assert not report.ok
    assert [(r.run_id, r.verdict) for r in report.runs] == [
        (done, "clean"), ("no-such-run", "error"),
    ]  # fmt: skip


async def test_the_check_reads_another_database_read_only(
    apps: Callable[..., ms.App], db_url: str, tmp_path: Any
) -> None:
    """``database=`` points the check at production's database from a CI job whose App
    has a database of its own; on PostgreSQL the session is read-only."""
    prod = apps()
    prod.workflow(name="pipeline")(_v1)
    [run_id] = await _started(prod, "pipeline", [5])  # type: ignore[arg-type]
    before = _snapshot(prod)

    ci = ms.App(f"sqlite:///{tmp_path / 'ci.db'}")
    try:
        ci.workflow(name="pipeline")(_v1)
        report = await ci.replay_check(database=db_url)
        assert [(r.run_id, r.verdict) for r in report.runs] == [(run_id, "clean")]
    finally:
        ci.close()
    assert _snapshot(prod) == before


async def test_an_agent_waiting_for_a_human_replays_cleanly_under_a_new_prompt(
    apps: Callable[..., ms.App],
) -> None:
    """An agent's model replies are journaled: a new prompt does not change what the
    run already did (the shadow lab is where a new prompt is tried on old runs); a
    tool the code no longer has does."""
    from mainspring.testing import ScriptedModel

    def script() -> ScriptedModel:
        return ScriptedModel(
            [
                ScriptedModel.call("lookup", {"q": "acct"}, id="t1"),
                ScriptedModel.call("ask_human", {"question": "Which account?"}, id="q1"),
                ScriptedModel.call("finish", {"answer": "done"}),
            ]
        )

    def lookup(q: str) -> str:
        return f"found {q}"

    old = apps()
    old.agent(
        "closer", model=script(), instructions="Close.", tools=[old.tool(lookup)], ask_human=True
    )
    run_id = old.submit("closer", "close the duplicate").run_id
    await drain(old)
    assert old.get_run(run_id).status == "waiting"

    new = apps()
    new.agent("closer", model=script(), instructions="Close, politely.", tools=[new.tool(lookup)],
              ask_human=True)  # fmt: skip
    [r] = (await new.replay_check()).runs
    assert (r.verdict, r.then) == ("clean", "wait")

    def search(q: str) -> str:
        return f"found {q}"

    renamed = apps()
    renamed.agent("closer", model=script(), instructions="Close.", tools=[renamed.tool(search)],
                  ask_human=True)  # fmt: skip
    [r] = (await renamed.replay_check()).runs
    assert r.verdict == "diverged", r


_CLI_APP = """
import os
import mainspring as ms

app = ms.App(os.environ["CHECK_DB"])


def a(x: int) -> int:
    return x + 1


def x_step(x: int) -> int:
    return x


@app.workflow(name="pipeline")
async def pipeline(ctx: ms.RunContext, n: int) -> int:
    n = await ctx.step(a, n)
    if os.environ.get("CHECK_CHANGED"):
        n = await ctx.step(x_step, n)
    await ctx.wait_for("go")
    return n
"""


def test_the_command_exits_non_zero_on_a_divergence_and_prints_json(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, db_url: str
) -> None:
    import asyncio

    from typer.testing import CliRunner

    from mainspring.cli import cli

    (tmp_path / "check_app.py").write_text(_CLI_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CHECK_DB", f"sqlite:///{tmp_path / 'own.db'}")  # the CI job's own
    prod = ms.App(db_url, poll_interval_s=0.02)
    try:
        prod.workflow(name="pipeline")(_v1)
        [run_id] = asyncio.run(_started(prod, "pipeline", [5]))  # type: ignore[arg-type]
    finally:
        prod.close()

    runner = CliRunner()
    table = runner.invoke(cli, ["replay-check", "check_app:app", "--db", db_url])
    assert table.exit_code == 1, table.output  # _v1 has step b there; this code does not
    assert "diverged" in table.output and "position 1" in table.output
    assert "0 of 1 runs replay cleanly" in table.output
    none = runner.invoke(
        cli, ["replay-check", "check_app:app", "--db", db_url, "--workflow", "other"]
    )
    assert none.exit_code == 0 and "no unfinished runs to check" in none.output

    done = runner.invoke(cli, ["replay-check", "check_app:app", "--db", db_url, "--json"])
    report = json.loads(done.stdout)
    assert done.exit_code == 1 and report["ok"] is False and report["checked"] == 1
    [run] = report["runs"]
    assert (run["run_id"], run["verdict"], run["expected"], run["got"]) == (
        run_id, "diverged", ["step", "b"], ["signal", "go"],
    )  # fmt: skip

    bad = runner.invoke(cli, ["replay-check", "check_app:app", "--accept-version", ""])
    assert bad.exit_code == 2 and "cannot be empty" in bad.output


def test_a_read_only_store_refuses_every_write(db_url: str) -> None:
    """What ``database=`` opens: on PostgreSQL the server refuses a write (the session
    is read-only), so a bug in the check could not change production's database."""
    if not db_url.startswith("postgres"):
        pytest.skip("SQLite has no read-only session; the check's refused commits stand")
    from mainspring.storage import open_read_only, open_store

    open_store(db_url).close()  # migrated, as production's is
    store = open_read_only(db_url)
    try:
        assert store.list_runs() == []
        with pytest.raises(Exception, match="read-only"):
            store.create_run(run_id="r", workflow="wf", input="[]", key=None, now=1.0)
    finally:
        store.close()


async def test_the_http_api_runs_the_check_for_an_admin_key(
    apps: Callable[..., ms.App],
) -> None:
    """``POST /replay-check``: what the dashboard's runs list calls; admin scope (a
    fleet's replay is work), its answer the report's JSON."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mainspring.server import create_app

    old = apps()
    old.workflow(name="pipeline")(_v1)
    [run_id] = await _started(old, "pipeline", [5])  # type: ignore[arg-type]

    async def v2(ctx: ms.RunContext, n: int) -> int:
        n = await ctx.step(a, n)
        await ctx.wait_for("go")
        return n

    new = apps()
    new.workflow(name="pipeline")(v2)
    _, admin = new.store.create_api_key("ops", ["admin"], new.clock.now())
    _, reader = new.store.create_api_key("eyes", ["read"], new.clock.now())
    with TestClient(create_app(new, webhooks=False)) as c:
        refused = c.post("/replay-check", json={}, headers={"Authorization": f"Bearer {reader}"})
        assert refused.status_code == 403
        got = c.post("/replay-check", json={}, headers={"Authorization": f"Bearer {admin}"})
        assert got.status_code == 200, got.text
        body = got.json()
        assert (body["ok"], body["checked"], body["diverged"]) == (False, 1, 1)
        [run] = body["runs"]
        assert (run["run_id"], run["position"], run["expected"], run["got"]) == (
            run_id, 1, ["step", "b"], ["signal", "go"],
        )  # fmt: skip
        bad = c.post(
            "/replay-check", json={"versions": 3}, headers={"Authorization": f"Bearer {admin}"}
        )
        assert bad.status_code == 422 and "versions" in bad.text
