"""``durable(app, agent)``: an ``agents.Agent`` as a registered mainspring workflow.

The workflow calls ``Runner.run`` from the top on every execution, a recovery's
included; what makes that durable is that every call leaving the process goes
through the journal (:mod:`._model`, :mod:`._tools`), so a replay takes the same
path, answered from the journal, up to where the run stopped, and goes on live.
Nothing depends on the SDK's sessions or on a saved ``RunState``.

- Model calls: the run's ``RunConfig.model_provider`` resolves model names to
  :class:`~._model.JournaledModel`; agents holding a ``Model`` object (the starting
  agent and every agent its handoffs reach) are cloned around a journaled one.
- Function tools: every function tool a model is offered in a durable run (the
  agent's, a handoff target's, a nested agent-as-tool's, an MCP server's) runs as a
  journaled tool step; approvals (the SDK's ``needs_approval`` interruptions, and
  ``irreversible`` tools) are mainspring approvals: durable waits.
- Handoffs and agents as tools stay in the run: one journal, one trace, one budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, cast

import openai
from agents import Agent, Handoff, ModelProvider, MultiProvider, RunConfig, Runner
from agents import Model as SDKModel
from agents.run import DEFAULT_MAX_TURNS
from agents.run_config import ToolExecutionConfig

import mainspring as ms
from mainspring import ConfigError
from mainspring.limits import Limits, Price

from ._active import _ACTIVE, Active, Effect, active
from ._model import JournaledProvider, wrap_model
from ._tools import EFFECTS, JournaledMCPServer, effect_of, parsed

__all__ = ["durable"]


class _Graph:
    """Clones of the agents a run can reach (handoffs, followed through cycles)
    whose ``Model`` objects and MCP servers are journaled; agents without either are
    cloned too, so that a handoff to them keeps reaching clones."""

    def __init__(self, effects: dict[str, Effect]) -> None:
        self.effects = effects
        self.memo: dict[int, Agent[Any]] = {}

    def agent(self, a: Agent[Any]) -> Agent[Any]:
        found = self.memo.get(id(a))
        if found is not None:
            return found
        clone = a.clone()
        self.memo[id(a)] = clone
        if isinstance(a.model, SDKModel):
            clone.model = wrap_model(a.model, active)
        servers: list[Any] = []
        for s in a.mcp_servers:
            if not isinstance(s, JournaledMCPServer):
                kind = effect_of(s, s.name, self.effects)
                self.effects.setdefault(s.name, kind)  # its tools' effect (see _invoke)
                s = JournaledMCPServer(s, kind, active)
            servers.append(s)
        clone.mcp_servers = servers
        clone.handoffs = [self.handoff(h) for h in a.handoffs]
        return clone

    def handoff(self, h: Agent[Any] | Handoff[Any, Any]) -> Any:
        if isinstance(h, Agent):
            return self.agent(h)
        original = h.on_invoke_handoff

        async def invoke(run_ctx: Any, input_json: str) -> Any:
            target = await original(run_ctx, input_json)
            return self.agent(target) if isinstance(target, Agent) else target

        return dataclasses.replace(h, on_invoke_handoff=invoke)


def durable(
    app: ms.App,
    agent: Agent[Any],
    *,
    name: str | None = None,
    effects: Mapping[str, Effect] | None = None,
    limits: Limits | None = None,
    run_config: RunConfig | None = None,
    max_turns: int = DEFAULT_MAX_TURNS,
    context: Callable[[], Any] | None = None,
    stream: bool = False,
    openai_client: openai.AsyncOpenAI | None = None,
    account: str = "default",
    prices: dict[str, Price] | None = None,
) -> ms.Workflow[[str | list[dict[str, Any]]], Any]:
    """Register an existing ``agents.Agent`` as a durable mainspring workflow.

    ::

        support = durable(app, agent, name="support")
        run = app.submit(support, "Refund order 7", key="t-7")

    The run's input is what ``Runner.run`` takes (a string, or a list of input
    items); its output is the agent's ``final_output`` as JSON (an ``output_type``
    model becomes its dict).

    Args:
        app: the App to register on.
        agent: the starting agent, unchanged (the run uses journaled clones).
        name: the workflow's name (default: the agent's name). Keep it stable while
            runs are in flight.
        effects: effect class by tool name (``"read"``, ``"write"``,
            ``"irreversible"``), for function tools and MCP servers (by the
            server's name); wins over ``@effect``. Undeclared: ``"write"``.
        limits: budgets across the SDK's turns (``max_steps`` counts model calls;
            ``max_tool_calls``, ``max_tokens``, ``max_cost_usd``, ``on_exceeded``,
            ``max_rate_wait_s``).
        run_config: the SDK's ``RunConfig``; its ``model_provider`` (the SDK's
            default when not given) is wrapped, and function tools of one reply run
            one after the other, in the journal's order.
        max_turns: the SDK's own turn cap.
        context: builds the SDK's run context (your dependencies) for each
            execution; it is not journaled.
        stream: stream each model reply, its text going to the run's live token
            stream (``ctx.token_writer()``, ``mainspring tail``, SSE).
        openai_client: the client whose settings (base URL, key) the SDK's default
            provider uses; mainspring derives one per event loop, without retries
            and with a hook that reads the rate-limit headers.
        account: the rate-limit account model calls book against.
        prices: USD per million tokens by model id (default: mainspring's table).

    Raises:
        ConfigError: an effect that is not one of the three.
    """
    effects = dict(effects or {})
    for tool, kind in effects.items():
        if kind not in EFFECTS:
            raise ConfigError(f"effects[{tool!r}] must be one of {EFFECTS}, got {kind!r}")
    base = run_config or RunConfig()
    # The SDK's default provider is rebuilt on mainspring's client (the rate-limit
    # headers); a provider of the user's own is kept as it is.
    own = base.model_provider if type(base.model_provider) is not MultiProvider else None
    provider: ModelProvider = JournaledProvider(
        own,
        openai_client,
        active,
        default_model=agent.model if isinstance(agent.model, str) else "default",
    )
    rc_model = base.model
    if isinstance(rc_model, SDKModel):
        rc_model = wrap_model(rc_model, active)
    config = dataclasses.replace(
        base,
        model=rc_model,
        model_provider=provider,
        tool_execution=ToolExecutionConfig(max_function_tool_concurrency=1),
    )
    start = _Graph(effects).agent(agent)
    wf_name = name or agent.name
    bound: list[Any] = []

    async def run_agent(ctx: ms.RunContext, input: str | list[dict[str, Any]]) -> Any:
        if not bound:
            bound.append(
                app.rate_limits.bind(lambda: app.store, app.clock)
                if app.rate_limits is not None
                else None
            )
        state = Active(
            ctx=ctx,
            app=app,
            effects=effects,
            limits=limits,
            stream=stream,
            account=account,
            prices=prices,
            rate_limits=bound[0],
        )
        token = _ACTIVE.set(state)
        try:
            given = context() if context is not None else None
            result = await Runner.run(
                start, cast(Any, input), context=given, run_config=config, max_turns=max_turns
            )
            while result.interruptions:
                # The SDK paused for approvals (needs_approval): ask mainspring's way,
                # a durable wait, then resume the same in-memory state.
                run_state = result.to_state()
                for item in result.interruptions:
                    call_id = str(item.call_id or item.tool_name or "tool")
                    decision = await ctx.approval(
                        call_id,
                        title=f"run the tool {item.tool_name!r}?",
                        preview={"tool": item.tool_name, "arguments": parsed(item.arguments or "")},
                    )
                    if decision.approved:
                        state.approved.add(call_id)
                        run_state.approve(item)
                    else:
                        why = f": {decision.reason}" if decision.reason else ""
                        run_state.reject(item, rejection_message=f"Rejected by a human{why}.")
                result = await Runner.run(
                    start, run_state, context=given, run_config=config, max_turns=max_turns
                )
        finally:
            _ACTIVE.reset(token)
        return _jsonable(result.final_output)

    run_agent.__name__ = run_agent.__qualname__ = wf_name
    return app.workflow(name=wf_name)(run_agent)


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return value
