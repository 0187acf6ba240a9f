"""Changing code under running runs (issue 17, item 4): ``ctx.patched``,
``ctx.version`` and ``ctx.deprecate_patch`` let new code replay the journals of runs
started under old code; ``App(version=)`` stamps each run with the code that submitted
it, and workers claim only the versions they accept, so old and new fleets drain side
by side."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import mainspring as ms
from mainspring.cli import cli

Flow = Callable[..., Awaitable[Any]]
CALLS: list[str] = []


def step_a() -> str:
    CALLS.append("a")
    return "a"


def step_b() -> str:
    CALLS.append("b")
    return "b"


def step_b2() -> str:
    CALLS.append("b2")
    return "b2"


def step_c() -> str:
    CALLS.append("c")
    return "c"


# Version 1 of the workflow "order": a, b, then wait for a signal, then c.
async def order_v1(ctx: ms.RunContext) -> list[Any]:
    out = [await ctx.step(step_a), await ctx.step(step_b)]
    out.append(await ctx.wait_for("go"))
    out.append(await ctx.step(step_c))
    return out


# Version 2, patched: b2 instead of b for runs that reach the change under this code.
async def order_v2(ctx: ms.RunContext) -> list[Any]:
    out = [await ctx.step(step_a)]
    if ctx.patched("b2-instead-of-b"):
        out.append(await ctx.step(step_b2))
    else:
        out.append(await ctx.step(step_b))
    out.append(await ctx.wait_for("go"))
    out.append(await ctx.step(step_c))
    return out


# Version 2 without a patch: what breaks runs in flight.
async def order_v2_unpatched(ctx: ms.RunContext) -> list[Any]:
    out = [await ctx.step(step_a), await ctx.step(step_b2)]
    out.append(await ctx.wait_for("go"))
    out.append(await ctx.step(step_c))
    return out


# Version 3: every run from before the change has finished; the old branch is gone.
async def order_v3(ctx: ms.RunContext) -> list[Any]:
    out = [await ctx.step(step_a)]
    ctx.deprecate_patch("b2-instead-of-b")
    out.append(await ctx.step(step_b2))
    out.append(await ctx.wait_for("go"))
    out.append(await ctx.step(step_c))
    return out


# Version 4: no worker runs version 2 any more; the patch call is removed.
async def order_v4(ctx: ms.RunContext) -> list[Any]:
    out = [await ctx.step(step_a), await ctx.step(step_b2)]
    out.append(await ctx.wait_for("go"))
    out.append(await ctx.step(step_c))
    return out


@pytest.fixture(autouse=True)
def _calls() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


@pytest.fixture
def apps(db_url: str) -> Iterator[Callable[..., ms.App]]:
    """Apps over one database, each with its own code for the workflow ``order``."""
    made: list[ms.App] = []

    def make(flow: Flow, version: str | None = None, **options: Any) -> ms.App:
        app = ms.App(db_url, inline_wait_s=0.2, poll_interval_s=0.01, version=version, **options)
        app.workflow(name="order")(flow)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


def rows(app: ms.App, run_id: str) -> list[tuple[int, str, str]]:
    return [(s.seq, s.kind, s.name) for s in app.observe.steps(run_id)]


def left_for_others(app: ms.App, run_id: str) -> dict[str, Any]:
    """The run a worker's code could not replay: given back, unfinished, for a worker
    whose code can (never failed); the replay error it keeps."""
    record = app.get_run(run_id)
    assert (record.status, record.wait_reason) == ("sleeping", "replay"), record
    error: dict[str, Any] = json.loads(record.error or "{}")
    assert error["refused"]["count"] == 1
    return error


async def drain(app: ms.App, **options: Any) -> ms.Worker:
    worker = app.worker(**options)
    await asyncio.wait_for(worker.run(until_idle=True), 60)
    return worker


async def test_a_run_from_before_a_patch_takes_the_old_branch(
    apps: Callable[..., ms.App],
) -> None:
    v1 = apps(order_v1)
    old = v1.submit("order", key="old")
    await drain(v1)
    assert v1.get_run(old.run_id).status == "waiting"  # suspended mid-way under v1

    v2 = apps(order_v2)
    v2.signal(old.run_id, "go", "old-go")
    new = v2.submit("order", key="new")
    v2.signal(new.run_id, "go", "new-go")
    CALLS.clear()
    await drain(v2)
    assert await v2.result(old.run_id) == ["a", "b", "old-go", "c"]
    assert await v2.result(new.run_id) == ["a", "b2", "new-go", "c"]
    # The old run replayed a and b (never re-ran them) and only ran c; the new run ran
    # its branch.
    assert sorted(CALLS) == sorted(["c", "a", "b2", "c"])
    assert [k for _, k, _ in rows(v2, old.run_id)] == ["step", "step", "signal", "step"]
    assert rows(v2, new.run_id)[1] == (1, "patch", "b2-instead-of-b")
    # Replaying the new run again (a fresh replay, no worker memory) takes b2 again.
    assert [s.kind for s in v2.observe.steps(new.run_id)].count("patch") == 1


async def test_a_change_without_a_patch_is_still_nondeterminism(
    apps: Callable[..., ms.App],
) -> None:
    v1 = apps(order_v1)
    old = v1.submit("order", key="old")
    await drain(v1)
    v2 = apps(order_v2_unpatched)
    v2.signal(old.run_id, "go", 1)
    await drain(v2)
    # v2 cannot replay it: it is left (never failed) for a worker whose code can.
    error = left_for_others(v2, old.run_id)
    assert error["type"] == "mainspring._errors.NondeterminismError"
    assert "step_b" in error["message"]
    [finding] = [f for f in v2.observe.diagnose(old.run_id).findings if f.kind == "nondeterminism"]
    assert any("ctx.patched" in step for step in finding.next_steps)
    assert any("not failed" in step for step in finding.next_steps)
    await drain(v1)  # the old code is still deployed: it finishes the run
    assert await v1.result(old.run_id) == ["a", "b", 1, "c"]


async def test_deprecate_then_remove_the_patch(apps: Callable[..., ms.App]) -> None:
    v1 = apps(order_v1)
    before = v1.submit("order", key="before")
    await drain(v1)
    v2 = apps(order_v2)
    patched = v2.submit("order", key="patched")
    await drain(v2)
    assert v2.get_run(patched.run_id).status == "waiting"

    # v3 deprecates the patch: a run with the marker goes on; one from before fails.
    v3 = apps(order_v3)
    deprecated = v3.submit("order", key="deprecated")
    await drain(v3)
    assert rows(v3, deprecated.run_id)[1] == (1, "patch", "b2-instead-of-b")  # kept
    v3.signal(before.run_id, "go", 0)
    await drain(v3)
    assert "deprecate_patch" in left_for_others(v3, before.run_id)["message"]

    # v4 removed the call: the markers of v2's and v3's runs are passed over.
    v4 = apps(order_v4)
    for handle in (patched, deprecated):
        v4.signal(handle.run_id, "go", handle.run_id[:4])
    fresh = v4.submit("order", key="fresh")
    v4.signal(fresh.run_id, "go", "f")
    await drain(v4)
    for handle in (patched, deprecated):
        assert await v4.result(handle.run_id) == ["a", "b2", handle.run_id[:4], "c"]
    assert await v4.result(fresh.run_id) == ["a", "b2", "f", "c"]
    assert "patch" not in [k for _, k, _ in rows(v4, fresh.run_id)]
    # The run from before the change waited for code that still has its branch.
    await drain(v2)
    assert await v2.result(before.run_id) == ["a", "b", 0, "c"]


async def test_version_counts_changes_and_refuses_dropped_ones(
    apps: Callable[..., ms.App],
) -> None:
    async def one(ctx: ms.RunContext) -> list[Any]:
        out: list[Any] = [await ctx.step(step_a)]
        out.append(await ctx.wait_for("go"))
        return out

    def versioned(lowest: int, highest: int) -> Flow:
        async def flow(ctx: ms.RunContext) -> list[Any]:
            out: list[Any] = [await ctx.step(step_a)]
            v = ctx.version("greeting", lowest, highest)
            out.append(v)
            out.append(await ctx.wait_for("go"))
            return out

        return flow

    v0 = apps(one)
    zero = v0.submit("order", key="zero")
    await drain(v0)
    v1 = apps(versioned(0, 1))
    first = v1.submit("order", key="first")
    await drain(v1)
    v2 = apps(versioned(0, 2))
    second = v2.submit("order", key="second")
    await drain(v2)
    for handle in (zero, first, second):
        v2.signal(handle.run_id, "go", "x")
    await drain(v2)
    assert await v2.result(zero.run_id) == ["a", 0, "x"]  # from before: version 0
    assert "patch" not in [k for _, k, _ in rows(v2, zero.run_id)]  # and no marker added
    assert await v2.result(first.run_id) == ["a", 1, "x"]
    assert await v2.result(second.run_id) == ["a", 2, "x"]

    # Code that supports versions 1 and 2 only: a run on version 0 cannot replay.
    late = v0.submit("order", key="late")
    await drain(v0)
    v3 = apps(versioned(1, 2))
    v3.signal(late.run_id, "go", 1)
    await drain(v3)
    assert "version 0" in left_for_others(v3, late.run_id)["message"]
    await drain(v2)  # code that still supports version 0
    assert await v2.result(late.run_id) == ["a", 0, 1]


async def test_two_patches_in_a_row_and_a_patch_added_before_another(
    apps: Callable[..., ms.App],
) -> None:
    async def with_b(ctx: ms.RunContext) -> list[Any]:
        flags = [ctx.patched("b")]
        flags.append(await ctx.wait_for("go"))
        return flags

    async def with_a_and_b(ctx: ms.RunContext) -> list[Any]:
        flags = [ctx.patched("a"), ctx.patched("b")]
        flags.append(await ctx.wait_for("go"))
        return flags

    old = apps(with_b)
    run = old.submit("order", key="one")
    await drain(old)
    new = apps(with_a_and_b)
    fresh = new.submit("order", key="two")
    new.signal(run.run_id, "go", 1)
    new.signal(fresh.run_id, "go", 2)
    await drain(new)
    # The run from before "a" has "b"'s marker where "a" is asked: "a" is False and
    # consumes nothing, so "b" still finds its marker.
    assert await new.result(run.run_id) == [False, True, 1]
    assert await new.result(fresh.run_id) == [True, True, 2]


async def test_a_patch_past_the_journal_is_taken_by_a_run_in_flight(
    apps: Callable[..., ms.App],
) -> None:
    """A change after the point a run from before it reached: that run takes it too
    (nothing was journaled there), as Temporal's ``patched`` does."""
    v1 = apps(order_v1)
    old = v1.submit("order", key="old")
    await drain(v1)

    async def later(ctx: ms.RunContext) -> list[Any]:
        out = [await ctx.step(step_a), await ctx.step(step_b)]
        out.append(await ctx.wait_for("go"))
        out.append(ctx.patched("after-the-wait"))
        return out

    v2 = apps(later)
    v2.signal(old.run_id, "go", 1)
    await drain(v2)
    assert await v2.result(old.run_id) == ["a", "b", 1, True]


@pytest.mark.parametrize("sticky", [True, False])
async def test_sticky_and_replay_give_the_same_run(
    apps: Callable[..., ms.App], sticky: bool
) -> None:
    async def flow(ctx: ms.RunContext) -> list[Any]:
        out: list[Any] = [ctx.patched("before"), await ctx.step(step_a)]
        out.append(await ctx.wait_for("go"))
        out.append(ctx.patched("after"))
        out.append(ctx.version("counted", 0, 3))
        out.append(await ctx.step(step_c))
        return out

    app = apps(flow)
    worker = app.worker(sticky=sticky)
    task = asyncio.create_task(worker.run())
    try:
        run = app.submit("order", key="k")
        for _ in range(3000):
            if app.get_run(run.run_id).status == "waiting":
                break
            await asyncio.sleep(0.01)
        app.signal(run.run_id, "go", "g")
        result = await app.result(run.run_id, timeout=60)
    finally:
        worker.request_stop()
        await task
    assert result == [True, "a", "g", True, 3, "c"]
    assert worker.stats.resumed == (1 if sticky else 0)
    assert [(k, n) for _, k, n in rows(app, run.run_id)] == [
        ("patch", "before"),
        ("step", "step_a"),
        ("signal", "go"),
        ("patch", "after"),
        ("patch", "counted"),
        ("step", "step_c"),
    ]


async def test_bad_change_ids_and_versions_are_refused(apps: Callable[..., ms.App]) -> None:
    seen: list[str] = []

    async def flow(ctx: ms.RunContext, which: str) -> None:
        try:
            if which == "id":
                ctx.patched("")
            elif which == "range":
                ctx.version("x", 2, 1)
            else:
                ctx.version("x", 0, 0)
        except ms.ConfigError as exc:
            seen.append(str(exc))

    app = apps(flow)
    for which in ("id", "range", "zero"):
        app.submit("order", which)
    await drain(app)
    assert len(seen) == 3
    assert "non-empty string" in seen[0]
    assert "min_supported <= max_supported" in seen[1]


# -- code versions of runs and workers -------------------------------------------------


async def hello(ctx: ms.RunContext, n: int) -> int:
    return n


def test_an_app_stamps_its_version_on_every_run(apps: Callable[..., ms.App]) -> None:
    plain = apps(hello)
    v1 = apps(hello, version="2026.12.1")
    a = plain.submit("order", 1)
    b = v1.submit("order", 2)
    assert plain.get_run(a.run_id).version is None
    assert v1.get_run(b.run_id).version == "2026.12.1"
    assert [r.id for r in v1.list_runs(versions=["2026.12.1"])] == [b.run_id]
    assert [r.id for r in v1.list_runs(versions=[None])] == [a.run_id]
    assert {r.id for r in v1.list_runs(versions=["2026.12.1", None])} == {a.run_id, b.run_id}
    assert v1.list_runs(versions=[]) == []


@pytest.mark.parametrize("bad", ["", " v1", "any", "None", 3])
def test_a_version_that_cannot_name_code_is_refused(bad: Any) -> None:
    with pytest.raises(ms.ConfigError, match="version"):
        ms.App("sqlite:///:memory:", version=bad)


async def test_workers_claim_only_the_versions_they_accept(
    apps: Callable[..., ms.App],
) -> None:
    v1 = apps(hello, version="v1")
    v2 = apps(hello, version="v2")
    plain = apps(hello)
    r1 = [v1.submit("order", i).run_id for i in range(3)]
    r2 = [v2.submit("order", i).run_id for i in range(3)]
    r0 = plain.submit("order", 9).run_id

    # A v2-only worker never touches v1's runs (nor unversioned ones).
    only = await drain(v2, versions=["v2"])
    assert only.stats.claimed == 3
    assert all(v2.get_run(r).status == "succeeded" for r in r2)
    assert all(v2.get_run(r).status == "queued" for r in [*r1, r0])
    # A v1 worker by default: its own version and runs with no version.
    w1 = await drain(v1)
    assert w1.versions == ("v1", None) and w1.stats.claimed == 4
    assert all(v1.get_run(r).status == "succeeded" for r in [*r1, r0])


async def test_a_mixed_fleet_drains_everything(apps: Callable[..., ms.App]) -> None:
    v1 = apps(hello, version="v1")
    v2 = apps(hello, version="v2")
    ids = {v1.submit("order", i).run_id: "v1" for i in range(6)}
    ids |= {v2.submit("order", i).run_id: "v2" for i in range(6)}
    w1, w2 = v1.worker(versions=["v1"]), v2.worker(versions=["v2"])
    await asyncio.wait_for(asyncio.gather(w1.run(until_idle=True), w2.run(until_idle=True)), 60)
    assert all(v1.get_run(r).status == "succeeded" for r in ids)
    assert w1.stats.claimed == 6 and w2.stats.claimed == 6
    # Who ran what: each run's lease owner was a worker of its own version.
    for run_id, version in ids.items():
        owner = v1.get_run(run_id).owner
        assert owner is None or owner == (w1 if version == "v1" else w2).worker_id


def test_a_claim_by_id_checks_the_version(apps: Callable[..., ms.App]) -> None:
    v2 = apps(hello, version="v2")
    run_id = v2.submit("order", 1).run_id
    store = v2.store
    claim = dict(
        worker="w", now=v2.clock.now(), lease_s=30.0, limit=1, workflows=["order"],
        max_recoveries=5, run_id=run_id,
    )  # fmt: skip
    assert store.claim(**claim, versions=["v1", None]) == []  # type: ignore[arg-type]
    assert store.claim(**claim, versions=[]) == []  # type: ignore[arg-type]
    [got] = store.claim(**claim, versions=["v2"])  # type: ignore[arg-type]
    assert got.id == run_id and got.version == "v2"


def test_worker_versions_are_checked(apps: Callable[..., ms.App]) -> None:
    v1 = apps(hello, version="v1")
    assert v1.worker(versions="any").versions is None
    assert v1.worker(versions=["v1", "v1", None]).versions == ("v1", None)
    assert apps(hello).worker().versions is None  # no declared version: every run
    with pytest.raises(ms.ConfigError, match="list of versions"):
        v1.worker(versions="v1")  # type: ignore[arg-type]


async def test_app_run_executes_its_run_whatever_its_version(
    apps: Callable[..., ms.App],
) -> None:
    """``app.run`` asks for one run: it executes it even if another version submitted it."""
    v1 = apps(hello, version="v1")
    handle = v1.submit("order", 5, key="k")
    v2 = apps(hello, version="v2")
    assert await v2.run("order", 5, key="k") == 5
    assert v2.get_run(handle.run_id).version == "v1"


# -- the command line ------------------------------------------------------------------

APP_SOURCE = """
import mainspring as ms

async def hello(ctx: ms.RunContext, n: int) -> int:
    return n

def make(version):
    app = ms.App(URL, version=version, poll_interval_s=0.01)
    app.workflow(name="order")(hello)
    return app

v1 = make("v1")
v2 = make("v2")
"""


@pytest.fixture
def cli_app(db_url: str, tmp_path: Path) -> Iterator[str]:
    module = f"versions_app_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{module}.py").write_text(f"URL = {db_url!r}\n" + APP_SOURCE)
    sys.path.insert(0, str(tmp_path))
    yield module
    sys.path.remove(str(tmp_path))
    sys.modules.pop(module, None)


def test_the_cli_filters_runs_and_workers_by_version(cli_app: str, db_url: str) -> None:
    runner = CliRunner()

    def invoke(*args: str) -> Any:
        sys.modules.pop(cli_app, None)  # each command loads (and closes) its own App
        return runner.invoke(cli, list(args))

    apps = {v: ms.App(db_url, version=v) for v in ("v1", "v2")}
    for app in apps.values():
        app.workflow(name="order")(hello)
    a = apps["v1"].submit("order", 1).run_id
    b = apps["v2"].submit("order", 2).run_id
    look = apps["v1"]

    done = invoke("runs", "--app", f"{cli_app}:v1", "--version", "v2", "--json")
    assert done.exit_code == 0, done.output
    [row] = json.loads(done.output)["runs"]
    assert row["id"] == b and row["version"] == "v2"
    table = invoke("runs", "--app", f"{cli_app}:v1", "--version", "none")
    assert table.exit_code == 0 and "no runs match" in table.output, table.output
    table = invoke("runs", "--app", f"{cli_app}:v1")
    assert "version" in table.output and "v1" in table.output, table.output
    shown = invoke("show", a, "--app", f"{cli_app}:v1")
    assert shown.exit_code == 0 and "v1" in shown.output, shown.output

    # A worker of v1's code told to accept v2 only runs b, without stickiness.
    done = invoke(
        "worker", f"{cli_app}:v1", "--accept-version", "v2", "--until-idle", "--no-sticky"
    )
    assert done.exit_code == 0, done.output
    assert look.get_run(b).status == "succeeded"
    assert look.get_run(a).status == "queued"
    bad = invoke("worker", f"{cli_app}:v1", "--accept-version", "any", "--accept-version", "v1")
    assert bad.exit_code != 0 and "alone" in bad.output
    done = invoke("worker", f"{cli_app}:v1", "--until-idle")
    assert done.exit_code == 0, done.output
    assert look.get_run(a).status == "succeeded"
    for app in apps.values():
        app.close()


def test_the_http_api_shows_and_filters_versions(apps: Callable[..., ms.App]) -> None:
    from fastapi.testclient import TestClient

    from mainspring.server import create_app

    v1 = apps(hello, version="v1")
    v2 = apps(hello, version="v2")
    a = v1.submit("order", 1).run_id
    b = v2.submit("order", 2).run_id
    _, token = v1.admin.create_key("reader", ["read"])
    with TestClient(create_app(v1, webhooks=False)) as client:
        auth = {"Authorization": f"Bearer {token}"}
        assert client.get(f"/runs/{a}", headers=auth).json()["version"] == "v1"
        listed = client.get("/runs", params={"version": "v2"}, headers=auth).json()["runs"]
        assert [(r["id"], r["version"]) for r in listed] == [(b, "v2")]
        assert {r["id"] for r in client.get("/runs", headers=auth).json()["runs"]} == {a, b}
        r = client.post(
            "/ui/login",
            content=f"key={token}",
            headers={
                "Origin": "http://testserver",
                "Content-Type": "application/x-www-form-urlencoded",
            },
            follow_redirects=False,
        )
        assert r.status_code in (302, 303), r.text
        assert '<code id="run-version">v1</code>' in client.get(f"/ui/runs/{a}").text


async def test_a_fork_keeps_its_source_runs_version(apps: Callable[..., ms.App]) -> None:
    v1 = apps(order_v1, version="v1")
    run = v1.submit("order")
    await drain(v1)
    v2 = apps(order_v2, version="v2")
    fork = v2.fork(run.run_id, from_step=1).run_id
    assert v2.get_run(fork).version == "v1"  # its journal is v1's: v1's workers take it


async def test_a_question_keeps_its_id_when_a_patch_before_it_is_removed(
    apps: Callable[..., ms.App],
) -> None:
    async def with_patch(ctx: ms.RunContext) -> str:
        ctx.patched("p")
        return await ctx.ask("which?")

    async def without(ctx: ms.RunContext) -> str:
        return await ctx.ask("which?")

    old = apps(with_patch)
    run = old.submit("order")
    await drain(old)
    [asked] = old.requests(run.run_id)
    assert asked.id == "question:0.1"  # its position, after the marker
    new = apps(without)
    new.answer(run.run_id, asked.id, answer="this one")
    await drain(new)
    assert await new.result(run.run_id) == "this one"
