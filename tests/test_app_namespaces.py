"""The App's namespaces (``app.admin``, ``app.observe``, ``app.queues``,
``app.schedules``, ``app.mcp``): every old spelling still works for one release and
warns with the new one, and nothing of mainspring's own (package, docs, examples,
test apps) uses an old spelling."""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path

import pytest

import mainspring as ms
from mainspring._app._runtime import Moved
from mainspring.testing import FakeClock

ROOT = Path(__file__).resolve().parent.parent

# Every public App method of the release before the namespaces that is not a core verb
# now, with its new spelling.
OLD = {
    "create_key": "admin.create_key",
    "list_keys": "admin.list_keys",
    "get_key": "admin.get_key",
    "verify_key": "admin.verify_key",
    "revoke_key": "admin.revoke_key",
    "add_webhook": "admin.add_webhook",
    "list_webhooks": "admin.list_webhooks",
    "remove_webhook": "admin.remove_webhook",
    "trace": "observe.trace",
    "steps": "observe.steps",
    "usage": "observe.usage",
    "family": "observe.family",
    "diagnose": "observe.diagnose",
    "metrics": "observe.metrics",
    "enable_tracing": "observe.enable_tracing",
    "disable_tracing": "observe.disable_tracing",
    "queue": "queues.add",
    "schedule": "schedules.add",
    "load_schedules": "schedules.load",
    "schedule_now": "schedules.now",
    "sync_schedules": "schedules.sync",
    "tick_schedules": "schedules.tick",
    "list_schedules": "schedules.list",
    "get_schedule": "schedules.get",
    "pause_schedule": "schedules.pause",
    "resume_schedule": "schedules.resume",
    "close_mcp": "mcp.close",
}
# Old spellings that are not plain moves, and the engine's plumbing that left the API.
OTHER = {"mcp_servers", "split_tools", "child_workflow", "start_child"}

CORE = {
    "workflow", "tool", "agent", "add", "get_workflow", "replay_check", "shadow",
    "submit", "enqueue", "run", "result",
    "get_run", "list_runs", "resolve_run_id", "children", "stream", "follow_tokens",
    "signal", "requests", "answer", "cancel", "fork", "retry",
    "call_model", "worker", "engine", "close",
}  # fmt: skip
NAMESPACES = {"admin", "observe", "queues", "schedules", "mcp"}
DEPRECATED = r"^app\.\w+ is deprecated: use app\.\w+\.\w+$"


def _app(tmp_path: Path) -> ms.App:
    app = ms.App(f"sqlite:///{tmp_path / 'ns.db'}", clock=FakeClock(start=1_767_600_000.0))

    @app.workflow
    async def report(ctx: ms.RunContext, scope: str) -> str:
        return f"report of {scope}"

    return app


def test_the_app_is_its_core_verbs_and_namespaces() -> None:
    public = {
        name
        for name in vars(ms.App)
        if not name.startswith("_")
        and (callable(getattr(ms.App, name)) or isinstance(vars(ms.App)[name], Moved))
    }
    moved = {n for n, v in vars(ms.App).items() if isinstance(v, Moved)}
    assert moved == set(OLD) | {"child_workflow", "start_child"}
    assert public - moved - OTHER == CORE
    for name in NAMESPACES:
        assert isinstance(vars(ms.App)[name], property), name


@pytest.mark.parametrize(("old", "new"), sorted(OLD.items()))
def test_an_old_spelling_warns_and_is_the_new_method(old: str, new: str, tmp_path: Path) -> None:
    app = _app(tmp_path)
    namespace, method = new.split(".")
    with pytest.warns(DeprecationWarning, match=rf"app\.{old} is deprecated: use app\.{new}\b"):
        found = getattr(app, old)
    assert found == getattr(getattr(app, namespace), method)  # the same bound method
    assert inspect.signature(found) == inspect.signature(getattr(getattr(app, namespace), method))


def test_the_old_spellings_still_do_what_they_did(tmp_path: Path) -> None:
    app = _app(tmp_path)
    with pytest.warns(DeprecationWarning, match=DEPRECATED):
        key, token = app.create_key("ana", ["read"])
    assert app.admin.verify_key(token) == key
    with pytest.warns(DeprecationWarning, match=DEPRECATED):
        app.queue("reports", concurrency=1)
    assert set(app.queues.declared) == {"reports"}
    with pytest.warns(DeprecationWarning, match=DEPRECATED):
        app.schedule("nightly", "0 3 * * *", "report", "all", queue="reports")
    with pytest.warns(DeprecationWarning, match=DEPRECATED):

        @app.schedule("0 9 * * *")
        @app.workflow
        async def standup(ctx: ms.RunContext) -> str:
            return "standup"

    assert set(app.schedules.declared) == {"nightly", "standup"}
    with pytest.warns(DeprecationWarning, match=DEPRECATED):
        app.sync_schedules()
    with pytest.warns(DeprecationWarning, match=DEPRECATED):
        assert app.pause_schedule("nightly").paused
    with pytest.warns(DeprecationWarning, match=DEPRECATED):
        assert [s.name for s in app.list_schedules()] == ["nightly", "standup"]
    handle = app.submit("report", "x")
    asyncio.run(app.run("report", "y"))
    with pytest.warns(DeprecationWarning, match=DEPRECATED):
        assert app.trace(handle).run.id == handle.run_id
    app.close()


def test_the_calls_and_the_mapping_that_became_namespaces(tmp_path: Path) -> None:
    app = _app(tmp_path)
    app.queues.add("reports", concurrency=1)
    with pytest.warns(
        DeprecationWarning, match=r"app\.queues\(\) is deprecated: use app\.queues\.list\(\)"
    ):
        assert [q.name for q in app.queues()] == []  # none written before a run uses it
    app.schedules.add("nightly", "0 3 * * *", "report", "all")
    declared = app.schedules.declared["nightly"]
    mapping = r"app\.schedules as a mapping .* use app\.schedules\.declared"
    with pytest.warns(DeprecationWarning, match=mapping):
        assert app.schedules["nightly"] == declared
    with pytest.warns(DeprecationWarning, match=mapping):
        assert "nightly" in app.schedules
    with pytest.warns(DeprecationWarning, match=mapping):
        assert len(app.schedules) == 1
    with pytest.warns(DeprecationWarning, match=mapping):
        assert dict(app.schedules) == {"nightly": declared}
    with pytest.warns(DeprecationWarning, match=mapping):
        assert list(app.schedules.items()) == [("nightly", declared)]
    with pytest.warns(DeprecationWarning, match=mapping):
        assert list(app.schedules.keys()) == ["nightly"] == list(app.schedules.declared)
    with pytest.warns(DeprecationWarning, match=mapping):
        assert list(app.schedules.values()) == [declared]

    with pytest.warns(
        DeprecationWarning, match=r"app\.mcp\(\.\.\.\) is deprecated: use app\.mcp\.add"
    ):
        fs = app.mcp("fs", command=["true"])
    with pytest.warns(
        DeprecationWarning, match=r"app\.mcp_servers is deprecated: use app\.mcp\.servers"
    ):
        assert app.mcp_servers == {"fs": fs} == app.mcp.servers
    with pytest.warns(
        DeprecationWarning, match=r"app\.close_mcp is deprecated: use app\.mcp\.close"
    ):
        asyncio.run(app.close_mcp())

    lookup = app.tool(lambda order: order, name="lookup")
    with pytest.warns(DeprecationWarning, match=r"app\.split_tools is deprecated"):
        assert app.split_tools("a", [lookup, fs]) == ([lookup], (fs,))
    for plumbing in ("child_workflow", "start_child"):
        with pytest.warns(
            DeprecationWarning, match=rf"app\.{plumbing} is deprecated: .*ctx\.child"
        ):
            getattr(app, plumbing)
    app.close()


def test_a_worker_ticks_schedules_through_the_namespace(tmp_path: Path) -> None:
    """The worker reads ``app.schedules.tick`` (the WorkerHost protocol): a schedule
    that is due starts its run with no deprecated spelling on the way."""
    clock = FakeClock(start=1_767_600_000.0)  # 2026-01-05 08:00 UTC
    app = ms.App(f"sqlite:///{tmp_path / 'tick.db'}", clock=clock, poll_interval_s=0.01)

    @app.schedules.add("0 9 * * *")
    @app.workflow
    async def morning(ctx: ms.RunContext) -> str:
        return "good morning"

    async def main() -> list[ms.RunRecord]:
        worker = app.worker()
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(0.2)  # the first tick syncs the schedule
        clock.advance(3600)  # 09:00
        for _ in range(500):
            done = app.list_runs(status="succeeded")
            if done:
                break
            await asyncio.sleep(0.02)
        worker.request_stop()
        await task
        return done

    [run] = asyncio.run(main())
    assert run.workflow == "morning" and run.key is not None and run.key.startswith("schedule:")
    app.close()


# -- nothing of mainspring's own uses an old spelling -------------------------------------

_OLD_USES = [
    re.compile(r"\b\w*app\.(" + "|".join(sorted(set(OLD) | OTHER)) + r")\b", re.I),
    re.compile(r"\b\w*app\.(queues|mcp)\(", re.I),
    re.compile(r"\b\w*app\.schedules\[", re.I),
]
# The words of the OpenAPI document, which must not change (tests/golden/openapi.json).
_ALLOWED = {"mainspring/server/_schemas.py"}


def _sources() -> list[Path]:
    found = [*(ROOT / "mainspring").rglob("*.py"), ROOT / "README.md"]
    found += [*(ROOT / "docs").glob("*.md"), *(ROOT / "examples").rglob("*.py")]
    found += [*(ROOT / "tests" / "apps").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    return found


def _code(path: Path) -> list[tuple[int, str]]:
    """The lines of code: a module's, or a document's ```python blocks (its prose may
    name an old spelling to say it is old)."""
    lines = list(enumerate(path.read_text().splitlines(), 1))
    if path.suffix != ".md":
        return lines
    code, inside = [], False
    for n, line in lines:
        if line.startswith("```"):
            inside = line == "```python"
        elif inside:
            code.append((n, line))
    return code


def test_no_module_or_doc_of_mainspring_uses_an_old_spelling() -> None:
    uses = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel in _ALLOWED:
            continue
        for n, line in _code(path):
            # the deprecations themselves say the old spelling
            if any(p.search(line) for p in _OLD_USES) and "deprecat" not in line.lower():
                uses.append(f"{rel}:{n}: {line.strip()}")
    assert not uses, "old spellings (see tests/test_app_namespaces.py OLD):\n" + "\n".join(uses)


def test_the_scan_finds_an_old_spelling() -> None:
    lines = [
        "app.create_key('a', ['read'])",
        "self.app.tick_schedules()",
        "ctx.app.pause_schedule('x')",
        "t = app.trace(run_id)",
        "app.queues()",
        "tools=[app.mcp('fs', command=[...])]",
        "@app.schedule('0 3 * * *')",
        "app.schedules['nightly']",
    ]
    assert all(any(p.search(line) for p in _OLD_USES) for line in lines)
    fine = [
        "app.admin.create_key('a', ['read'])",
        "store.list_schedules()",
        "app.schedules.tick()",
        "app.observe.trace(run_id)",
        "app.mcp.add('fs', command=[...])",
    ]
    assert not any(p.search(line) for line in fine for p in _OLD_USES)
