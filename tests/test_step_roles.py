"""Step roles are data: a ``ctx.step`` says what it is (``role=``), the journal keeps it
in ``ms_steps.role``, and migration 9 filled it for journals written before, from the
name prefixes that used to spell it. Readers (traces, metrics, the dashboard, the lab)
use the role; a step's identity stays its kind and name."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pg
import pytest
from _helpers import drain

import mainspring as ms
from mainspring.journal import StepCall
from mainspring.limits import RateLimit
from mainspring.models import ModelResponse, Usage
from mainspring.storage import SQLiteStore, Store, open_store
from mainspring.storage import _connection as storage_connection
from mainspring.testing import FakeClock, ScriptedModel

GOLDEN = Path(__file__).parent / "golden"
NOW = 1_767_225_600.0

# (kind, name) of rows a version-8 journal may hold, and the role migration 9 gives
# them: exactly what observability.step_role read from the name before roles were data.
LEGACY_ROWS: list[tuple[str, str, str]] = [
    ("step", "model:openai:gpt-4.1", "model"),
    ("step", "model:openai:gpt-4.1@http://user:pass@proxy/v1", "model"),
    ("step", "model:", "model"),
    ("step", "tool:send_email", "tool"),
    ("step", "rate:openai:gpt-4.1:default", "rate"),
    ("step", "rate-refund:openai:gpt-4.1:default", "rate"),
    ("step", "rate:wait:openai:gpt-4.1", "wait"),
    ("step", "rate:wait", "rate"),  # no second colon: a booking's key, not a wait
    ("step", "double", "step"),
    ("step", "Model:openai:x", "step"),  # prefixes are case-sensitive
    ("step", "models:x", "step"),
    ("step", "tool_x:y", "step"),  # "_" is no wildcard
    ("step", "rate", "step"),
    ("sleep", "sleep", "step"),  # other kinds keep the default: their kind says it
    ("signal", "tool:approve", "step"),
    ("now", "now", "step"),
]


def _insert_legacy(conn: Any, marker: str) -> None:
    """Journal rows as a version-8 mainspring wrote them (no ``role`` column)."""
    for seq, (kind, name, _) in enumerate(LEGACY_ROWS):
        conn.execute(
            "INSERT INTO ms_steps (run_id, session, seq, kind, name, status, attempt, epoch,"
            f" output, started_at, finished_at) VALUES ({', '.join([marker] * 11)})",
            ("legacy", 0, seq, kind, name, "completed", 1, 1, "1", NOW, NOW),
        )


def test_migration_fills_roles_of_a_golden_journal(tmp_path: Path) -> None:
    """The oldest golden journal (schema version 2), with model, tool and rate rows
    added as that version would have written them, opens with every role filled."""
    db = tmp_path / "journal_v2.db"
    shutil.copy(GOLDEN / "journal_v2.db", db)
    with sqlite3.connect(db) as conn:
        (version,) = conn.execute("SELECT value FROM ms_meta").fetchone()
        assert version == "2"
        _insert_legacy(conn, "?")
    store = SQLiteStore(db)
    try:
        assert [(s.kind, s.name, s.role) for s in store.load_steps("legacy")] == LEGACY_ROWS
        golden = [
            s for rid, rows in store.snapshot().steps.items() if rid != "legacy" for s in rows
        ]
        assert golden and {s.role for s in golden} == {"step"}  # plain steps, waits, values
    finally:
        store.close()


def _version_8(url: str, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A store whose database a version-8 mainspring made (migrations up to 8 only),
    holding the legacy rows; whatever migrations come later."""
    if not url.startswith("sqlite"):
        pg.reset(url)  # an empty schema: the fixture may hand over a migrated one
    with monkeypatch.context() as m:
        m.setattr(storage_connection, "LATEST", 8)
        store = open_store(url)
    with store._write() as cur:
        for seq, (kind, name, _) in enumerate(LEGACY_ROWS):
            cur.execute(
                "INSERT INTO ms_steps (run_id, session, seq, kind, name, status, attempt,"
                " epoch, output, started_at, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                ("legacy", 0, seq, kind, name, "completed", 1, 1, "1", NOW, NOW),
            )
    assert store.schema_version() == 8
    return store


def test_migration_9_fills_roles_on_every_dialect(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _version_8(db_url, monkeypatch)
    try:
        assert store.migrate() == ms.storage.SCHEMA_VERSION
        assert [(s.kind, s.name, s.role) for s in store.load_steps("legacy")] == LEGACY_ROWS
    finally:
        store.close()


class _Roles:
    """An interceptor that notes the role each step attempt declares."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def execute_step(self, call: StepCall, proceed: Callable[[], Awaitable[Any]]) -> Any:
        self.seen.append((call.info.name, call.info.role))
        return await proceed()


async def test_a_step_declares_its_role_and_interceptors_see_it(tmp_path: Path) -> None:
    seen = _Roles()
    app = ms.App(f"sqlite:///{tmp_path / 'r.db'}", interceptors=[seen])

    @app.workflow()
    async def wf(ctx: ms.RunContext) -> int:
        a: int = await ctx.step(lambda: 1, name="lookup", role="tool")
        b: int = await ctx.step(lambda: 2, name="plain")
        return a + b

    try:
        handle = app.submit(wf)
        await drain(app)
        assert await handle.result() == 3
        assert [(s.name, s.role) for s in app.observe.steps(handle.run_id)] == [
            ("lookup", "tool"),
            ("plain", "step"),
        ]
        assert seen.seen == [("lookup", "tool"), ("plain", "step")]
        assert [e.role for e in app.observe.trace(handle.run_id).entries] == ["tool", "step"]
    finally:
        app.close()


async def test_an_unknown_role_is_refused_by_name(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'r.db'}")

    @app.workflow()
    async def wf(ctx: ms.RunContext) -> int:
        return await ctx.step(lambda: 1, name="x", role="admin")  # type: ignore[arg-type]

    try:
        handle = app.submit(wf)
        await drain(app)
        with pytest.raises(
            ms.RunFailed, match=r"ConfigError: ctx.step\(role=.admin.\): unknown role"
        ):
            await handle.result()
    finally:
        app.close()


ROLE: dict[str, Any] = {"role": "step"}


async def test_role_is_not_identity_a_journal_of_another_role_replays(tmp_path: Path) -> None:
    """A row whose role differs from what the code now declares (a journal the
    migration filled, code that started declaring roles) is the same step."""
    clock = FakeClock(NOW)
    app = ms.App(f"sqlite:///{tmp_path / 'r.db'}", clock=clock, inline_wait_s=0.0)
    ran: list[int] = []

    @app.workflow()
    async def wf(ctx: ms.RunContext) -> int:
        value: int = await ctx.step(lambda: ran.append(1) or 41, name="model:x", **ROLE)
        await ctx.sleep(60)
        return value + 1

    try:
        ROLE["role"] = "step"
        handle = app.submit(wf)
        await drain(app)
        assert app.get_run(handle.run_id).status == "sleeping"
        ROLE["role"] = "model"
        clock.advance(61)
        await drain(app)
        assert await handle.result() == 42
        assert ran == [1]  # replayed from the journal, never run again
        assert app.observe.steps(handle.run_id)[0].role == "step"  # the journal keeps what it wrote
    finally:
        app.close()


async def test_the_agent_declares_model_tool_and_rate_roles(tmp_path: Path) -> None:
    clock = FakeClock(NOW)
    app = ms.App(
        f"sqlite:///{tmp_path / 'r.db'}",
        clock=clock,
        poll_interval_s=0.01,
        inline_wait_s=0.0,
        rate_limits=[RateLimit(provider="scripted", model="scripted", rpm=6000, headroom=0.0)],
    )

    @app.tool(effect="read")
    def echo(x: int) -> int:
        """Say it back."""
        return x

    usage = Usage(input_tokens=5, output_tokens=1)
    finish = ScriptedModel.call("finish", {"answer": "ok"}).tool_calls
    model = ScriptedModel(
        [
            ms.Overloaded("529 overloaded"),
            ModelResponse(tool_calls=ScriptedModel.call("echo", {"x": 1}).tool_calls, usage=usage),
            ModelResponse(tool_calls=finish, usage=usage),
        ]
    )
    agent = app.agent("roles", model=model, instructions="x", tools=[echo])
    try:
        handle = app.submit(agent, "t")
        for _ in range(20):
            await drain(app)
            run = app.get_run(handle.run_id)
            if run.status != "sleeping":
                break
            clock.advance(max(1.0, (run.wake_at or 0) - clock.now()))
        assert (await handle.result()).answer == "ok"
        roles = {(s.name.split(":")[0], s.role) for s in app.observe.steps(handle.run_id)}
        assert {("model", "model"), ("tool", "tool"), ("rate", "rate"), ("rate", "wait")} <= roles
        assert {role for prefix, role in roles if prefix not in ("model", "tool", "rate")} <= {
            "step"
        }
    finally:
        app.close()
