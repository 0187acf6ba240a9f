"""A model step's journal identity is the logical model (provider + model id), never the
endpoint, key or settings that reach it: moving the endpoint under a run in flight neither
breaks its replay nor pays for its model calls again. Journals written when the endpoint
was part of the name still replay, and ``doctor`` explains a NondeterminismError."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import mainspring as ms
import mainspring.agent._call as loop  # where a model call names its step
from mainspring.journal import Committer
from mainspring.journal._cursor import _same_name  # replay's comparison of names
from mainspring.models import OpenAIModel, without_endpoint
from mainspring.testing import FakeOpenAIServer

MODELS: list[OpenAIModel] = []


@pytest.fixture(autouse=True)
async def _close_models() -> Any:
    yield
    for model in MODELS:
        await model.aclose()  # the SDK's HTTP connections
    MODELS.clear()


def _agent(app: ms.App, base_url: str, key: str) -> ms.Workflow[[str], ms.AgentResult]:
    @app.tool(effect="irreversible")
    def purge(table: str) -> str:
        """Purge a table (asks a human first)."""
        return f"purged {table}"

    model = OpenAIModel("gpt-4.1-mini", base_url=base_url, api_key=key)
    MODELS.append(model)
    return app.agent("cleanup", model=model, instructions="Purge t.", tools=[purge])


async def _until_waiting(app: ms.App, run_id: str) -> ms.Request:
    await app.worker().run(until_idle=True)
    [request] = app.requests(run_id)
    return request


async def _move_endpoint_mid_run(db: Path) -> tuple[list[Any], list[Any], ms.AgentResult]:
    with FakeOpenAIServer(api_key="sk-a") as old, FakeOpenAIServer(api_key="sk-b") as new:
        old.script([old.tool_call("purge", {"table": "t"})])
        new.script([new.tool_call("finish", {"answer": "purged t"})])

        first = ms.App(f"sqlite:///{db}")
        run = first.submit(_agent(first, old.base_url, "sk-a"), "go")
        request = await _until_waiting(first, run.run_id)  # the run waits for a human
        first.close()

        # A new deployment: another endpoint (port), another key. The run goes on.
        second = ms.App(f"sqlite:///{db}")
        _agent(second, new.base_url, "sk-b")
        second.answer(run.run_id, request.id, decision="approve", by="ops")
        await second.worker().run(until_idle=True)
        result: ms.AgentResult = await second.result(run.run_id)
        second.close()
        return old.bodies, new.bodies, result


async def test_an_endpoint_moved_under_a_waiting_run_neither_breaks_nor_repays(
    tmp_path: Path,
) -> None:
    old, new, result = await _move_endpoint_mid_run(tmp_path / "moved.db")
    assert result.answer == "purged t"
    assert len(old) == 1  # the first model call ran once, on the old endpoint...
    assert len(new) == 1  # ...and replayed from the journal: only the next call is new
    app = ms.App(f"sqlite:///{tmp_path / 'moved.db'}")
    [run] = app.list_runs()
    names = {s.name for s in app.observe.steps(run.id) if s.name.startswith("model:")}
    assert names == {"model:openai:gpt-4.1-mini"}  # no URL, no key
    app.close()


async def test_a_journal_that_named_the_endpoint_still_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The spelling of earlier versions: "model:openai:gpt-4.1-mini@http://127.0.0.1:PORT/v1".
    real: Callable[[str, str], str] = loop.model_step_name
    urls: list[str] = []

    def legacy(provider: str, model_id: str) -> str:
        return f"{real(provider, model_id)}@{urls[-1]}" if urls else real(provider, model_id)

    with FakeOpenAIServer(api_key="sk-a") as old, FakeOpenAIServer(api_key="sk-b") as new:
        old.script([old.tool_call("purge", {"table": "t"})])
        new.script([new.tool_call("finish", {"answer": "purged t"})])
        db = tmp_path / "legacy.db"
        first = ms.App(f"sqlite:///{db}")
        urls.append(old.base_url)
        monkeypatch.setattr(loop, "model_step_name", legacy)
        run = first.submit(_agent(first, old.base_url, "sk-a"), "go")
        request = await _until_waiting(first, run.run_id)
        [journaled] = [
            s.name for s in first.observe.steps(run.run_id) if s.name.startswith("model:")
        ]
        assert journaled == f"model:openai:gpt-4.1-mini@{old.base_url}"
        first.close()
        monkeypatch.undo()  # this version's code replays it

        second = ms.App(f"sqlite:///{db}")
        _agent(second, new.base_url, "sk-b")
        second.answer(run.run_id, request.id, decision="approve", by="ops")
        await second.worker().run(until_idle=True)
        result: ms.AgentResult = await second.result(run.run_id)
        assert (result.answer, len(old.bodies), len(new.bodies)) == ("purged t", 1, 1)
        assert (
            second.observe.trace(run.run_id).cost_usd > 0
        )  # the legacy name still finds its price
        second.close()


def test_only_an_endpoint_suffix_is_forgiven(tmp_path: Path) -> None:
    """The journal compares names through what the App's engine was given: the models
    floor's ``without_endpoint`` (the journal itself knows nothing of model names)."""
    app = ms.App(f"sqlite:///{tmp_path / 'names.db'}")
    with ThreadPoolExecutor(1) as threads:
        engine = app.engine(Committer(app.store, app.clock), threads)

    def same(journaled: str, asked: str) -> bool:
        return _same_name(engine, journaled, asked)

    assert same("model:openai:m@https://gw.example/v1", "model:openai:m")
    assert same("model:anthropic:claude@20240620", "model:anthropic:claude@20240620")
    assert not same("model:openai:m@https://gw.example/v1", "model:openai:other")
    assert not same("tool:a@http://x", "tool:a")  # only model steps carried URLs
    assert without_endpoint("model:vertex:claude@2024@http://x") == "model:vertex:claude@2024"
    engine.canonical_step_name = None  # an engine without the models floor's mapping
    assert not same("model:openai:m@https://gw.example/v1", "model:openai:m")
    app.close()


async def test_doctor_names_a_nondeterminism_error_and_what_to_do(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'nd.db'}", default_retry=ms.RetryPolicy.never())
    names = ["fetch"]

    def fetch() -> int:
        return 1

    @app.workflow
    async def wf(ctx: ms.RunContext) -> int:
        value: int = await ctx.step(fetch, name=names[0])
        await ctx.wait_for("go")
        return value

    run = app.submit(wf)
    await app.worker().run(until_idle=True)
    names[0] = "fetch_v2"  # the code changed while the run waited
    app.signal(run.run_id, "go")
    await app.worker().run(until_idle=True)
    assert app.get_run(run.run_id).wait_reason == "replay"  # left for other code

    diagnosis = app.observe.diagnose(run.run_id)
    [finding] = [f for f in diagnosis.findings if f.kind == "nondeterminism"]
    assert "NondeterminismError" in diagnosis.summary
    assert "'fetch'" in finding.evidence[0] and "'fetch_v2'" in finding.evidence[0]
    assert "refused 1 time(s)" in finding.evidence[1]
    advice = " ".join(finding.next_steps)
    assert f"mainspring cancel {run.run_id}" in advice and "not failed" in advice
    app.close()
