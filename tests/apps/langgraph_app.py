"""A ReAct-style LangGraph agent on mainspring, for the integration tests.

The graph: ``model`` (a LangChain chat model over the official ``openai`` SDK, tools
bound) -> ``review`` (``interrupt()`` before the irreversible ``refund``) -> ``tools``
(an effect per call, keyed by the node's idempotency key) -> ``model`` ... and, once the
model answers without tools, ``report``: a subgraph (``draft`` -> ``send``, an effect),
which runs as a child run.

Environment: MAINSPRING_DATABASE_URL (the store), OPENAI_BASE_URL (the fake server),
MAINSPRING_TEST_LEDGER (effects, once per key) and MAINSPRING_TEST_EXECS (every node
execution, counted per idempotency key), MAINSPRING_TEST_LEASE_S,
MAINSPRING_TEST_TOOL_DELAY_S (a pause after each tool effect).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import time
from typing import Annotated, Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt
from openai import AsyncOpenAI
from typing_extensions import TypedDict

import mainspring as ms
from mainspring.integrations.langgraph import DurableGraph, durable
from mainspring.testing import EffectLedger

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.capitalize()} an order.",
            "parameters": {
                "type": "object",
                "properties": {"order": {"type": "integer"}},
                "required": ["order"],
            },
        },
    }
    for name in ("charge", "refund")
]


class OpenAIChat(BaseChatModel):
    """A LangChain chat model over the official ``openai`` SDK (what ``ChatOpenAI``
    does, in a few lines: ``langchain-openai`` is not a test dependency): tool calls,
    arguments that do not parse as ``invalid_tool_calls``, usage."""

    model: str = "gpt-4.1-mini"
    base_url: str
    tools: list[dict[str, Any]] = []  # noqa: RUF012 (pydantic copies field defaults)

    @property
    def _llm_type(self) -> str:
        return "openai-sdk"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return LangSmithParams(ls_provider="openai", ls_model_name=self.model, ls_model_type="chat")

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise NotImplementedError("call it with ainvoke")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        async with AsyncOpenAI(base_url=self.base_url, api_key="sk-test", max_retries=0) as client:
            reply = await client.chat.completions.create(
                model=self.model,
                messages=convert_to_openai_messages(messages),  # type: ignore[arg-type]
                tools=self.tools,  # type: ignore[arg-type]
            )
        said = reply.choices[0].message
        calls, invalid = [], []
        for call in said.tool_calls or []:
            try:
                args = json.loads(call.function.arguments)
                calls.append({"name": call.function.name, "args": args, "id": call.id})
            except ValueError as exc:
                invalid.append(
                    {
                        "name": call.function.name,
                        "args": call.function.arguments,
                        "id": call.id,
                        "error": str(exc),
                        "type": "invalid_tool_call",
                    }
                )
        usage = reply.usage
        message = AIMessage(
            content=said.content or "",
            tool_calls=calls,
            invalid_tool_calls=invalid,
            usage_metadata={
                "input_tokens": usage.prompt_tokens if usage else 0,
                "output_tokens": usage.completion_tokens if usage else 0,
                "total_tokens": usage.total_tokens if usage else 0,
            },
            response_metadata={"model_name": self.model},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    report: str


class ReportState(TypedDict):
    messages: list[AnyMessage]
    report: str


def build(
    app: ms.App,
    *,
    base_url: str,
    ledger: str,
    execs: str,
    after_effect: Any = None,
    **options: Any,
) -> DurableGraph:
    """The agent's graph, registered on ``app`` as the workflow ``orders``
    (``after_effect(key)``: called after each tool effect; ``options``: durable()'s)."""
    effects, executions = EffectLedger(ledger), EffectLedger(execs)
    delay_s = float(os.environ.get("MAINSPRING_TEST_TOOL_DELAY_S", "0"))
    llm = OpenAIChat(base_url=base_url, tools=TOOLS)

    def executed(node: str) -> str:
        key = ms.current_step().idempotency_key
        executions.apply_unsafe(key, node)
        return key

    async def model(state: State) -> dict[str, Any]:
        executed("model")
        return {"messages": [await llm.ainvoke(state["messages"])]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "review" if getattr(last, "tool_calls", None) else "report"

    def review(state: State) -> Command[Any]:
        executed("review")
        calls = state["messages"][-1].tool_calls  # type: ignore[union-attr]
        refunds = [c["args"] for c in calls if c["name"] == "refund"]
        if refunds and not interrupt({"refund": refunds}):
            rejected = [ToolMessage("the reviewer said no", tool_call_id=c["id"]) for c in calls]
            return Command(goto="model", update={"messages": rejected})
        return Command(goto="tools")

    def tools(state: State) -> dict[str, Any]:
        key = executed("tools")
        out = []
        for i, call in enumerate(state["messages"][-1].tool_calls):  # type: ignore[union-attr]
            effects.apply(f"{key}:{i}", call["name"], call["args"])
            if after_effect is not None:
                after_effect(f"{key}:{i}")
            if delay_s:  # a window after the effect, before the node's end is journaled
                time.sleep(delay_s)
            out.append(
                ToolMessage(json.dumps({"ok": True, **call["args"]}), tool_call_id=call["id"])
            )
        return {"messages": out}

    def draft(state: ReportState) -> dict[str, Any]:
        executed("draft")
        return {"report": f"{len(state['messages'])} messages"}

    def send(state: ReportState) -> dict[str, Any]:
        key = executed("send")
        effects.apply(key, "report", state["report"])
        return {"report": f"sent: {state['report']}"}

    sub = StateGraph(ReportState)
    sub.add_node("draft", draft)
    sub.add_node("send", send)
    sub.add_edge(START, "draft")
    sub.add_edge("draft", "send")
    sub.add_edge("send", END)

    graph = StateGraph(State)
    graph.add_node("model", model)
    graph.add_node("review", review, destinations=("tools", "model"))
    graph.add_node("tools", tools)
    graph.add_node("report", sub.compile())
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["review", "report"])
    graph.add_edge("tools", "model")
    graph.add_edge("report", END)
    return durable(app, graph.compile(), name="orders", **options)


def policy(items: int, *, refund_at: int | None = None, malformed_at: int | None = None) -> Any:
    """The fake model's replies, a function of the conversation: one ``charge`` per
    tool result so far (``refund`` at ``refund_at``), then a text; at ``malformed_at``
    the first reply's arguments are not JSON (a repair asks again)."""
    from mainspring.testing import FakeOpenAIServer

    spoiled: set[str] = set()

    def reply(request: Any) -> Any:
        messages = request.body["messages"]
        done = sum(1 for m in messages if m["role"] == "tool")
        task = next(m["content"] for m in messages if m["role"] == "user")
        if done >= items:
            return FakeOpenAIServer.text(f"all {items} orders done")
        if done == malformed_at and f"{task}:{done}" not in spoiled:
            spoiled.add(f"{task}:{done}")
            return FakeOpenAIServer.tool_call("charge", '{"order": 3,,}')
        name = "refund" if done == refund_at else "charge"
        return FakeOpenAIServer.tool_call(name, {"order": done})

    return reply


if "MAINSPRING_TEST_LEDGER" in os.environ:  # a worker process's
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a stalled test asks
    # Killed every second or so, a run may be recovered many times before it moves on:
    # it is not a poison run (as the lab's suite, which kills as often).
    app = ms.App(
        lease_s=float(os.environ.get("MAINSPRING_TEST_LEASE_S", "1.0")),
        poll_interval_s=0.05,
        max_recoveries=100,
    )
    orders = build(
        app,
        base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:9/v1"),
        ledger=os.environ["MAINSPRING_TEST_LEDGER"],
        execs=os.environ["MAINSPRING_TEST_EXECS"],
    )
