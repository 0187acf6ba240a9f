"""The OpenAI Agents SDK: ``Runner.run`` with a ``SQLiteSession`` and its approvals.

Written from the SDK's docs: an ``Agent`` on ``OpenAIChatCompletionsModel`` with a
custom ``AsyncOpenAI(base_url=...)`` (tracing off, as the docs say for other
providers), the task's tools as ``FunctionTool``s built from their JSON schemas (the
docs' custom function tools), ``finish`` ending the run through
``tool_use_behavior=StopAtTools``, and ``max_turns`` = ``--max-steps``.

- **Session**: ``SQLiteSession(label, <file in --state>)``: the SDK saves each turn's
  items (the model's tool call and the tool's output) after the turn's tools ran.
- **Crashes**: a restarted process runs the same agent on the same session; the session
  gives the model its history, so the run goes on with no new input (``[]``). A turn
  the session had not saved is lost: its model call is paid again and its tool call,
  asked again, comes with a new call id (a new idempotency key).
- **Approvals**: approval tools have ``needs_approval=True``: the run stops with
  ``result.interruptions``; the runner saves ``result.to_state().to_string()`` in
  ``--state`` (the human-in-the-loop docs' pattern), asks the reviewer
  (``SuiteFaults.request_approval``, keyed by the call id), polls, then
  ``state.approve(item)`` or ``state.reject(item)`` and ``Runner.run(agent, state)``.
  A restarted process reloads the saved ``RunState`` (``RunState.from_string``) while
  the session holds no output of the interrupted call, the pending call that the SDK
  saved in the session at the interruption (so a kill after the approved call ran
  but before the session saved its output runs it again, under the same call id);
  once the session has that output, the snapshot is older than the session and the
  run resumes from the session instead.
- **Retries**: the ``openai`` client's, at its defaults (``max_retries=2``: three
  attempts on connection errors, timeouts, 408, 409, 429 and 5xx, exponential
  back-off from 0.5 s honouring ``retry-after``); the SDK's own runner-managed model
  retry (``ModelSettings(retry=...)``) is opt-in and stays off. A call that still fails
  raises out of ``Runner.run``: the run gave up (exit 1).
- **Timeout**: ``AsyncOpenAI(timeout=...)`` = the suite server's ``client_timeout_s``.
- **Arguments** that do not parse go back to the model as the SDK's default tool error
  text (``default_tool_error_function``: "An error occurred while running the tool.
  Please try again."), as for its ``@function_tool`` tools; the world checks the rest.

Kill points: ``"model"`` in ``RunHooks.on_llm_end``; ``"commit"`` after each
``SQLiteSession.add_items`` returns.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from _common import FINISH, MODEL, RunnerArgs, Tools, client_timeout_s, dumps, parse_args
from agents import (
    Agent,
    FunctionTool,
    OpenAIChatCompletionsModel,
    RunHooks,
    Runner,
    RunState,
    SQLiteSession,
    default_tool_error_function,
    set_tracing_disabled,
)
from agents.agent import StopAtTools
from agents.tool_context import ToolContext
from openai import AsyncOpenAI


class KillPointSession(SQLiteSession):
    """``SQLiteSession`` with the suite's ``"commit"`` kill point after each write."""

    def __init__(self, session_id: str, db_path: str, tools: Tools) -> None:
        super().__init__(session_id, db_path)
        self.suite_tools = tools

    async def add_items(self, items: list[Any]) -> None:
        await super().add_items(items)
        self.suite_tools.kill_point("commit")


class ModelKillPoint(RunHooks[Any]):
    """The suite's ``"model"`` kill point, right after each model reply."""

    def __init__(self, tools: Tools) -> None:
        self.suite_tools = tools

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        self.suite_tools.kill_point("model")


def _function_tool(
    tools: Tools, name: str, description: str, schema: dict[str, Any], approval: bool
) -> FunctionTool:
    async def invoke(ctx: ToolContext[Any], raw: str) -> str:
        if name == FINISH.name:
            return "done"
        try:
            arguments = json.loads(raw)
            if not isinstance(arguments, dict):
                raise ValueError(f"{name} arguments must be a JSON object")
        except ValueError as e:
            return default_tool_error_function(ctx, e)
        return dumps(await asyncio.to_thread(tools.call, name, arguments, ctx.tool_call_id))

    return FunctionTool(
        name=name,
        description=description,
        params_json_schema=schema,
        on_invoke_tool=invoke,
        needs_approval=approval,
    )


def build(args: RunnerArgs, tools: Tools) -> Agent[Any]:
    client = AsyncOpenAI(
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        timeout=client_timeout_s(),
    )
    return Agent(
        name=args.task,
        instructions=args.spec.instructions,
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        tools=[
            _function_tool(tools, t.name, t.description, t.parameters, t.approval)
            for t in (*args.spec.tools, FINISH)
        ],
        tool_use_behavior=StopAtTools(stop_at_tool_names=[FINISH.name]),
    )


async def run(args: RunnerArgs) -> int:
    """Start or resume the run; 0 when the model called ``finish``."""
    set_tracing_disabled(True)
    tools = Tools(args)
    agent = build(args, tools)
    session = KillPointSession(args.label, args.state_file(".agents.sqlite"), tools)
    saved = Path(args.state_file(".runstate.json"))
    paused = await asyncio.to_thread(_read, saved)
    state = None if paused is None else await RunState.from_string(agent, paused)
    if state is not None and await _ran(session, state):
        state = None  # the approved calls ran after it was saved: the session is newer
    given: Any
    if state is not None:
        given = await _review(tools, state, saved)
    elif await session.get_items(limit=1):
        given = []  # resume: the session holds the history
    else:
        given = args.task_text
    hooks = ModelKillPoint(tools)
    while True:
        result = await Runner.run(
            agent, given, session=session, max_turns=args.max_steps, hooks=hooks
        )
        if not result.interruptions:
            break
        given = await _review(tools, result.to_state(), saved)
    await asyncio.to_thread(saved.unlink, missing_ok=True)
    return 0 if result.final_output == "done" else 1


async def _review(tools: Tools, state: Any, saved: Path) -> Any:
    """Save the paused run, get the reviewer's decisions, apply them to the state."""
    await asyncio.to_thread(_write, saved, state.to_string())
    for item in state.get_interruptions():
        call = item.raw_item
        approved = await asyncio.to_thread(
            tools.wait_for_approval, call.call_id, call.name, call.arguments
        )
        if approved:
            state.approve(item)
        else:
            state.reject(item)
    return state


async def _ran(session: SQLiteSession, state: Any) -> bool:
    """Whether the session holds an output of the paused run's interrupted calls."""
    asked = {item.raw_item.call_id for item in state.get_interruptions()}
    return any(
        item.get("type") == "function_call_output" and item.get("call_id") in asked
        for item in await session.get_items()
    )


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a kill leaves the old state or the new one, never half


def main() -> int:
    try:
        return asyncio.run(run(parse_args(description=__doc__)))
    except Exception as e:  # MaxTurnsExceeded, a model call that failed for good, ...
        print(f"gave up: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
