"""The OpenAI Agents SDK on mainspring: the bare peer's agent (agents_sdk.py's
``build``, unchanged) made durable with ``durable(app, agent)``.

What differs from the bare peer is only what ``durable`` brings:

- **Journal** instead of ``SQLiteSession``: a mainspring App on a SQLite file in
  ``--state``; each model reply and each tool result is a journal row, committed as it
  happens. A restarted process submits the same run (key = the label), and a worker
  replays the journal: no completed model call is paid again, no completed tool call
  made again; a tool call a kill cut short runs again under the same idempotency key
  (``mainspring.current_step().idempotency_key``, what the world dedupes by).
- **Approvals**: the SDK's ``needs_approval`` interruptions become mainspring requests
  (durable waits); this runner relays them to the suite's reviewer by call id, as the
  bare peer does, and answers them with ``app.answer``.
- **Retries**: the agent's ``openai`` client keeps its own (unchanged agent); what
  still fails is retried by mainspring's model step (its default policy: 8 attempts,
  1 s doubling to 30 s), and a 429 is waited out without spending an attempt.

Kill points: ``"model"`` after each live model reply (inside the journaled step, before
it is journaled; a replayed reply meets none); ``"commit"`` after each journal commit.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from _common import MODEL, RunnerArgs, Tools, parse_args
from agents import Agent, set_tracing_disabled
from agents import Model as SDKModel
from agents_sdk import build

import mainspring as ms
from mainspring.integrations.openai_agents import durable
from mainspring.storage import open_store
from mainspring.testing import FaultyStore

POLL_S = 0.05


class KillAfterReply(SDKModel):
    """The ``"model"`` kill point around the SDK's model: after a live reply arrived."""

    def __init__(self, inner: SDKModel, tools: Tools) -> None:
        self.inner, self.tools, self.model = inner, tools, MODEL

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        reply = await self.inner.get_response(*args, **kwargs)
        self.tools.kill_point("model")
        return reply

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.stream_response(*args, **kwargs)


class KillingStore(FaultyStore):
    """The ``"commit"`` kill point: right after each commit of the run's rows returns."""

    def __init__(self, inner: Any, tools: Tools) -> None:
        super().__init__(inner)
        self.tools = tools

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = getattr(self.inner, method)(*args, **kwargs)
        if method == "commit" and any(r.ok for r in result):
            self.tools.kill_point("commit")
        return result


def durable_agent(args: RunnerArgs, tools: Tools) -> tuple[ms.App, Any]:
    """The bare peer's agent, unchanged but for the ``"model"`` kill point, made
    durable. Its tools key the world's calls by call id, as in the bare peer: on
    mainspring a call id is stable across crashes (the reply that carries it is
    journaled), so it serves as the idempotency key."""
    agent: Agent[Any] = build(args, tools)
    assert isinstance(agent.model, SDKModel)
    agent = agent.clone(model=KillAfterReply(agent.model, tools))
    store = KillingStore(open_store(f"sqlite:///{args.state_file('.mainspring.db')}"), tools)
    app = ms.App(store, lease_s=2.0, poll_interval_s=0.05, max_recoveries=1000)
    return app, durable(app, agent, name=args.task, max_turns=args.max_steps)


async def run(args: RunnerArgs) -> int:
    """Start or resume the run; 0 when the model called ``finish``."""
    set_tracing_disabled(True)
    tools = Tools(args)
    app, workflow = durable_agent(args, tools)
    handle = app.submit(workflow, args.task_text, key=args.label)
    worker = app.worker()
    while True:
        await worker.run(until_idle=True)
        run = app.get_run(handle.run_id)
        if run.status == "succeeded":
            return 0 if await handle.result() == "done" else 1
        if run.status in ("failed", "cancelled"):
            rows = [f"{r.seq}:{r.kind}:{r.name}:{r.status}" for r in app.observe.steps(run.id)[:12]]
            print(f"gave up: {run.error} (journal: {rows})", file=sys.stderr)
            return 1
        if run.status == "waiting":
            await _review(app, handle.run_id, tools)
        await asyncio.sleep(POLL_S)  # a dead process's lease, a sleep's end


async def _review(app: ms.App, run_id: str, tools: Tools) -> None:
    """The run's approval requests, relayed to the suite's reviewer by call id."""
    for request in app.requests(run_id):
        if not request.id.startswith("approval:"):
            continue
        preview: Any = request.preview or {}
        key = request.id.removeprefix("approval:")
        arguments = preview.get("arguments") if isinstance(preview, dict) else None
        approved = await asyncio.to_thread(
            tools.wait_for_approval, key, str(preview.get("tool")), _text(arguments)
        )
        app.answer(run_id, request.id, decision="approve" if approved else "reject")


def _text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return asyncio.run(run(parse_args(argv, description=__doc__)))
    except Exception as e:
        print(f"gave up: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
