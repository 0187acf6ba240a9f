"""Pydantic AI, bare: ``agent.iter`` with the message history kept in a file, and its
deferred tools for approvals.

Written from Pydantic AI's docs: an ``Agent`` on ``OpenAIChatModel`` with an
``OpenAIProvider(base_url=...)``, the task's tools as ``Tool.from_schema`` tools (the
approval tools with ``requires_approval=True``), ``finish`` as the output tool
(``ToolOutput``), and ``DeferredToolRequests`` as the other output type.

- **History**: Pydantic AI keeps no state of its own; the docs' way to continue a
  conversation is ``message_history``. The runner drives the run with ``agent.iter``
  and writes the history (``ModelMessagesTypeAdapter``, atomically) each time a model
  request is about to be sent: the replies so far and the tool results they led to.
- **Crashes**: a restarted process continues from the saved history
  (``agent.iter(None, message_history=...)``). A turn whose tool results were not
  saved is lost: its model call is paid again and its tool calls, asked again, come
  with new call ids (new idempotency keys).
- **Approvals**: the run ends with ``DeferredToolRequests``; the runner saves the
  history, asks the reviewer (``SuiteFaults.request_approval``, keyed by the call id),
  and continues with ``deferred_tool_results`` (the deferred-tools docs' pattern). A
  restart while paused asks again (the reviewer's answer is kept by key).
- **Retries**: the ``openai`` client's, at its defaults (``max_retries=2``); a call
  that still fails raises out of the run: the run gave up (exit 1).
- **Timeout**: ``ModelSettings(timeout=...)`` = the suite server's ``client_timeout_s``.

Kill points: ``"model"`` after each reply (a ``WrapperModel``); ``"commit"`` after each
write of the history.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from _common import FINISH, MODEL, RunnerArgs, Tools, client_timeout_s, parse_args
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext, Tool, ToolOutput
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    ToolCallPart,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults


class Finish(BaseModel):
    answer: str


class KillAfterReply(WrapperModel):
    """The suite's ``"model"`` kill point, right after each reply."""

    def __init__(self, wrapped: Any, tools: Tools) -> None:
        super().__init__(wrapped)
        self.suite_tools = tools

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        reply = await super().request(messages, model_settings, model_request_parameters)
        self.suite_tools.kill_point("model")
        return reply


def build(args: RunnerArgs, tools: Tools) -> Agent[None, Any]:
    model = OpenAIChatModel(
        MODEL,
        provider=OpenAIProvider(
            base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"]
        ),
        settings=ModelSettings(timeout=client_timeout_s()),
    )
    agent_tools = []
    for t in args.spec.tools:

        def call(ctx: RunContext[None], _name: str = t.name, **arguments: Any) -> dict[str, Any]:
            assert ctx.tool_call_id is not None
            return tools.call(_name, arguments, ctx.tool_call_id)

        tool = Tool.from_schema(call, t.name, t.description, t.parameters, takes_ctx=True)
        tool.requires_approval = t.approval
        agent_tools.append(tool)
    return Agent(
        KillAfterReply(model, tools),
        name=args.task,
        instructions=args.spec.instructions,
        tools=agent_tools,
        output_type=[
            ToolOutput(Finish, name=FINISH.name, description=FINISH.description),
            DeferredToolRequests,
        ],
    )


async def run(args: RunnerArgs) -> int:
    """Start or continue the run; 0 when the model called ``finish``."""
    tools = Tools(args)
    agent = build(args, tools)
    saved = Path(args.state_file(".history.json"))
    history = await asyncio.to_thread(_read, saved)
    prompt: str | None = None if history else args.task_text
    results: DeferredToolResults | None = None
    if history and history[-1].kind == "response":  # paused at an approval
        results = await _review(tools, history[-1])
    turns = sum(1 for m in history if m.kind == "response")
    while True:
        async with agent.iter(
            prompt, message_history=history or None, deferred_tool_results=results
        ) as agent_run:
            async for node in agent_run:
                if Agent.is_model_request_node(node):
                    turns += 1
                    if turns > args.max_steps:
                        print(f"{args.label}: gave up at {args.max_steps} calls", file=sys.stderr)
                        return 1
                    # What is about to be sent: the history so far and this request.
                    now = [*agent_run.all_messages(), node.request]
                    await asyncio.to_thread(_write, saved, now)
                    tools.kill_point("commit")
            result = agent_run.result
        assert result is not None
        history, prompt = result.all_messages(), None
        if isinstance(result.output, Finish):
            await asyncio.to_thread(saved.unlink, missing_ok=True)
            return 0
        await asyncio.to_thread(_write, saved, history)
        tools.kill_point("commit")
        results = await _review(tools, history[-1], result.output)


async def _review(
    tools: Tools, last: ModelMessage, requests: DeferredToolRequests | None = None
) -> DeferredToolResults:
    """The reviewer's decisions on the calls awaiting approval."""
    calls = (
        requests.approvals
        if requests is not None
        else [
            p
            for p in last.parts
            if isinstance(p, ToolCallPart) and tools.needs_approval(p.tool_name)
        ]
    )
    approvals: dict[str, bool] = {}
    for call in calls:
        approvals[call.tool_call_id] = await asyncio.to_thread(
            tools.wait_for_approval, call.tool_call_id, call.tool_name, call.args_as_json_str()
        )
    return DeferredToolResults(approvals=approvals)


def _read(path: Path) -> list[ModelMessage]:
    if not path.exists():
        return []
    return ModelMessagesTypeAdapter.validate_json(path.read_bytes())


def _write(path: Path, messages: list[ModelMessage]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(ModelMessagesTypeAdapter.dump_json(messages))
    os.replace(tmp, path)  # a kill leaves the old history or the new one, never half


def main() -> int:
    try:
        return asyncio.run(run(parse_args(description=__doc__)))
    except Exception as e:  # a model call that failed for good, a usage limit, ...
        print(f"gave up: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
