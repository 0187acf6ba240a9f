"""Return annotations of steps and tools: every one pydantic supports revives a journaled
result on Python 3.11 (stdlib ``typing.TypedDict`` included, which pydantic itself refuses
before 3.12), and a result that cannot be journaled fails its step, not the run after it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
import typing
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import pytest
import typing_extensions
from pydantic import Field

import mainspring as ms
from mainspring.lab import preflight
from mainspring.testing import ScriptedModel


class Row(typing.TypedDict):
    id: int
    name: str


class Partial(typing.TypedDict, total=False):
    id: typing.Required[int]
    note: str


class Nested(typing.TypedDict):
    row: Row
    rows: list[Row]
    maybe: Row | None


class ExtRow(typing_extensions.TypedDict):
    id: int
    tags: typing_extensions.NotRequired[list[str]]


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Model(pydantic.BaseModel):
    id: int
    when: dt.datetime


class Color(enum.Enum):
    RED = "red"


class Opaque:  # not a type pydantic can build a schema for
    pass


WHEN = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
ID = uuid.UUID(int=7)

# (annotation, the value a step returns, what the workflow sees live and on replay)
CASES: list[tuple[str, Any, Any]] = [
    ("typing.TypedDict", Row, {"id": 1, "name": "a"}),
    ("typing.TypedDict total=False + Required", Partial, {"id": 1}),
    ("nested typing.TypedDict", Nested, {"row": {"id": 1, "name": "a"}, "rows": [], "maybe": None}),
    ("typing_extensions.TypedDict", ExtRow, {"id": 2, "tags": ["x"]}),
    ("list[TypedDict]", list[Row], [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]),
    ("dict[str, TypedDict]", dict[str, Row], {"k": {"id": 1, "name": "a"}}),
    ("TypedDict | None", Row | None, None),
    ("Optional[TypedDict]", typing.Optional[Row], {"id": 3, "name": "c"}),  # noqa: UP045
    ("Annotated[TypedDict]", Annotated[Row, Field(description="a row")], {"id": 4, "name": "d"}),
    ("tuple[int, str]", tuple[int, str], (1, "a")),
    ("dataclass", Point, Point(x=1, y=2)),
    ("pydantic model", Model, Model(id=1, when=WHEN)),
    ("datetime", dt.datetime, WHEN),
    ("UUID", uuid.UUID, ID),
    ("Enum", Color, Color.RED),
    ("Literal", Literal["a", "b"], "b"),
    ("set[int]", set[int], {1, 2}),
    ("frozenset[str]", frozenset[str], frozenset({"a"})),
]  # fmt: skip


@pytest.mark.parametrize(("label", "tp", "value"), CASES, ids=[c[0] for c in CASES])
def test_every_supported_return_annotation_revives(
    label: str, tp: Any, value: Any, tmp_path: Path
) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'rt.db'}")
    seen: list[Any] = []

    def make() -> Any:
        return value

    make.__annotations__["return"] = tp

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        got = await ctx.step(make)
        seen.append(got)
        await ctx.wait_for("go")  # the run leaves the worker: it resumes by replay
        return "ok"

    async def main() -> None:
        run = app.submit(wf)
        await app.worker().run(until_idle=True)
        app.signal(run.run_id, "go")
        await app.worker().run(until_idle=True)
        assert await run.result() == "ok"

    asyncio.run(main())
    [live, replayed] = seen  # run live, then read back from the journal
    assert live == replayed == value
    assert type(live) is type(replayed) is type(value)
    app.close()


def test_a_tool_returning_a_stdlib_typeddict_runs_in_an_agent(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'agent.db'}")
    writes: list[int] = []

    @app.tool(effect="write")
    def put(id: int) -> Row:
        """Write a row."""
        writes.append(id)
        return {"id": id, "name": "x"}

    model = ScriptedModel(
        [ScriptedModel.call("put", {"id": 1}), ScriptedModel.call("finish", {"answer": "ok"})]
    )
    agent = app.agent("a", model=model, instructions="put a row", tools=[put])
    assert asyncio.run(app.run(agent, "go")).answer == "ok"
    assert writes == [1]
    app.close()


def test_a_result_that_cannot_be_journaled_fails_its_step_and_names_the_key(
    tmp_path: Path,
) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'bad.db'}")
    effects: list[str] = []

    def opaque() -> Any:
        effects.append(ms.current_step().idempotency_key)
        return object()

    def mismatched() -> Row:
        return typing.cast(Row, {"id": "not a number", "name": "a"})

    @app.workflow
    async def wf(ctx: ms.RunContext, which: str) -> str:
        try:
            await ctx.step(opaque if which == "opaque" else mismatched)
        except ms.StepFailed as exc:
            return str(exc)
        return "no error"

    async def main() -> tuple[str, str]:
        a, b = app.submit(wf, "opaque"), app.submit(wf, "mismatched")
        await app.worker().run(until_idle=True)
        return await a.result(), await b.result()

    opaque_error, mismatch_error = asyncio.run(main())
    assert "cannot be stored as JSON" in opaque_error
    assert f"idempotency key {effects[0]!r}" in opaque_error
    assert "is not a valid Row" in mismatch_error and "id" in mismatch_error
    # The step is failed in the journal: never 'completed' with a result no replay can read.
    for run in app.list_runs():
        [step] = [s for s in app.store.load_steps(run.id, 0) if s.kind == "step"]
        assert step.status == "failed", step
    app.close()


def test_preflight_flags_a_return_type_that_would_not_revive(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'pf.db'}")

    @app.tool(effect="read")
    def good() -> Row:
        """Read a row."""
        return {"id": 1, "name": "a"}

    @app.tool(effect="read")
    def opaque() -> Opaque:
        """Read something opaque."""
        return Opaque()

    agent = app.agent(
        "a", model=ScriptedModel([]), instructions="use good and opaque", tools=[good, opaque]
    )
    report = preflight(agent, app)
    [schemas] = [f for f in report.findings if f.check == "schemas"]
    problems = " ".join(schemas.problems)
    assert "tool 'opaque': its return type" in problems
    assert "'good'" not in problems  # a stdlib TypedDict is fine
    app.close()
