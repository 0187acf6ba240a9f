"""Agents as an App defines them (``app.agent``), and model calls from any workflow
(``app.call_model``), both booked through the App's shared rate limits. A part of
:class:`~mainspring.App`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from typing_extensions import TypeVar

from .._errors import ConfigError
from ..agent import (
    Agent,
    AgentResult,
    AgentWorkflow,
    CompletionValidator,
    Policy,
    call_model,
)
from ..context import ContextPolicy
from ..journal import RetryPolicy, RunContext
from ..limits import BoundRateLimits, Limits, Price, price_of
from ..models import Message, Model, ModelResponse, ModelSettings, ToolSpec, resolve_model
from ..tools import Tool, Toolset
from ._mcp import MCPServers
from ._runtime import Part, Runtime

__all__ = ["Agents"]

OutputT = TypeVar("OutputT", default=Any)


class Agents(Part):
    """Defining agents and calling models, for an App."""

    def __init__(self, runtime: Runtime, mcp: MCPServers) -> None:
        super().__init__(runtime)
        self._mcp = mcp  # tells an agent's toolsets from its tools
        self._models: dict[str, Model] = {}  # call_model's adapters, by spec

    def agent(
        self,
        name: str,
        *,
        model: str | Model,
        instructions: str,
        tools: Sequence[Tool[Any, Any] | Toolset] = (),
        limits: Limits | None = None,
        context: ContextPolicy | None = None,
        settings: ModelSettings | None = None,
        planning: bool = False,
        planning_settings: ModelSettings | None = None,
        validators: Sequence[CompletionValidator] = (),
        max_repairs: int = 3,
        session_turns: int | None = None,
        session_tokens: int | None = None,
        session_bytes: int | None = None,
        session_wall_s: float | None = None,
        prices: dict[str, Price] | None = None,
        model_retry: RetryPolicy | None = None,
        ask_human: bool = False,
        rate_account: str = "default",
        policies: Sequence[Policy] = (),
        output_type: type[OutputT] | None = None,
        deps: Callable[[], Any] | None = None,
        deps_type: type | None = None,
        handoffs: Sequence[AgentWorkflow] = (),
    ) -> AgentWorkflow[OutputT]:
        """Define an agent and register the workflow that runs it, under ``name``.

        Run it like any workflow with the task as its argument:
        ``app.submit(agent, "Answer ticket 7")`` or ``await app.run(agent, "...")``.

        Args:
            model: ``"openai:gpt-4.1-mini"``, ``"anthropic:claude-sonnet-4-5"``,
                ``"openai:NAME@http://host/v1"`` (any OpenAI-compatible endpoint) or a
                :class:`~mainspring.models.Model` (``ScriptedModel`` in tests).
            tools: its allowlist: tools (registered if new) and toolsets (``app.mcp``).
            limits: steps, tool calls, tokens, cost and wall time (pause and ask first).
            context: how much history each request carries.
            settings / planning_settings: sampling for execution and planning turns.
            planning: ask for a plan (with ``update_state``) on the first turn.
            validators: ``(answer, state) -> None | problem`` checks of ``finish``.
            max_repairs: turns in a row without a usable action before the run fails.
            session_turns / session_tokens / session_bytes / session_wall_s: end the
                session when it reaches any of these bounds (turns; input + output
                tokens; bytes of model replies and tool results journaled; seconds),
                and start the next from a hand-off of the state and a summary.
            prices: USD per million tokens per model id (defaults: ``limits.PRICES``).
            model_retry: back-off for transient model errors (8 attempts, 1 s doubling to 30 s).
            ask_human: give the model an ``ask_human(question, choices?)`` tool; the
                run waits durably for the answer (a request, like an approval).
            rate_account: which account's rate limits the model calls count against
                (with the App's ``rate_limits``); ``"default"`` unless you use several.
            policies: :class:`~mainspring.agent.Policy` s wrapped around the agent's
                tool and model calls, the first outermost, inside the built-in ones
                (allowlist, arguments, tool-call budget) and outside the approval of
                ``requires_approval`` tools (see ``docs/agents.md``).
            output_type: the type of the final answer (a pydantic model, a dataclass,
                a ``TypedDict``, ``list[str]``...): ``finish`` takes its schema, the
                answer is validated (repaired like tool arguments) and the result's
                ``output`` is an instance of it (see ``docs/agents.md``).
            deps / deps_type: a function that builds the dependencies the tools get
                as ``ctx.deps`` (a client, a pool), called once per worker process and
                never journaled; ``deps_type`` checks what it builds.
            handoffs: agents (what ``app.agent`` returned) the model may hand the
                task over to by calling ``transfer_to_<name>``: that agent runs as a
                child run from this one's state, and its result is this run's result
                (see ``docs/composition.md``).
        """
        plain, toolsets = self._mcp.split_tools(name, tools)
        for t in plain:
            if t.name not in self.runtime.tools:
                self.runtime.tools.add(t)
        resolved = resolve_model(model)
        budget = limits or Limits()
        priced = budget.max_cost_usd if budget.max_cost_usd is not None else budget.checkpoint_usd
        if priced is not None and price_of(resolved.model_id, prices) is None:
            # Its cost would count as 0 and the cap would never fire.
            which = "max_cost_usd" if budget.max_cost_usd is not None else "checkpoint_usd"
            raise ConfigError(
                f"agent {name!r} has {which}={priced!r} but no price for "
                f"model {resolved.model_id!r}: pass prices={{{resolved.model_id!r}: "
                "ms.limits.Price(input=..., output=...)}} (USD per million tokens)"
            )
        spec = Agent(
            name=name,
            model=resolved,
            instructions=instructions,
            tools=self.runtime.tools,
            allowed=tuple(t.name for t in plain),
            toolsets=toolsets,
            limits=budget,
            context=context or ContextPolicy(),
            settings=settings,
            planning=planning,
            planning_settings=planning_settings,
            validators=tuple(validators),
            max_repairs=max_repairs,
            session_turns=session_turns,
            session_tokens=session_tokens,
            session_bytes=session_bytes,
            session_wall_s=session_wall_s,
            prices=prices,
            ask_human=ask_human,
            rate_limits=self._bound_rate_limits(),
            rate_account=rate_account,
            policies=tuple(policies),
            handoffs=tuple(handoffs),
            clock=self.clock,
            rng=self.runtime.rng,
            inline_wait_s=self.runtime.inline_wait_s,
            output_type=output_type,
            deps=deps,
            deps_type=deps_type,
            **({"model_retry": model_retry} if model_retry is not None else {}),
        )

        async def run_agent(ctx: RunContext, task: str) -> AgentResult[OutputT]:
            return await spec.run(ctx, task)

        run_agent.__name__ = run_agent.__qualname__ = name
        run_agent.__annotations__["return"] = spec.result_type  # revives the typed output
        self.runtime.register(run_agent, name)  # refuses a name taken
        # the agent's own kind of workflow: the same run, plus ``as_tool``
        workflow = self.runtime.workflows[name] = AgentWorkflow.for_agent(run_agent, name)
        self.runtime.agents[name] = spec
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
            clock=self.clock,
            rng=self.runtime.rng,
            inline_wait_s=self.runtime.inline_wait_s,
        )

    def _bound_rate_limits(self) -> BoundRateLimits | None:
        """The App's rate limits bound to its store (opened when first booked on) and
        its clock: what its agents and :meth:`call_model` book against."""
        limits = self.runtime.rate_limits
        if limits is None:
            return None
        return limits.bind(lambda: self.store, self.clock)
