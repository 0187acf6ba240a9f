"""``Agent``: what an agent is, as a user writes it down (its model, instructions,
tools, limits...), a value independent of any App.

An App runs an agent once it is registered (``app.add(agent)``, or ``app.agent(...)``
with the same arguments): it binds it to its tool registry, rate limits, clock and
randomness (:class:`~._loop.AgentLoop`) and registers the workflow that runs it.
The options are defined here once; ``app.agent`` takes them by forwarding to this
constructor, and bad ones fail here, at definition, each error naming its option.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Generic

from .._errors import ConfigError
from ..context import ContextPolicy
from ..journal import RetryPolicy
from ..limits import Limits, Price, price_of
from ..models import Model, ModelSettings, ToolSpec, resolve_model
from ..tools import OutputSchema, Tool, ToolDeps, ToolRegistry, Toolset
from ._delegate import AgentWorkflow, handoff_spec
from ._policy import Policy
from ._state import AgentResult, AgentState, OutputT

__all__ = [
    "ASK_HUMAN",
    "FINISH",
    "UPDATE_STATE",
    "Agent",
    "CompletionValidator",
    "split_tools",
]

CompletionValidator = Callable[[Any, AgentState], str | None]
"""``(answer, state) -> None`` when the answer is acceptable, else what is wrong."""

FINISH = ToolSpec(
    name="finish",
    description="Finish the task and give the final answer. Call it only when the task is "
    "complete; the answer is checked before it is accepted.",
    parameters={
        "type": "object",
        "properties": {"answer": {"description": "The final answer or result of the task."}},
        "required": ["answer"],
    },
)
UPDATE_STATE = ToolSpec(
    name="update_state",
    description="Record your plan, facts you established and a progress note. The state "
    "is shown to you every turn; older turns are only summarised.",
    parameters={
        "type": "object",
        "properties": {
            "plan": {
                "type": "array",
                "description": "The whole plan, replacing the previous one.",
                "items": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string"},
                        "status": {"enum": ["todo", "doing", "done", "dropped"]},
                    },
                    "required": ["text"],
                },
            },
            "facts": {"type": "array", "items": {"type": "string"}},
            "note": {"type": "string"},
        },
    },
)
ASK_HUMAN = ToolSpec(
    name="ask_human",
    description="Ask a person when you are unsure or the input is ambiguous. The run "
    "pauses until they answer (which may take hours); use it sparingly.",
    parameters={
        "type": "object",
        "properties": {
            "question": {"type": "string", "description": "One clear question."},
            "choices": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The possible answers, when the choice is closed.",
            },
        },
        "required": ["question"],
    },
)


@dataclass(frozen=True, eq=False)
class Agent(Generic[OutputT]):
    """An agent: a model working at a task in turns with tools, within limits.

    Build one and register it (``app.add(agent)``), or pass the same arguments to
    ``app.agent(...)``, which does both; either returns the workflow that runs it::

        triage = ms.Agent("triage", model="openai:gpt-4.1-mini", instructions="...",
                          tools=[lookup_ticket], limits=ms.Limits(max_steps=60))
        workflow = app.add(triage)
        await app.run(workflow, "Answer ticket 7")

    Attributes:
        name: the agent's workflow name in the journal: keep it stable while runs are
            in flight.
        model: ``"openai:gpt-4.1-mini"``, ``"anthropic:claude-sonnet-4-5"``,
            ``"openai:NAME@http://host/v1"`` (any OpenAI-compatible endpoint) or a
            :class:`~mainspring.models.Model` (``ScriptedModel`` in tests).
        instructions: the system prompt.
        tools: its allowlist: tools (``@app.tool``, registered in the App if new) and
            toolsets (``app.mcp.add(...)``).
        limits: steps, tool calls, tokens, cost and wall time (pause and ask first);
            ``None``: the defaults.
        context: how much history each request carries; ``None``: the default policy.
        settings / planning_settings: sampling for execution and planning turns.
        planning: ask for a plan (with ``update_state``) on the first turn.
        validators: ``(answer, state) -> None | problem`` checks of ``finish``.
        max_repairs: turns in a row without a usable action before the run fails.
        session_turns / session_tokens / session_bytes / session_wall_s: end the
            session when it reaches any of these bounds (turns; input + output tokens;
            bytes of model replies and tool results journaled; seconds), and start the
            next from a hand-off of the state and a summary.
        prices: USD per million tokens per model id (defaults: ``limits.PRICES``).
        model_retry: back-off for transient model errors (``None``: 8 attempts, 1 s
            doubling to 30 s).
        ask_human: give the model an ``ask_human(question, choices?)`` tool; the run
            waits durably for the answer (a request, like an approval).
        rate_account: which account's rate limits the model calls count against (with
            the App's ``rate_limits``); ``"default"`` unless you use several.
        policies: :class:`~mainspring.agent.Policy` s wrapped around the agent's tool
            and model calls, the first outermost, inside the built-in ones (allowlist,
            arguments, tool-call budget) and outside the approval of
            ``requires_approval`` tools (see ``docs/agents.md``).
        output_type: the type of the final answer (a pydantic model, a dataclass, a
            ``TypedDict``, ``list[str]``...): ``finish`` takes its schema, the answer is
            validated (repaired like tool arguments) and the result's ``output`` is an
            instance of it (see ``docs/agents.md``).
        deps / deps_type: a function that builds the dependencies the tools get as
            ``ctx.deps`` (a client, a pool), called once per worker process and never
            journaled; ``deps_type`` checks what it builds.
        handoffs: agents (the workflows ``app.add`` / ``app.agent`` return) the model
            may hand the task over to by calling ``transfer_to_<name>``: that agent
            runs as a child run from this one's state, and its result is this run's
            result (see ``docs/composition.md``).

    Raises:
        ConfigError: an option is wrong (the message names it): something in
            ``tools`` that is neither a tool nor a toolset, an ``output_type`` with no
            JSON schema, ``deps`` that is not a function, a handoff that is not an
            agent, a cost cap with no price for the model...
        ImportError: the model's provider SDK is not installed.
    """

    name: str
    _: KW_ONLY
    model: str | Model
    instructions: str
    tools: Sequence[Tool[Any, Any] | Toolset] = ()
    limits: Limits = field(default_factory=Limits)
    context: ContextPolicy = field(default_factory=ContextPolicy)
    settings: ModelSettings | None = None
    planning: bool = False
    planning_settings: ModelSettings | None = None
    validators: Sequence[CompletionValidator] = ()
    max_repairs: int = 3
    session_turns: int | None = None
    session_tokens: int | None = None
    session_bytes: int | None = None
    session_wall_s: float | None = None
    prices: dict[str, Price] | None = None
    model_retry: RetryPolicy | None = None
    ask_human: bool = False
    rate_account: str = "default"
    policies: Sequence[Policy] = ()
    output_type: type[OutputT] | None = None
    deps: Callable[[], Any] | None = None
    deps_type: type | None = None
    handoffs: Sequence[AgentWorkflow[Any]] = ()

    def __post_init__(self) -> None:
        # Kept as tuples: an Agent is a value, shared by every run (and App) using it.
        for name in ("tools", "validators", "policies", "handoffs"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        # ``None`` is the default, as ``app.agent`` has always taken it.
        for name, default in (("limits", Limits), ("context", ContextPolicy)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, default())
        # Bad configuration fails where the agent is defined, not in a worker.
        _ = self._split, self.resolved_model, self._output, self._deps
        for target in self.handoffs:
            if not isinstance(target, AgentWorkflow):
                raise ConfigError(
                    f"agent {self.name!r}: handoffs take agents (what app.agent returns), "
                    f"got {target!r}"
                )
            handoff_spec(target)  # a name that cannot be a tool's fails here
        self._check_priced()

    def _check_priced(self) -> None:
        """A cost cap needs the model's price: without one its cost counts as 0 and the
        cap never fires."""
        budget = self.limits
        priced = budget.max_cost_usd if budget.max_cost_usd is not None else budget.checkpoint_usd
        model_id = self.resolved_model.model_id
        if priced is not None and price_of(model_id, self.prices) is None:
            which = "max_cost_usd" if budget.max_cost_usd is not None else "checkpoint_usd"
            raise ConfigError(
                f"agent {self.name!r} has {which}={priced!r} but no price for "
                f"model {model_id!r}: pass prices={{{model_id!r}: "
                "ms.limits.Price(input=..., output=...)}} (USD per million tokens)"
            )

    @functools.cached_property
    def resolved_model(self) -> Model:
        """:attr:`model` as the adapter the agent calls (one per agent)."""
        return resolve_model(self.model)

    @functools.cached_property
    def _split(self) -> tuple[tuple[Tool[Any, Any], ...], tuple[Toolset, ...]]:
        plain, toolsets = split_tools(self.name, self.tools)
        return tuple(plain), toolsets

    @property
    def plain_tools(self) -> tuple[Tool[Any, Any], ...]:
        """The tools of :attr:`tools` (not the toolsets)."""
        return self._split[0]

    @property
    def toolsets(self) -> tuple[Toolset, ...]:
        """The toolsets of :attr:`tools` (MCP servers), listed when a session starts."""
        return self._split[1]

    @property
    def allowed(self) -> tuple[str, ...]:
        """The names of the tools it may call (its toolsets' are listed per session)."""
        return tuple(t.name for t in self.plain_tools)

    @functools.cached_property
    def _output(self) -> OutputSchema | None:
        if self.output_type is None:
            return None
        return OutputSchema.of(self.output_type, agent=self.name)

    @functools.cached_property
    def _deps(self) -> ToolDeps:
        # One per Agent: built once in each worker process, never journaled.
        return ToolDeps(self.name, self.deps, self.deps_type)

    @property
    def result_type(self) -> Any:
        """What the workflow returns: ``AgentResult[output_type]``, so that a result
        read back from the journal is rebuilt as the output type."""
        generic: Any = AgentResult  # subscripted with a runtime value
        return generic if self.output_type is None else generic[self.output_type]

    def tool_specs(
        self, tools: ToolRegistry | None = None, allowed: tuple[str, ...] | None = None
    ) -> list[ToolSpec]:
        """What the model is told it may call (``tools`` and ``allowed``: a session's,
        with what its toolsets listed; by default its own tools)."""
        extra = [ASK_HUMAN] if self.ask_human else []
        extra += [handoff_spec(target) for target in self.handoffs]
        finish = FINISH if self._output is None else self._output.spec
        registry = ToolRegistry(self.plain_tools) if tools is None else tools
        names = self.allowed if allowed is None else allowed
        return [*registry.specs(names), *extra, UPDATE_STATE, finish]


def split_tools(
    agent: str, tools: Sequence[Tool[Any, Any] | Toolset]
) -> tuple[list[Tool[Any, Any]], tuple[Toolset, ...]]:
    """An agent's ``tools=``: its plain tools, and its toolsets.

    Raises:
        ConfigError: something that is neither, or one toolset twice.
    """
    for other in tools:
        if not isinstance(other, Tool | Toolset):
            raise ConfigError(
                f"agent {agent!r}: tools= takes tools (@app.tool) and toolsets "
                f"(app.mcp.add(...)), got {other!r}"
            )
    plain = [t for t in tools if isinstance(t, Tool)]
    toolsets = tuple(t for t in tools if isinstance(t, Toolset))
    names = [t.name for t in toolsets]
    if len(set(names)) != len(names):
        raise ConfigError(f"agent {agent!r}: a toolset is given twice in tools={names}")
    return plain, toolsets
