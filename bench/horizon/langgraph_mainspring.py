"""LangGraph on mainspring: the graph of ``langgraph_agent.py`` (LangGraph's quickstart
agent, ``ChatOpenAI.bind_tools``), unchanged but for where a node finds its run's
label, made durable with ``mainspring.integrations.langgraph.durable`` and run by
``mainspring worker`` processes (the suite's worker pool, as the built-in contender).

What differs from the bare peer is mainspring's, not the graph's:

- **Persistence**: the journal (each node a step), not ``SqliteSaver``; a SIGKILLed
  worker's runs resume at the node the kill interrupted, on any worker.
- **Approvals**: ``interrupt()`` in the tool node is a mainspring request, answered by
  the harness's reviewer as for the built-in contender (``Command(resume=True)``).
- **Retries**: ``ChatOpenAI``'s own (as the peer), then the node's step retry
  (mainspring's model retry for a model node: 8 attempts with back-off), where the
  peer gives up.
- **Arguments**: a reply whose tool-call JSON does not parse (``invalid_tool_calls``)
  fails the model node's attempt and the model is asked again (``repair``), where the
  peer's ``should_continue`` ends the graph. The graph's code is the same.

Kill points: ``"model"`` in ``llm_call`` after the reply (as the peer), ``"tool"`` in
the world, ``"commit"`` after each commit of mainspring's store (the built-in
contender's). Run it with ``python bench/horizon.py --contenders langgraph_mainspring``.
"""

from __future__ import annotations

import operator
import os
import re
from functools import cache
from typing import Annotated, Any

from _common import MODEL, RunnerArgs, Tools, client_timeout_s, dumps, openai_tools
from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt
from typing_extensions import TypedDict

import mainspring as ms
from mainspring.integrations.langgraph import durable
from mainspring.lab import TASKS
from mainspring.lab._suite_app import _KillingStore, _watch_harness
from mainspring.storage import open_store

_LABEL = re.compile(r"\bbatch (\w+)")


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    finished: Annotated[bool, operator.or_]


@cache
def _tools(task: str, label: str) -> Tools:
    """The run's handle on the world (the peer makes one per runner process)."""
    args = RunnerArgs(
        task, label, os.environ["MAINSPRING_SUITE_WORLD"], "/nonexistent", _max_steps()
    )
    return Tools(args)


def _max_steps() -> int:
    return int(os.environ.get("MAINSPRING_SUITE_MAX_STEPS", "100"))


def _label(state: State) -> str:
    for message in state["messages"]:
        if isinstance(message, HumanMessage):
            found = _LABEL.search(str(message.content))
            if found:
                return found.group(1)
    raise ValueError("the task text names no batch")


def build(task: str) -> Any:
    """``langgraph_agent.build``'s graph for ``task``; the label comes from the state."""
    spec = TASKS[task]
    llm = ChatOpenAI(
        model=MODEL,
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        timeout=client_timeout_s(),
    ).bind_tools(openai_tools(spec))

    def llm_call(state: State) -> dict[str, Any]:
        reply = llm.invoke(state["messages"])
        _tools(task, _label(state)).kill_point("model")
        return {"messages": [reply]}

    def tool_node(state: State) -> dict[str, Any]:
        tools = _tools(task, _label(state))
        out: list[ToolMessage] = []
        for call in state["messages"][-1].tool_calls:  # type: ignore[union-attr]
            name, arguments, call_id = call["name"], call["args"], call["id"]
            if name == "finish":
                out.append(ToolMessage("done", tool_call_id=call_id))
                return {"messages": out, "finished": True}
            if tools.needs_approval(name):
                approved = interrupt({"key": call_id, "tool": name, "arguments": dumps(arguments)})
                if not approved:
                    rejected = {"ok": False, "error": f"the reviewer rejected {name}"}
                    out.append(ToolMessage(dumps(rejected), tool_call_id=call_id))
                    continue
            result = tools.call(name, arguments, call_id)
            out.append(ToolMessage(dumps(result), tool_call_id=call_id))
        return {"messages": out}

    def should_continue(state: State) -> str:
        last = state["messages"][-1]
        return "tool_node" if getattr(last, "tool_calls", None) else END

    def after_tools(state: State) -> str:
        return END if state.get("finished") else "llm_call"

    graph = StateGraph(State)
    graph.add_node("llm_call", llm_call)
    graph.add_node("tool_node", tool_node)
    graph.add_edge(START, "llm_call")
    graph.add_conditional_edges("llm_call", should_continue, ["tool_node", END])
    graph.add_conditional_edges("tool_node", after_tools, ["llm_call", END])
    return graph.compile()


def _start(task: str) -> Any:
    def make(text: str) -> dict[str, Any]:  # the harness submits the task text
        messages = [SystemMessage(TASKS[task].instructions), HumanMessage(text)]
        return {"messages": messages, "finished": False}

    return make


def build_app() -> ms.App:
    """The App the contender's workers run: one graph per task, under the task's name."""
    url = os.environ["MAINSPRING_DATABASE_URL"]
    _watch_harness()  # a worker of a harness that is gone exits
    before = os.environ.get("MAINSPRING_SUITE_KILL_BEFORE_COMMIT") == "1"
    app = ms.App(
        _KillingStore(open_store(url), before=before),
        max_recoveries=1000,
        poll_interval_s=0.05,
        lease_s=2.0,
    )
    for task in TASKS:
        durable(
            app,
            build(task),
            name=task,
            make_input=_start(task),
            # Two supersteps (llm_call, tool_node) per model call, as the peer.
            recursion_limit=2 * _max_steps() + 4,
        )
    return app


app = build_app()
