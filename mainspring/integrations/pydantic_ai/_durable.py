"""``durable(app, agent)``: an existing ``pydantic_ai.Agent`` as a registered workflow.

The workflow re-executes ``agent.run(...)`` from the top on every execution (a
recovery after a crash, a wake-up after a wait) with a :class:`~._run.Durability`
capability that journals each model request and tool call, so the turns already made
come back from the journal and the run goes on where it stopped. The agent itself is
not changed: the same object still runs as before outside mainspring.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import AsyncIterable, Callable, Collection, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import TypeAdapter
from pydantic_ai import Agent
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.capabilities import AbstractCapability, WrapRunHandler
from pydantic_ai.messages import AgentStreamEvent, ModelMessage
from pydantic_ai.models import Model as PaiModel
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import RunContext as PaiContext
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.usage import UsageLimits

from mainspring import App, ConfigError, Limits, RetryPolicy, RunContext, Workflow
from mainspring.limits import BoundRateLimits, Price

from ._run import Durability, RunSettings
from ._tools import DELEGATING, ToolRules

__all__ = ["durable"]

ParallelTools = Literal["parallel", "sequential", "parallel_ordered_events"]


@dataclass(eq=False)
class _Durable:
    """An agent made durable on an App: what delegation needs to find it."""

    agent: Agent[Any, Any]
    workflow: Workflow[..., Any]
    deps_input: bool  # its deps travel with the run's input (else a factory builds them)


# The agents made durable on each App: a tool of one that runs another makes a child run.
_REGISTRY: weakref.WeakKeyDictionary[App, list[_Durable]] = weakref.WeakKeyDictionary()


class _Deps:
    """Dependencies built by a factory once per process (per ``durable()``), shared
    by every run of the agent in it, as mainspring's own agents' ``deps=``."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._built = False
        self._value: Any = None

    def get(self) -> Any:
        with self._lock:
            if not self._built:
                self._value = self._factory()
                self._built = True
            return self._value


def durable(
    app: App,
    agent: Agent[Any, Any],
    *,
    name: str | None = None,
    deps: Callable[[], Any] | None = None,
    effects: Mapping[str, str] | None = None,
    delegates: Collection[str] = (),
    model: PaiModel | str | None = None,
    toolsets: Sequence[AbstractToolset[Any]] = (),
    usage_limits: UsageLimits | None = None,
    event_stream_handler: EventStreamHandler[Any] | None = None,
    stream: bool = False,
    limits: Limits | None = None,
    parallel_tools: ParallelTools = "parallel_ordered_events",
    rate_account: str = "default",
    model_retry: RetryPolicy | None = None,
    prices: dict[str, Price] | None = None,
) -> Workflow[..., AgentRunResult[Any]]:
    """Make an existing Pydantic AI agent durable: a workflow registered on ``app``.

    Run it like any workflow (``app.submit(support, "Refund order 7", key="t-7")``,
    ``app.run``, ``mainspring worker``, the HTTP API, ``mainspring lab run``); its
    result is the ``AgentRunResult`` the agent returns (``.output``,
    ``.all_messages()``), journaled as JSON. The workflow takes the prompt, and
    ``message_history=`` (a list of Pydantic AI messages) and, when the agent has a
    ``deps_type`` and no ``deps`` factory is given, ``deps=`` (journaled with the input).

    Args:
        app: the App to register on.
        agent: the agent, unchanged: it still runs as before outside mainspring.
        name: the workflow's name, its identity in the journal (default: the agent's
            ``name``). Keep it stable while runs are in flight.
        deps: a factory that builds the agent's dependencies once per worker process
            (a client, a pool: never journaled). Without it, ``deps=`` is part of the
            run's input and must be JSON data of the agent's ``deps_type``.
        effects: the effect class of each tool, by the name the model calls it:
            ``"read"``, ``"write"`` (the default: made again after a crash under the
            same idempotency key) or ``"irreversible"`` (never made twice, and only
            after a human approves). An MCP tool not named here takes its class from
            the server's annotations.
        delegates: tools that run other durable agents of this App (agent
            delegation): such a tool is not a step; each agent run it makes is a
            child run, with its own journal.
        model: the model to run with (default: the agent's).
        toolsets: more toolsets for every run, as ``agent.run(toolsets=...)`` takes them:
            their calls are journaled like the agent's own tools.
        usage_limits: Pydantic AI's own limits of each run, as ``agent.run`` takes them
            (default: Pydantic AI's, a ``request_limit`` of 50 model requests: pass
            ``UsageLimits(request_limit=None)`` for a long run, with ``limits=`` as its
            budget).
        event_stream_handler: a handler of the run's events, as ``agent.run`` takes it
            (default: the agent's own). It sees each event once per journaled step: a
            replay does not repeat what the steps the journal holds already delivered.
        stream: stream every model request, so that its text reaches the run's live
            token stream (``app.stream``, the API, the dashboard) as it forms. A
            request Pydantic AI streams itself (a handler) always does.
        limits: budgets of the run (``max_steps`` counts model requests; ``"ask"``
            pauses for a human, ``"stop"`` fails the run with ``BudgetExceeded``).
        parallel_tools: Pydantic AI's tool execution mode for the run.
        rate_account: which account's rate limits the model books against.
        model_retry: back-off of transient model errors (429s never spend it).
        prices: USD per million tokens by model id (default: ``mainspring.limits.PRICES``).

    Raises:
        ConfigError: a name already registered, an unknown effect class, or deps that
            cannot be journaled and no factory to build them.
    """
    if not isinstance(agent, Agent):
        raise ConfigError(f"durable() takes a pydantic_ai.Agent, got {agent!r:.100}")
    wf_name = name or agent.name
    if not wf_name:
        raise ConfigError(
            "durable(): the agent has no name; pass name=... (the workflow's name, kept in "
            "the journal)"
        )
    rules = ToolRules.build(wf_name, effects, delegates)
    deps_type = agent.deps_type
    deps_input = deps is None and deps_type is not type(None)
    if deps_input:
        _check_journalable(wf_name, deps_type)
    factory = _Deps(deps) if deps is not None else None

    def rate_limits() -> BoundRateLimits | None:
        if app.rate_limits is None:
            return None
        return app.rate_limits.bind(lambda: app.store, app.clock)

    settings = RunSettings(
        agent=wf_name,
        rules=rules,
        limits=limits,
        stream=stream,
        rate_account=rate_account,
        model_retry=model_retry,
        prices=prices,
        clock=app.clock,
        rng=app.rng,
        inline_wait_s=app.inline_wait_s,
        rate_limits=rate_limits,
    )
    handler = event_stream_handler

    async def run_agent(
        ctx: RunContext,
        prompt: str | None = None,
        *,
        deps: Any = None,
        message_history: list[ModelMessage] | None = None,
    ) -> AgentRunResult[Any]:
        capability = Durability(ctx=ctx, settings=settings)
        own = handler or agent.event_stream_handler
        with ExitStack() as stack:
            stack.enter_context(agent.parallel_tool_call_execution_mode(parallel_tools))
            for other in _REGISTRY.get(app, []):
                if other.agent is not agent:
                    stack.enter_context(_delegating(other))
            result: AgentRunResult[Any] = await agent.run(
                prompt,
                deps=factory.get() if factory is not None else deps,
                message_history=message_history,
                model=model,
                toolsets=list(toolsets) or None,
                usage_limits=usage_limits,
                capabilities=[capability],
                event_stream_handler=_fresh_events(own, ctx) if own is not None else None,
            )
        return result

    output = agent.output_type if isinstance(agent.output_type, type) else Any
    run_agent.__annotations__ = {
        "ctx": RunContext,
        "prompt": str | None,
        "deps": deps_type if deps_input else Any,
        "message_history": list[ModelMessage] | None,
        "return": AgentRunResult[output],  # type: ignore[valid-type]
    }
    run_agent.__name__ = run_agent.__qualname__ = wf_name
    if not deps_input:
        run_agent = _without_deps(run_agent)
    workflow: Workflow[..., AgentRunResult[Any]] = app.workflow(name=wf_name)(run_agent)
    _REGISTRY.setdefault(app, []).append(_Durable(agent, workflow, deps_input))
    return workflow


def _without_deps(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` without its ``deps`` parameter: deps come from a factory, never the input."""

    async def run_agent(
        ctx: RunContext,
        prompt: str | None = None,
        *,
        message_history: list[ModelMessage] | None = None,
    ) -> Any:
        return await fn(ctx, prompt, message_history=message_history)

    run_agent.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != "deps"}
    run_agent.__name__ = run_agent.__qualname__ = fn.__name__
    return run_agent


def _check_journalable(agent: str, deps_type: Any) -> None:
    try:
        adapter = TypeAdapter(deps_type)
        adapter.json_schema()
    except Exception as exc:
        raise ConfigError(
            f"durable agent {agent!r}: its deps_type {deps_type!r} cannot be journaled as "
            f"JSON ({type(exc).__name__}: {str(exc).splitlines()[0]}); pass deps=<a function "
            "that builds them>, called once per worker process, instead of deps= at submit"
        ) from None


def _fresh_events(handler: EventStreamHandler[Any], ctx: RunContext) -> EventStreamHandler[Any]:
    """``handler``, handed only the events of steps this execution ran: those of steps
    the journal already held reached it in the execution that ran them."""

    async def fresh(pai_ctx: PaiContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        async def new() -> Any:
            async for event in events:
                if not ctx.is_replaying:
                    yield event

        await handler(pai_ctx, new())

    return fresh


class _Delegation(AbstractCapability[Any]):
    """On a durable agent run inside a delegating tool of another durable run: the
    run becomes a child run of that run (``ctx.child``), whose result it returns."""

    def __init__(self, durable: _Durable) -> None:
        super().__init__()
        self.durable = durable

    async def wrap_run(self, ctx: PaiContext[Any], *, handler: WrapRunHandler) -> Any:
        parent = DELEGATING.get()
        name = self.durable.workflow.name
        if parent is None:
            raise ConfigError(
                f"a tool ({ctx.tool_name or '?'}) ran the durable agent {name!r} inside its "
                "step: name the tool in durable(..., delegates=[...]) so that the agent's "
                "run becomes a child run (or run it from a tool that is not journaled)"
            )
        if not isinstance(ctx.prompt, str):
            raise ConfigError(
                f"the durable agent {name!r} runs as a child run, which takes a text "
                f"prompt; got {type(ctx.prompt).__name__}"
            )
        kwargs: dict[str, Any] = {}
        if self.durable.deps_input and ctx.deps is not None:
            kwargs["deps"] = ctx.deps
        return await parent.child(self.durable.workflow, ctx.prompt, **kwargs)


def _delegating(other: _Durable) -> Any:
    agent = other.agent
    return agent.override(capabilities=[*agent.root_capability.capabilities, _Delegation(other)])
