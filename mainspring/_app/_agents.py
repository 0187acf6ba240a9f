"""Agents as an App registers them (``app.add(agent)``, ``app.agent(...)``), and model
calls from any workflow (``app.call_model``), both booked through the App's shared
rate limits. A part of :class:`~mainspring.App`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec

from typing_extensions import TypeVar

from .._errors import ConfigError
from ..agent import Agent, AgentLoop, AgentResult, AgentWorkflow, call_model
from ..journal import RetryPolicy, RunContext
from ..limits import BoundRateLimits
from ..models import Message, Model, ModelResponse, ModelSettings, ToolSpec, resolve_model
from ._runtime import Part, Runtime, takes_options_of

__all__ = ["Agents", "agent_options", "workflow_of"]

OutputT = TypeVar("OutputT", default=Any)
P = ParamSpec("P")
S = TypeVar("S")


def agent_options(
    make: Callable[P, Agent[OutputT]],
) -> Callable[
    [Callable[Concatenate[S, ...], Any]], Callable[Concatenate[S, P], AgentWorkflow[OutputT]]
]:
    """``app.agent``'s parameters are :class:`~mainspring.Agent`'s, declared there once,
    and what it returns is the workflow of an ``Agent[OutputT]`` (the ``output_type``
    a type checker sees through)."""
    forward: Any = takes_options_of(make)
    return forward  # type: ignore[no-any-return]


def workflow_of(loop: AgentLoop) -> AgentWorkflow[Any]:
    """The workflow that runs ``loop`` (a bound agent) under the agent's name: the
    agent's own kind of workflow, a run plus ``as_tool``."""
    agent = loop.agent

    async def run_agent(ctx: RunContext, task: str) -> AgentResult[Any]:
        return await loop.run(ctx, task)

    run_agent.__name__ = run_agent.__qualname__ = agent.name
    run_agent.__annotations__["return"] = agent.result_type  # revives the typed output
    return AgentWorkflow.for_agent(run_agent, agent.name)


class Agents(Part):
    """Registering agents and calling models, for an App."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        self._models: dict[str, Model] = {}  # call_model's adapters, by spec
        self._workflows: dict[str, AgentWorkflow[Any]] = {}  # by name, as registered

    def add(self, agent: Agent[OutputT]) -> AgentWorkflow[OutputT]:
        """Register ``agent`` and the workflow that runs it, under its name; return
        the workflow (registering the same agent again returns it again).

        Its plain tools join the App's registry (if new), and it is bound to the App's
        rate limits, clock and randomness.

        Raises:
            ConfigError: ``agent`` is not an :class:`~mainspring.Agent`, or another
                workflow has its name.
        """
        if not isinstance(agent, Agent):
            raise ConfigError(
                f"app.add takes an agent (ms.Agent(name, model=..., instructions=...)), "
                f"got {agent!r:.100}"
            )
        runtime = self._runtime
        added = self._workflows.get(agent.name)
        if added is not None and runtime.agents.get(agent.name) is agent:
            return added
        for t in agent.plain_tools:
            if t.name not in runtime.tools:
                runtime.tools.add(t)
        loop = AgentLoop(
            agent=agent,
            tools=runtime.tools,
            rate_limits=self._bound_rate_limits(),
            clock=self._clock,
            rng=runtime.rng,
            inline_wait_s=runtime.inline_wait_s,
        )
        workflow: AgentWorkflow[OutputT] = workflow_of(loop)
        runtime.register(workflow.fn, agent.name)  # refuses a name taken
        runtime.workflows[agent.name] = self._workflows[agent.name] = workflow
        runtime.agents[agent.name] = agent
        return workflow

    async def call_model(
        self,
        ctx: RunContext,
        model: Model | str,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        settings: ModelSettings | None = None,
        account: str = "default",
        retry: RetryPolicy | None = None,
        max_rate_wait_s: float | None = None,
    ) -> ModelResponse:
        """Call a model from any workflow, as an agent's turn does: a journaled step
        (a replay returns the recorded reply), booked through this App's shared rate
        limits, and never failed by a 429 or an overload (the run waits, as long as
        the provider asks; ``max_rate_wait_s`` pauses it for a human instead).

        Args:
            ctx: the run's context.
            model: a :class:`~mainspring.models.Model` or a spec such as
                ``"openai:gpt-4.1-mini"`` (one adapter per spec, reused).
            messages: the conversation, oldest first.
            tools / settings: what the model may call; sampling settings.
            account: which account's rate limits (``RateLimit.account``).
            retry: back-off for transient errors (network, 5xx).
            max_rate_wait_s: how long refusals may hold the call back before the run
                asks a human (``budget:max_rate_wait_s``); ``None``: no bound.

        Raises:
            StepFailed: the call failed for good (never for rate).
            BudgetExceeded: ``max_rate_wait_s`` passed and a human said stop.
        """
        if isinstance(model, str):
            found = self._models.get(model)
            if found is None:
                found = self._models[model] = resolve_model(model)
            model = found
        return await call_model(
            ctx,
            model,
            messages,
            tools=tools,
            settings=settings,
            rate_limits=self._bound_rate_limits(),
            account=account,
            retry=retry,
            max_rate_wait_s=max_rate_wait_s,
            clock=self._clock,
            rng=self._runtime.rng,
            inline_wait_s=self._runtime.inline_wait_s,
        )

    def _bound_rate_limits(self) -> BoundRateLimits | None:
        """The App's rate limits bound to its store (opened when first booked on) and
        its clock: what its agents and :meth:`call_model` book against."""
        limits = self._runtime.rate_limits
        if limits is None:
            return None
        return limits.bind(lambda: self._store, self._clock)
