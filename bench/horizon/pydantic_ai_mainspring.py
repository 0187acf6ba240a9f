"""Pydantic AI on mainspring: a plain ``pydantic_ai.Agent`` made durable with
``mainspring.integrations.pydantic_ai.durable``, one run per runner process.

The agent is what Pydantic AI's docs show: ``OpenAIChatModel`` on an
``OpenAIProvider(base_url=...)``, the task's tools as ``Tool.from_schema`` tools (the
approval tools with ``requires_approval=True``), ``finish`` as the output tool
(``ToolOutput``). The runner then adds the few lines the integration asks for:

- ``durable(app, agent, limits=Limits(max_steps=--max-steps, on_exceeded="stop"),
  usage_limits=UsageLimits(request_limit=None))`` (Pydantic AI's default cap of 50
  requests would end a 100-step run; ``--max-steps`` is the budget) on
  an App over a SQLite file in ``--state`` (a 5 s lease), and ``app.run(flow, task,
  key=label)``: each model request and tool call is a journaled step. A run this
  process lost (its event loop stalled past the lease on a busy machine) is run again
  with the same key; only a run that failed (``RunFailed``) ends the runner with 1.
- **Crashes**: the restarted runner calls ``app.run`` with the same key: the same run,
  replayed from its journal once the dead process's lease (5 s) ran out; completed
  model requests are not sent again, and a tool call the kill interrupted is made again
  under the same idempotency key (the step's key, what the tools pass to the world).
- **Approvals**: ``app.run`` raises ``RunWaiting`` at a ``requires_approval`` call;
  the runner asks the reviewer (``SuiteFaults.request_approval``, keyed by the request
  id), answers the request (``app.answer``), and calls ``app.run`` again.
- **Retries**: mainspring's: the SDK's own are off; transient errors and timeouts back
  off and retry (8 attempts), a 429 waits as long as the provider asks.
- **Timeout**: ``ModelSettings(timeout=...)`` = the suite server's ``client_timeout_s``.

Kill points: ``"model"`` right after each reply arrives, inside the model step (a
``WrapperModel`` around the agent's model); ``"commit"`` after each commit of the
journal (a ``FaultyStore`` around the App's store); ``"tool"`` in the world.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

# This repository's mainspring (the integration is part of it), before any installed one.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _common import FINISH, MODEL, RunnerArgs, Tools, client_timeout_s, parse_args
from pydantic import BaseModel
from pydantic_ai import Agent, Tool, ToolOutput
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

import mainspring as ms
from mainspring.integrations.pydantic_ai import durable
from mainspring.storage import SQLiteStore
from mainspring.testing import FaultyStore


class Finish(BaseModel):
    answer: str


class KillAfterReply(WrapperModel):
    """The suite's ``"model"`` kill point, after each reply, inside the model step."""

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


def build(args: RunnerArgs, tools: Tools) -> Agent[None, Finish]:
    model = OpenAIChatModel(
        MODEL,
        provider=OpenAIProvider(
            base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"]
        ),
        settings=ModelSettings(timeout=client_timeout_s()),
    )
    agent_tools = []
    for t in args.spec.tools:

        def call(_name: str = t.name, **arguments: Any) -> dict[str, Any]:
            return tools.call(_name, arguments, ms.current_step().idempotency_key)

        tool = Tool.from_schema(call, t.name, t.description, t.parameters)
        tool.requires_approval = t.approval
        agent_tools.append(tool)
    return Agent(
        KillAfterReply(model, tools),
        name=args.task,
        instructions=args.spec.instructions,
        tools=agent_tools,
        output_type=ToolOutput(Finish, name=FINISH.name, description=FINISH.description),
    )


async def run(args: RunnerArgs) -> int:
    """Start or resume the run; 0 when the model called ``finish``."""
    tools = Tools(args)
    store = FaultyStore(
        SQLiteStore(args.state_file(".mainspring.db")),
        after_call=lambda method, *_: tools.kill_point("commit") if method == "commit" else None,
    )
    app = ms.App(store, lease_s=5.0, poll_interval_s=0.02)
    flow = durable(
        app,
        build(args, tools),
        limits=ms.Limits(max_steps=args.max_steps, on_exceeded="stop"),
        usage_limits=UsageLimits(request_limit=None),  # the budget is --max-steps
    )
    stalls = 0
    while True:
        try:
            await app.run(flow, args.task_text, key=args.label)
            return 0
        except ms.RunWaiting:
            for request in app.requests():
                preview = request.preview or {}
                approved = await asyncio.to_thread(
                    tools.wait_for_approval,
                    request.id,
                    str(preview.get("tool", "")),
                    str(preview.get("arguments", "")),
                )
                app.answer(request.run_id, request.id, decision="approve" if approved else "reject")
        except ms.RunFailed:
            raise
        except Exception as e:
            # The run is durable: this process losing it (its loop stalled past the
            # lease on a busy machine, the store busy) is not the run failing.
            stalls += 1
            if stalls > 20:
                raise
            print(f"{args.label}: {type(e).__name__}: {e}; running it again", file=sys.stderr)
            await asyncio.sleep(1.0)


def main() -> int:
    try:
        return asyncio.run(run(parse_args(description=__doc__)))
    except Exception as e:  # a budget reached, a request that failed for good, ...
        print(f"gave up: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
