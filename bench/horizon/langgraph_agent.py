"""LangGraph: the tool-calling agent of LangGraph's quickstart, with ``SqliteSaver``.

The graph is the one LangGraph's Graph API quickstart builds: an ``llm_call`` node
(``ChatOpenAI.bind_tools``), a ``tool_node`` that runs each of the reply's
``tool_calls`` and answers with a ``ToolMessage`` under the call's id, and
``should_continue``: to ``tool_node`` while the last reply has tool calls, else to the
end. Persistence and human review follow LangGraph's persistence and interrupts docs:

- **Checkpointer**: ``SqliteSaver`` on a file in ``--state``, ``thread_id`` = the run's
  label, the default durability (``"async"``: a step's checkpoint is written while
  the next step runs).
- **Crashes**: a restarted process resumes the thread as the durable-execution docs
  say, ``graph.invoke(None, config)`` on the same ``thread_id``: LangGraph re-runs the
  step whose checkpoint was not written (a model call paid again, or a tool call made
  again under the same tool call id, the idempotency key).
- **Approvals**: the tool node calls ``interrupt()`` before an approval tool; the
  runner asks the reviewer (``SuiteFaults.request_approval``, keyed by the tool call
  id), polls, and resumes with ``Command(resume=approved)``. A process killed while
  waiting finds the interrupt in ``graph.get_state(config)`` and waits again.
- **Retries**: ``ChatOpenAI``'s, at its defaults: ``max_retries=None`` leaves the
  ``openai`` client's own (2 retries: three attempts on connection errors, timeouts,
  408, 409, 429 and 5xx, exponential back-off from 0.5 s honouring ``retry-after``);
  no node ``RetryPolicy`` (the docs' option, off by default). A call that still fails
  raises out of ``invoke`` and the run gives up (exit 1).
- **Timeout**: ``ChatOpenAI(timeout=...)`` = the suite server's ``client_timeout_s``.
- **Arguments**: ``langchain-openai`` parses each call's JSON; one that does not parse
  lands in ``AIMessage.invalid_tool_calls``, not ``tool_calls``, so
  ``should_continue`` ends the graph there, as the quickstart's agent does: the run
  gave up (exit 1). Arguments that parse go to the world, whose error result goes
  back to the model.

Kill points: ``"model"`` in ``llm_call`` after the reply; ``"commit"`` after each
``SqliteSaver.put`` returns.
"""

from __future__ import annotations

import operator
import os
import sqlite3
import sys
from typing import Annotated, Any

from _common import MODEL, RunnerArgs, Tools, client_timeout_s, dumps, openai_tools, parse_args
from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    finished: Annotated[bool, operator.or_]


class KillPointSaver(SqliteSaver):
    """``SqliteSaver`` with the suite's ``"commit"`` kill point after each ``put``."""

    def __init__(self, conn: sqlite3.Connection, tools: Tools) -> None:
        super().__init__(conn)
        self.suite_tools = tools

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        saved = super().put(config, checkpoint, metadata, new_versions)
        self.suite_tools.kill_point("commit")
        return saved


def build(args: RunnerArgs, tools: Tools, saver: SqliteSaver) -> Any:
    llm = ChatOpenAI(
        model=MODEL,
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        timeout=client_timeout_s(),
    ).bind_tools(openai_tools(args.spec))

    def llm_call(state: State) -> dict[str, Any]:
        reply = llm.invoke(state["messages"])
        tools.kill_point("model")
        return {"messages": [reply]}

    def tool_node(state: State) -> dict[str, Any]:
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
    return graph.compile(checkpointer=saver)


def run(args: RunnerArgs) -> int:
    """Start or resume the run's thread; 0 when the model called ``finish``."""
    tools = Tools(args)
    conn = sqlite3.connect(args.state_file(".langgraph.sqlite"), check_same_thread=False)
    agent = build(args, tools, KillPointSaver(conn, tools))
    # Two supersteps (llm_call, tool_node) per model call.
    config: Any = {
        "configurable": {"thread_id": args.label},
        "recursion_limit": 2 * args.max_steps + 4,
    }
    snapshot = agent.get_state(config)
    if not snapshot.values:
        task = [SystemMessage(args.spec.instructions), HumanMessage(args.task_text)]
        given: Any = {"messages": task, "finished": False}
    elif snapshot.interrupts:
        given = Command(resume=_review(tools, snapshot.interrupts))
    else:
        given = None  # resume after a crash: the same thread, no new input
    while True:
        agent.invoke(given, config)
        snapshot = agent.get_state(config)
        if not snapshot.interrupts:
            break
        given = Command(resume=_review(tools, snapshot.interrupts))
    if snapshot.values.get("finished"):
        return 0
    last = snapshot.values["messages"][-1]
    why = "invalid tool call" if getattr(last, "invalid_tool_calls", None) else "no tool call"
    print(f"{args.label}: the graph ended without finish ({why})", file=sys.stderr)
    return 1


def _review(tools: Tools, interrupts: Any) -> bool:
    asked = interrupts[0].value
    return tools.wait_for_approval(asked["key"], asked["tool"], asked["arguments"])


if __name__ == "__main__":
    sys.exit(run(parse_args(description=__doc__)))
