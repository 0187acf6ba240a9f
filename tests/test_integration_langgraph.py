"""LangGraph graphs on mainspring (mainspring.integrations.langgraph): nodes as journaled
steps, interrupt() as requests, exact resume, state APIs over mainspring's database,
budgets, loop guard, subgraphs as child runs. The worker-process kill test is
tests/test_integration_langgraph_processes.py."""

from __future__ import annotations

import asyncio
import json
import operator
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest

pytest.importorskip("langgraph")

import httpx
from _helpers import Crash, drain, uvicorn_serving
from apps.langgraph_app import build, policy
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send, interrupt
from typing_extensions import TypedDict

import mainspring as ms
from mainspring.integrations.langgraph import MainspringSaver, durable
from mainspring.testing import EffectLedger, FakeOpenAIServer

ROOT = Path(__file__).resolve().parent


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as s:
        yield s


def _app(db_url: str, **options: Any) -> ms.App:
    return ms.App(db_url, poll_interval_s=0.02, inline_wait_s=0.5, **options)


async def _settle(app: ms.App, rounds: int = 6) -> None:
    for _ in range(rounds):
        await drain(app)


async def test_a_react_graph_runs_as_a_run(
    db_url: str, tmp_path: Path, server: FakeOpenAIServer
) -> None:
    """Each node is a journaled step by name, interrupt() a request answered through
    the answer path, the subgraph a child run; effects once; the state APIs read the
    run's state from the database."""
    app = _app(db_url)
    ledger, execs = tmp_path / "ledger.db", tmp_path / "execs.db"
    flow = build(app, base_url=server.base_url, ledger=str(ledger), execs=str(execs))
    server.fallback = policy(3, refund_at=1)
    run = app.submit(flow, {"messages": [("user", "orders batch a")]}, key="t-7")
    again = app.submit(flow, {"messages": [("user", "orders batch a")]}, key="t-7")
    assert again.run_id == run.run_id and not again.created
    await drain(app)
    waiting = app.get_run(run.run_id)
    assert waiting.status == "waiting"
    [request] = app.requests()
    assert (request.id, request.kind, request.preview) == (
        "approval:review.1", "approval", {"refund": [{"order": 1}]},
    )  # fmt: skip
    thread = {"configurable": {"thread_id": run.run_id}}
    paused = flow.graph.get_state(thread)  # read from the database, by another process's API
    assert [t.name for t in paused.tasks] == ["review"] and paused.interrupts
    with pytest.raises(ms.RunConflict, match="Answer its requests, or fork"):
        flow.graph.update_state(thread, {"report": "edited"})
    app.answer(run.run_id, request.id, decision="approve", by="ana")
    await _settle(app)

    result = await run.result()
    assert result["report"] == "sent: 8 messages"
    assert result["messages"][-1].content == "all 3 orders done"  # messages stay messages
    names = [s.name for s in app.store.load_steps(run.run_id)]
    assert names == [
        "now", "node:model", "node:review", "node:tools", "node:model", "node:review",
        "approval:review.1", "node:review", "node:tools", "node:model", "node:review",
        "node:tools", "node:model", "child:orders.report", names[-1],
    ]  # fmt: skip
    trace = app.observe.trace(run.run_id)
    models = [e for e in trace.entries if e.name == "node:model"]
    assert {e.kind for e in models} == {"model"} and all(e.tokens_in > 0 for e in models)
    assert trace.cost_usd > 0
    assert models[0].calls == (("charge", "{'order': 0}"),)
    [child] = app.children(run.run_id)
    assert child.workflow == "orders.report"
    assert [s.name for s in app.store.load_steps(child.id)][1:] == ["node:draft", "node:send"]
    report = EffectLedger(ledger).report()
    assert (report.keys, report.duplicate_effects) == (4, {})  # 2 charges, a refund, a report
    assert EffectLedger(execs).report().duplicate_calls == {}  # no node ran twice
    done = flow.graph.get_state(thread)
    assert done.values["report"] == "sent: 8 messages" and not done.next
    history = list(flow.graph.get_state_history(thread))
    assert len(history) == 2  # durability="exit": at the interrupt and at the end
    assert len(server.requests) == 4


async def test_a_crash_mid_node_runs_it_again_under_the_same_key(
    tmp_path: Path, server: FakeOpenAIServer
) -> None:
    """The process dies after a tool's effect, inside the tools node: the run resumes
    at that node, which runs again under the same idempotency key (the effect is not
    repeated); completed nodes never run again, their model calls are not re-sent. A
    reply with malformed tool-call JSON is asked again."""
    app = _app(f"sqlite:///{tmp_path / 'ms.db'}", lease_s=0.5)
    died: list[str] = []

    def crash_once(key: str) -> None:
        if not died:
            died.append(key)
            raise Crash

    ledger, execs = tmp_path / "ledger.db", tmp_path / "execs.db"
    flow = build(
        app, base_url=server.base_url, ledger=str(ledger), execs=str(execs),
        after_effect=crash_once,
    )  # fmt: skip
    server.fallback = policy(2, malformed_at=1)
    run = app.submit(flow, {"messages": [("user", "orders batch b")]})
    await drain(app)
    assert app.get_run(run.run_id).status == "running"  # it died holding its lease
    await asyncio.sleep(0.7)
    await _settle(app)
    assert app.get_run(run.run_id).status == "succeeded"

    [key] = died
    tools_key = key.rsplit(":", 1)[0]
    steps = {f"{run.run_id}:{s.session}:{s.seq}": s for s in app.store.load_steps(run.run_id)}
    tools = steps[tools_key]
    assert (tools.name, tools.attempt, tools.status) == ("node:tools", 2, "completed")
    models = [k for k, s in steps.items() if s.name == "node:model"]
    assert [steps[k].attempt for k in models] == [1, 2, 1]  # the malformed reply: asked again
    # Only the node the crash interrupted, and the one whose reply was asked again,
    # ran twice, each under its one key.
    calls = EffectLedger(execs).report().duplicate_calls
    assert calls == {tools_key: 2, models[1]: 2}
    assert EffectLedger(ledger).report().duplicate_effects == {}
    assert len(server.requests) == 4  # 3 model nodes + the repair; none re-sent


class Fan(TypedDict):
    items: Annotated[list[Any], operator.add]
    n: int
    ok: bool


def _fan_graph() -> Any:
    async def plan(state: Fan) -> dict[str, Any]:
        return {"n": 4}

    def fan(state: Fan) -> list[Send]:
        return [Send("work", {"n": i, "items": [], "ok": False}) for i in range(state["n"])]

    async def work(state: Fan) -> dict[str, Any]:
        await asyncio.sleep(0.02 * (4 - state["n"]))  # the last to start ends first
        return {"items": [state["n"] * 10]}

    def check(state: Fan) -> dict[str, Any]:
        return {"ok": interrupt({"items": sorted(state["items"])})}

    g = StateGraph(Fan)
    g.add_node("plan", plan)
    g.add_node("work", work)
    g.add_node("check", check)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", fan, ["work"])
    g.add_edge("work", "check")
    g.add_edge("check", END)
    return g


async def test_parallel_nodes_replay_in_the_order_they_started(tmp_path: Path) -> None:
    """The nodes of one superstep take their journal positions in the order LangGraph
    starts them, whatever order they end in, so a replay (here after the wait) meets
    each at its place."""
    app = _app(f"sqlite:///{tmp_path / 'ms.db'}")
    flow = durable(app, _fan_graph(), name="fan")
    run = app.submit(flow, {"items": [], "n": 0, "ok": False})
    await drain(app)
    [request] = app.requests()
    assert request.preview == {"items": [0, 10, 20, 30]}
    app.answer(run.run_id, request.id, decision="approve", by="ana")
    await drain(app)
    assert await run.result() == {"items": [0, 10, 20, 30], "n": 4, "ok": True}
    works = [s for s in app.store.load_steps(run.run_id) if s.name == "node:work"]
    assert [json.loads(s.output or "")["update"] for s in works] == [
        {"items": [0]}, {"items": [10]}, {"items": [20]}, {"items": [30]},
    ]  # fmt: skip
    assert works[0].finished_at > works[-1].finished_at  # (it did end last)


class Loop(TypedDict):
    turns: Annotated[int, operator.add]
    done: bool


def _counting_graph(*, stuck: bool = False) -> Any:
    def step(state: Loop) -> dict[str, Any]:
        return {"turns": 0 if stuck else 1}

    def again(state: Loop) -> str:
        return END if state["turns"] >= 5 else "step"

    g = StateGraph(Loop)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", again, ["step", END])
    return g


async def test_a_budget_pauses_the_graph_and_asks(tmp_path: Path) -> None:
    app = _app(f"sqlite:///{tmp_path / 'ms.db'}")
    flow = durable(app, _counting_graph(), name="count", limits=ms.Limits(max_steps=2))
    run = app.submit(flow, {"turns": 0, "done": False})
    await drain(app)
    [request] = app.requests()
    assert (request.id, request.preview["used"], request.preview["node"]) == (
        "budget:max_steps", 2, "step",
    )  # fmt: skip
    app.answer(run.run_id, request.id, decision="edit", arguments={"limit": 10}, by="ana")
    await drain(app)
    assert (await run.result())["turns"] == 5

    stopped = app.submit(flow, {"turns": 0, "done": False})
    await drain(app)
    [again] = app.requests()
    app.answer(stopped.run_id, again.id, decision="reject", reason="enough", by="ana")
    await drain(app)
    record = app.get_run(stopped.run_id)
    assert record.status == "failed" and "BudgetExceeded" in (record.error or "")
    assert sum(s.name == "node:step" for s in app.store.load_steps(stopped.run_id)) == 2


async def test_a_graph_going_round_unchanged_is_stopped(tmp_path: Path) -> None:
    app = _app(f"sqlite:///{tmp_path / 'ms.db'}")
    flow = durable(app, _counting_graph(stuck=True), name="stuck")
    run = app.submit(flow, {"turns": 0, "done": False})
    await drain(app)
    [request] = app.requests()
    assert request.id == "approval:loop.1" and request.preview["pattern"] == "step"
    app.answer(run.run_id, request.id, decision="reject", by="ana")
    await drain(app)
    record = app.get_run(run.run_id)
    assert record.status == "failed" and "LoopDetected" in (record.error or "")


async def test_answers_from_the_cli_and_the_http_api(tmp_path: Path) -> None:
    """An interrupt is a request like any other: `mainspring approve` answers it, and
    so does POST /runs/{id}/requests/{request_id}; a question's answer is its text."""
    url = f"sqlite:///{tmp_path / 'ms.db'}"
    app = _app(url)

    class Ask(TypedDict):
        answer: str

    def ask(state: Ask) -> dict[str, Any]:
        return {"answer": interrupt("which order?")}

    g = StateGraph(Ask)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    flow = durable(app, g, name="ask", interrupts="question")
    both = durable(app, _fan_graph(), name="fan")
    first, second = app.submit(flow, {"answer": ""}), app.submit(both, {"items": [], "n": 0})
    await drain(app)
    [fan_request] = [r for r in app.requests() if r.run_id == second.run_id]
    approved = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "mainspring", "approve", second.run_id, fan_request.id,
         "--db", url],
        capture_output=True, text=True, cwd=ROOT.parent, timeout=60,
    )  # fmt: skip
    assert approved.returncode == 0, approved.stderr
    [question] = [r for r in app.requests() if r.run_id == first.run_id]
    assert (question.kind, question.title) == ("question", "which order?")
    _, key = app.store.create_api_key("ana", ["read", "approve"], 0.0)
    with uvicorn_serving(app) as base:
        answered = await asyncio.to_thread(
            httpx.post,
            f"{base}/runs/{first.run_id}/requests/{question.id}",
            json={"answer": "order 7"},
            headers={"Authorization": f"Bearer {key}"},
        )
    assert answered.status_code < 300, answered.text
    await drain(app)
    assert await first.result() == {"answer": "order 7"}
    assert (await second.result())["ok"] is True


async def test_a_fork_replays_the_graph_and_goes_on_live(
    tmp_path: Path, server: FakeOpenAIServer
) -> None:
    app = _app(f"sqlite:///{tmp_path / 'ms.db'}")
    ledger, execs = tmp_path / "ledger.db", tmp_path / "execs.db"
    flow = build(app, base_url=server.base_url, ledger=str(ledger), execs=str(execs))
    server.fallback = policy(2)
    run = app.submit(flow, {"messages": [("user", "orders batch c")]})
    await _settle(app)
    assert app.get_run(run.run_id).status == "succeeded"
    sent = len(server.requests)
    steps = app.store.load_steps(run.run_id)
    first_tools = next(s for s in steps if s.name == "node:tools")
    fork = app.fork(run.run_id, from_step=first_tools.seq, decisions="keep")
    await _settle(app)
    assert (await fork.result())["report"] == (await run.result())["report"]
    # The fork replayed the first model and tools nodes and made the rest anew.
    assert len(server.requests) - sent == 2


def test_a_stale_writer_cannot_write_a_runs_checkpoints(tmp_path: Path) -> None:
    app = _app(f"sqlite:///{tmp_path / 'ms.db'}")
    run = app.submit(durable(app, _counting_graph(), name="count"), {"turns": 0})
    claimed = app.store.claim(
        worker="w1", now=0.0, lease_s=60.0, limit=1, workflows=None, max_recoveries=5
    )
    [held] = [r for r in claimed if r.id == run.run_id]
    config: Any = {"configurable": {"thread_id": run.run_id, "checkpoint_ns": ""}}
    checkpoint: Any = {
        "v": 1, "id": "1f0", "ts": "2026-01-01T00:00:00+00:00",
        "channel_values": {"turns": 1}, "channel_versions": {"turns": "1"},
        "versions_seen": {},
    }  # fmt: skip
    MainspringSaver(app, fence=(run.run_id, held.epoch)).put(config, checkpoint, {}, {"turns": "1"})
    stale = MainspringSaver(app, fence=(run.run_id, held.epoch - 1))
    with pytest.raises(ms.RunConflict, match="no longer running at epoch"):
        stale.put(config, {**checkpoint, "id": "1f1"}, {}, {})
    with pytest.raises(ms.RunConflict):
        MainspringSaver(app).put(config, {**checkpoint, "id": "1f2"}, {}, {})  # a person
    assert [c.checkpoint_id for c in app.store.list_checkpoints(thread_id=run.run_id)] == ["1f0"]


def test_the_saver_is_an_ordinary_checkpointer_too(db_url: str) -> None:
    """On a thread that is no run's, MainspringSaver is LangGraph's checkpointer:
    invoke, get_state, update_state, get_state_history, delete_thread."""
    app = _app(db_url)
    graph = _counting_graph().compile(checkpointer=MainspringSaver(app))
    thread: Any = {"configurable": {"thread_id": "chat-1"}}
    assert graph.invoke({"turns": 0, "done": False}, thread)["turns"] == 5
    graph.update_state(thread, {"turns": 10})
    assert graph.get_state(thread).values["turns"] == 15
    assert len(list(graph.get_state_history(thread))) == 8
    graph.checkpointer.delete_thread("chat-1")  # type: ignore[union-attr]
    assert not graph.get_state(thread).values


async def test_langgraph_checkpointer_conformance(db_url: str) -> None:
    """LangGraph's own conformance suite (langgraph-checkpoint-conformance), base
    capabilities, against MainspringSaver on each backend."""
    conformance = pytest.importorskip("langgraph.checkpoint.conformance")
    app = _app(db_url)

    @conformance.checkpointer_test(name="MainspringSaver")
    async def saver() -> Any:
        yield MainspringSaver(app)

    report = await conformance.validate(saver)
    assert report.passed_all_base(), report.to_dict()


def test_without_the_extra_the_import_names_the_install() -> None:
    code = "import sys; sys.modules['langgraph'] = None; import mainspring.integrations.langgraph"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent,
        env={**os.environ, "PYTHONPATH": str(ROOT.parent)}, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "pip install 'mainspring[langgraph]'" in done.stderr


def test_the_lab_runs_a_graph_under_faults(tmp_path: Path) -> None:
    """`mainspring lab run` takes the graph's workflow like any other: crashes and
    step errors, every trial recovered on mainspring's policy."""
    from mainspring.lab import LabProfile, run_workflow_lab

    app = _app(f"sqlite:///{tmp_path / 'ms.db'}")
    flow = durable(app, _counting_graph(), name="count")
    profile = LabProfile(model_error_rate=0.1, crash_rate=0.1)
    result = run_workflow_lab(
        flow, profile, kwargs={"input": {"turns": 0, "done": False}}, policies=["mainspring"],
        trials=6, repeats=2,
    )  # fmt: skip
    [cell] = result.cells
    assert cell.successes == cell.trials == 6
    assert cell.recoveries > 0  # crashes were drawn and recovered from


@pytest.mark.slow
@pytest.mark.newest
def test_the_integration_on_the_newest_langgraph(tmp_path: Path) -> None:
    """The integration's tests in a throwaway venv with the newest LangGraph, LangChain
    and checkpoint releases the index has (beyond the extra's tested range): a new
    release that breaks the integration fails here first. Run: pytest -m newest."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")

    def pip(*args: str) -> None:
        done = subprocess.run(
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
            capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]

    pip("-e", f"{ROOT.parent}[openai,server,postgres]")
    pip("--upgrade", "langgraph", "langgraph-checkpoint", "langchain-core",
        "langgraph-checkpoint-conformance", "pytest", "pytest-asyncio", "pytest-timeout",
        "pytest-xdist", "hypothesis")  # fmt: skip
    versions = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout
    print([line for line in versions.splitlines() if line.startswith(("langgraph", "langchain"))])
    done = subprocess.run(
        [python, "-m", "pytest", "tests/test_integration_langgraph.py",
         "tests/test_integration_langgraph_processes.py", "-q", "-n", "0", "-m", "not slow",
         "-p", "no:cacheprovider"],
        cwd=ROOT.parent, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-5000:]


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


async def test_a_sync_node_with_a_malformed_reply_asks_the_model_again(tmp_path: Path) -> None:
    """A sync node (LangChain runs it in a thread) whose chat model's reply has tool
    calls that do not parse: the model is asked again, the graph never sees them."""
    bad = {"name": "charge", "args": '{"order": ', "id": "c0", "error": "not JSON"}
    llm = GenericFakeChatModel(
        messages=iter([AIMessage("", invalid_tool_calls=[bad]), AIMessage("no tools after all")])
    )

    def model(state: Chat) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    g = StateGraph(Chat)
    g.add_node("model", model)
    g.add_edge(START, "model")
    app = _app(f"sqlite:///{tmp_path / 'ms.db'}")
    flow = durable(app, g, name="chat")
    run = app.submit(flow, {"messages": [("user", "hi")]})
    await drain(app)
    assert (await run.result())["messages"][-1].content == "no tools after all"
    [step] = [s for s in app.store.load_steps(run.run_id) if s.name == "node:model"]
    assert step.attempt == 2 and "MalformedToolCalls" in (step.error or "")


async def test_model_calls_in_nodes_book_the_shared_rate_limiter(
    tmp_path: Path, server: FakeOpenAIServer
) -> None:
    """With rate limits on the App, every model call a node makes books a slot of the
    limiter shared by all workers (and settles it), as mainspring's own model calls."""
    from mainspring.limits import RateLimit

    limits = [RateLimit(provider="openai", model="gpt-4.1-mini", rpm=600, tpm=1_000_000)]
    app = _app(f"sqlite:///{tmp_path / 'ms.db'}", rate_limits=limits)
    ledger, execs = tmp_path / "ledger.db", tmp_path / "execs.db"
    flow = build(app, base_url=server.base_url, ledger=str(ledger), execs=str(execs))
    server.fallback = policy(2)
    run = app.submit(flow, {"messages": [("user", "orders batch d")]})
    await _settle(app)
    assert app.get_run(run.run_id).status == "succeeded"
    row = app.store.rate_limit("openai:gpt-4.1-mini:default")
    assert row is not None and row.bookings == len(server.requests) == 3
    assert row.holds == []  # every booking settled
