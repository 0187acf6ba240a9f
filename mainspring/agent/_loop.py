"""The decision–execution loop, on top of the journal.

Each turn: check the budgets → assemble the context → call the model through its
policies (a journaled step, rate limited, retried with back-off on transient errors)
→ parse actions → admit each tool call through the policies (allowlist, arguments,
tool-call budget, yours, approval) → run the tools (journaled, in parallel when the
model asked for several) → update the structured state → watch for loops → next
turn. The policies are wrappers (:mod:`._policy`): the loop itself knows none.
Every decision depends only on journaled values, so a replay after a crash takes the
same path without calling the model again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, ValidationError

from .._clock import Clock
from .._errors import (
    BudgetExceeded,
    ConfigError,
    LoopDetected,
    ModelOutputError,
    StepFailed,
    StepInterrupted,
    ToolInputError,
)
from ..context import TokenCounter, Turn, counter_for
from ..hitl import ask
from ..journal import RunContext
from ..limits import BoundRateLimits, cost_usd
from ..models import (
    AssistantMessage,
    ModelResponse,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
)
from ..tools import (
    ToolRegistry,
    describe_errors,
    parse_arguments,
)
from ._agent import Agent
from ._budget import Progress, check_limits, checkpoint
from ._builtin import (
    Allowlist,
    ApprovalRequired,
    ProviderRefusal,
    RetryTurn,
    ToolCallBudget,
    ValidArguments,
)
from ._call import call_model
from ._delegate import AgentTool, AgentWorkflow, Handoff, handoff_spec, handoff_task
from ._parse import action_from_text
from ._policy import ModelCall, Policy, ToolOutcome, ToolUse, compose
from ._state import AgentResult, AgentState, PlanItem

__all__ = ["AgentLoop"]

GUIDANCE = (
    "You work in turns. Each turn, call one or more tools. Use update_state to keep your "
    "plan, facts and progress notes current: older turns are only shown as a summary. "
    "When the task is complete, call finish with the answer."
)


@dataclass(frozen=True, kw_only=True, eq=False)
class AgentLoop:
    """An :class:`Agent` as an App runs it: bound to the App's tool registry (which
    tells a tool the agent may not call from one that does not exist), its rate limits
    (bound to its store and clock), its clock, randomness and ``inline_wait_s``. The
    App makes one when the agent is registered; its :meth:`run` is the workflow's body.
    """

    agent: Agent[Any]
    tools: ToolRegistry
    rate_limits: BoundRateLimits | None = None
    clock: Clock | None = None
    rng: random.Random | None = None
    inline_wait_s: float = 1.0

    @functools.cached_property
    def _counter(self) -> TokenCounter:
        return counter_for(self.agent.resolved_model.provider)

    async def _toolbox(self, ctx: RunContext) -> tuple[ToolRegistry, tuple[str, ...]]:
        """This session's tools and allowlist: the agent's, and its toolsets' (each
        listed once per session, as journaled steps)."""
        if not self.agent.toolsets:
            return self.tools, self.agent.allowed
        registry = ToolRegistry(t for t in self.tools if t.name in self.agent.allowed)
        allowed = list(self.agent.allowed)
        taken = {"finish", "update_state", "ask_human"}
        taken.update(handoff_spec(target).name for target in self.agent.handoffs)
        for toolset in self.agent.toolsets:
            listed = await toolset.list_tools(ctx)
            for t in listed.tools:
                if t.name in registry or t.name in taken:
                    raise ConfigError(
                        f"agent {self.agent.name!r}: the tool {t.name!r} of {toolset!r} has the "
                        "name of another tool of the agent; give the toolset a prefix= "
                        "(or leave the tool out with allow=[...])"
                    )
                registry.add(t)
            allowed.extend(listed.allowed)
        return registry, tuple(allowed)

    async def run(self, ctx: RunContext, task: str) -> AgentResult:
        """The workflow body: one session of the loop, its tools given its deps."""
        with self.agent._deps.bound():
            return await self._session(ctx, task)

    async def _session(self, ctx: RunContext, task: str) -> AgentResult:
        run = self._resume(ctx, task)
        run.tools, run.allowed = await self._toolbox(ctx)
        specs = self.agent.tool_specs(run.tools, run.allowed)
        while True:
            stop = await check_limits(ctx, run) or await checkpoint(ctx, run)
            if stop is not None:
                return self._result(ctx, run, "partial", None, stop)
            if self._session_over(ctx, run):
                self._hand_off(ctx, run)
            try:
                response = await self._ask_model(ctx, run, task, specs)
            except BudgetExceeded as exc:  # held back past max_rate_wait_s; a human said stop
                return self._result(ctx, run, "partial", None, exc.message)
            if response is None:
                continue
            turn = Turn(
                assistant=AssistantMessage(text=response.text, tool_calls=response.tool_calls)
            )
            done, answer = await self._act(ctx, run, turn, response)
            run.history.add(turn)
            if done:
                if isinstance(answer, Handoff):
                    return answer.merged(run.state, run.sessions)
                return self._result(ctx, run, "done", answer, None)
            verdict, why = run.guard.observe(turn)
            if verdict == "stop":
                raise _loop_detected(ctx, why)
            if verdict == "nudge":
                turn.note = (
                    f"You are {why}. That is not making progress: change your approach, "
                    "record what you learned with update_state, or finish."
                )

    # -- a turn ------------------------------------------------------------------------

    async def _ask_model(
        self, ctx: RunContext, run: Progress, task: str, specs: list[ToolSpec]
    ) -> ModelResponse | None:
        planning = self.agent.planning and run.state.turns == 0 and not run.state.plan
        messages = run.history.messages(
            instructions=f"{self.agent.instructions}\n\n{GUIDANCE}"
            + ("\nStart by making a plan with update_state." if planning else ""),
            task=task,
            state_block=run.state.block(),
            earlier=run.earlier,
            policy=self.agent.context,
            tools=specs,
            recent=run.recent,
            count=lambda m, t: round(self._counter.messages(m, t) * run.calibration),
        )
        settings = (
            self.agent.planning_settings
            if planning and self.agent.planning_settings
            else self.agent.settings
        )
        model = self.agent.resolved_model
        counted = self.agent.context.max_input_tokens or self.rate_limits is not None
        estimated = self._counter.messages(messages, specs) if counted else 0
        call = ModelCall(
            ctx=ctx,
            model=model,
            messages=messages,
            tools=specs,
            settings=settings,
            state=run.state,
        )
        hooks = [ProviderRefusal().around_model, *(p.around_model for p in self.agent.policies)]
        send = compose(hooks, functools.partial(self._call_model, run, estimated))
        try:
            response = await send(call)
        except RetryTurn:
            return None
        except StepFailed as exc:
            if exc.error_type.rsplit(".", 1)[-1] == "ContextOverflow" and run.recent != 0:
                run.recent = 0  # compact: state and summary only, then retry once
                return None
            raise
        run.recent = None
        usage = response.usage
        if estimated and usage.input_tokens:
            run.calibration = 0.7 * run.calibration + 0.3 * (usage.input_tokens / estimated)
        run.state.turns += 1
        run.session_turns += 1
        run.session_tokens += usage.input_tokens + usage.output_tokens
        run.session_bytes += len(response.text or "") + sum(
            len(c.name) + len(c.arguments) for c in response.tool_calls
        )
        run.state.input_tokens += usage.input_tokens
        run.state.output_tokens += usage.output_tokens
        run.state.cost_usd += cost_usd(model.model_id, usage, self.agent.prices)
        return response

    async def _act(
        self, ctx: RunContext, run: Progress, turn: Turn, response: ModelResponse
    ) -> tuple[bool, Any]:
        """Carry out the reply's actions; ``(True, answer)`` when the task is done."""
        calls = self._calls(run, turn, response)
        if calls is None:
            return self._finish(ctx, run, turn, response.text)
        if not calls:
            self._repair(ctx, run, turn, _no_action(response))
            return False, None
        # Keyed by position: a model may reuse a call id. (content, is_error, a repair?)
        results: dict[int, tuple[str, bool, bool]] = {}
        todo: list[tuple[int, ToolUse]] = []
        admit = compose([p.admit_tool for p in self._admission(run)], _admitted)
        for i, call in enumerate(calls):
            target = self._handoff_target(call.name)
            if target is not None:  # the task moves to that agent, as a child run
                result = await ctx.child(
                    target, handoff_task(self.agent.name, call.arguments, run.state)
                )
                results[i] = (f"handed over to {target.name}", False, False)
                turn.results = [_result(c, results.get(j)) for j, c in enumerate(calls)]
                return True, Handoff(result)
            if call.name == "finish":
                done, answer, error = self._check_finish(run, call)
                results[i] = ("accepted", False, False) if done else (error, True, True)
                if done:
                    turn.results = [_result(c, results.get(j)) for j, c in enumerate(calls)]
                    return True, answer
                continue
            outcome = await self._admit(ctx, run, call, admit)
            if isinstance(outcome, ToolUse):
                todo.append((i, outcome))
            else:
                results[i] = outcome
        await self._execute(run, todo, results)
        turn.results = [_result(c, results.get(i)) for i, c in enumerate(calls)]
        if not todo and any(r[2] for r in results.values()):
            # What the model was told last, and the call it was told about.
            i, (message, _, _) = next((i, r) for i, r in reversed(results.items()) if r[1])
            call = calls[i]
            self._count_repair(
                ctx,
                run,
                message,
                f"{call.name or '?'}({call.arguments:.300})",
                output=call.name == "finish" and self.agent._output is not None,
            )
        else:
            run.failed_turns = 0
        return False, None

    async def _execute(
        self,
        run: Progress,
        todo: list[tuple[int, ToolUse]],
        results: dict[int, tuple[str, bool, bool]],
    ) -> None:
        """Run the admitted tool calls together, through the policies, and count them."""
        execute = compose([p.around_tool for p in self.agent.policies], _run_tool)
        outcomes = await asyncio.gather(*(execute(use) for _, use in todo))
        for (i, use), done_call in zip(todo, outcomes, strict=True):
            results[i] = (done_call.content, done_call.is_error, False)
            run.state.tool_calls += 1
            run.session_bytes += len(done_call.content)
            if done_call.is_error:
                run.state.last_error = _named(use.call.name, done_call.content[:300])

    def _handoff_target(self, name: str) -> AgentWorkflow | None:
        for target in self.agent.handoffs:
            if name == f"transfer_to_{target.name}":
                return target
        return None

    def _calls(self, run: Progress, turn: Turn, response: ModelResponse) -> list[ToolCall] | None:
        """The reply's tool calls, or one written as text; ``None`` when the text is
        the answer (an empty list: no usable action)."""
        calls = list(response.tool_calls)
        if calls or not (response.text and response.text.strip()):
            return calls
        known = {*run.allowed, "finish", "update_state"}
        if self.agent.ask_human:
            known.add("ask_human")
        found = action_from_text(response.text, f"text_{run.state.turns}", known)
        if found is not None:
            turn.assistant = AssistantMessage(text=response.text, tool_calls=(found,))
            return [found]
        if response.finish_reason not in ("refusal", "content_filter", "length"):
            return None
        return []

    def _admission(self, run: Progress) -> list[Policy]:
        """The policies that admit this turn's tool calls, outermost first."""
        return [
            Allowlist(run.tools, run.allowed),
            ValidArguments(),
            ToolCallBudget(run.limits.max_tool_calls, run.state.tool_calls),
            *self.agent.policies,
            ApprovalRequired(),
        ]

    async def _admit(
        self,
        ctx: RunContext,
        run: Progress,
        call: ToolCall,
        admit: Callable[[ToolUse], Awaitable[ToolUse | ToolOutcome]],
    ) -> ToolUse | tuple[str, bool, bool]:
        """The use to run, or what the model is told instead: ``(content, is_error,
        a repair?)``. The agent's own tools are answered here, the others admitted."""
        if call.name == "update_state":
            try:
                run.state.apply_update(_state_update(call.arguments))
            except ToolInputError as exc:
                return exc.message, True, True
            return "state updated", False, False
        if call.name == "ask_human" and self.agent.ask_human:
            return (*await self._ask_human(ctx, call), False)
        if not call.name.strip():
            # A garbled call, not a wrong tool: the model can repair it.
            return "the tool call had no tool name; name one of the tools", True, True
        try:
            admitted = await admit(ToolUse(ctx=ctx, call=call, state=run.state))
        except ToolInputError as exc:  # invalid arguments: the model repairs them
            return str(exc.message), True, True
        if isinstance(admitted, ToolOutcome):
            return admitted.content, admitted.is_error, False
        return admitted

    async def _call_model(self, run: Progress, estimated: int, call: ModelCall) -> ModelResponse:
        """The innermost model policy: the rate limiter and the journaled step."""
        return await call_model(
            call.ctx,
            call.model,
            call.messages,
            tools=call.tools,
            settings=call.settings,
            rate_limits=self.rate_limits,
            account=self.agent.rate_account,
            retry=self.agent.model_retry,
            max_rate_wait_s=run.limits.max_rate_wait_s,
            prompt_tokens=estimated if self.rate_limits is not None else None,
            prices=self.agent.prices,
            clock=self.clock,
            rng=self.rng,
            inline_wait_s=self.inline_wait_s,
        )

    def _finish(self, ctx: RunContext, run: Progress, turn: Turn, answer: Any) -> tuple[bool, Any]:
        """A plain text reply is the final answer, if it is of the output type and the
        validators accept it."""
        if self.agent._output is not None:
            try:
                answer = self.agent._output.from_text(answer)
            except ToolInputError as exc:
                note = f"{exc.message}\nCall finish with the answer."
                self._repair(ctx, run, turn, note, output=True)
                return False, None
        done, value, error = self._validate_answer(run, answer)
        if done:
            return True, value
        turn.note = error
        run.failed_turns += 1
        return False, None

    def _check_finish(self, run: Progress, call: ToolCall) -> tuple[bool, Any, str]:
        if self.agent._output is not None:
            try:
                answer = self.agent._output.from_arguments(call.arguments)
            except ToolInputError as exc:
                return False, None, exc.message
            return self._validate_answer(run, answer)
        expected = 'finish(answer: any) -- call finish with {"answer": ...}'
        try:
            arguments = parse_arguments(call.arguments, tool="finish", expected=expected)
        except ToolInputError as exc:
            return False, None, exc.message
        if "answer" not in arguments:
            return False, None, f"finish: argument 'answer' is required\nExpected: {expected}"
        return self._validate_answer(run, arguments["answer"])

    def _validate_answer(self, run: Progress, answer: Any) -> tuple[bool, Any, str]:
        for validator in self.agent.validators:
            problem = validator(answer, run.state)
            if problem:
                return False, None, f"The answer was not accepted: {problem}. Fix it, then finish."
        return True, answer, ""

    def _repair(
        self, ctx: RunContext, run: Progress, turn: Turn, note: str, *, output: bool = False
    ) -> None:
        turn.note = note
        self._count_repair(ctx, run, note, None, output=output)

    def _count_repair(
        self,
        ctx: RunContext,
        run: Progress,
        message: str,
        call: str | None,
        *,
        output: bool = False,
    ) -> None:
        """Count a turn with no usable action; past ``max_repairs`` in a row, fail the run
        quoting the repair the model was last asked for (and the call it was about).
        ``output``: the repair was of a final answer not of the output type."""
        run.failed_turns += 1
        run.state.repairs += 1
        about = f" about the call {call}" if call else ""
        if run.failed_turns > self.agent.max_repairs and output and self.agent._output is not None:
            name = self.agent._output.name
            problems = message.partition("\n")[0].removeprefix(
                f"finish: the answer is not a valid {name}: "
            )
            raise ModelOutputError(
                f"agent {self.agent.name!r}: the model's final answer is not a valid {name} after "
                f"{run.failed_turns} turns in a row (max_repairs={self.agent.max_repairs}); "
                f"what was wrong with the last one{f', {call}' if call else ''}: {problems}",
                run_id=ctx.run_id,
            )
        if run.failed_turns > self.agent.max_repairs:
            raise ModelOutputError(
                f"agent {self.agent.name!r}: the model could not produce a valid call: "
                f"{run.failed_turns} turns in a row without a usable action "
                f"(max_repairs={self.agent.max_repairs}); "
                f"the last repair asked{about}: {message!r}",
                run_id=ctx.run_id,
            )

    async def _ask_human(self, ctx: RunContext, call: ToolCall) -> tuple[str, bool]:
        """The ``ask_human`` tool: the model asks; a person answers, however late."""
        expected = 'ask_human(question: str, choices?: [str]) -- {"question": "..."}'
        try:
            arguments = parse_arguments(call.arguments, tool="ask_human", expected=expected)
        except ToolInputError as exc:
            return exc.message, True
        question = arguments.get("question")
        choices = arguments.get("choices")
        if not isinstance(question, str) or not question.strip():
            return f"ask_human: 'question' must be a non-empty string\nExpected: {expected}", True
        if choices is not None and not (
            isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices)
        ):
            return f"ask_human: 'choices' must be a list of strings\nExpected: {expected}", True
        reply = await ask(ctx, f"question:{call.id}", question, choices=choices)
        return f"The human answered: {reply}", False

    # -- budgets, sessions, results ------------------------------------------------------

    def _session_over(self, ctx: RunContext, run: Progress) -> bool:
        """Has this session reached a bound (turns, tokens, journal bytes, wall time)?"""
        if run.session_turns == 0:
            return False  # a session always makes progress before it hands off
        if self.agent.session_turns is not None and run.session_turns >= self.agent.session_turns:
            return True
        if (
            self.agent.session_tokens is not None
            and run.session_tokens >= self.agent.session_tokens
        ):
            return True
        if self.agent.session_bytes is not None and run.session_bytes >= self.agent.session_bytes:
            return True
        if self.agent.session_wall_s is not None:
            return ctx.now().timestamp() - run.session_started >= self.agent.session_wall_s
        return False

    def _resume(self, ctx: RunContext, task: str) -> Progress:
        run = self._resume_run(ctx, task)
        if self.agent.session_wall_s is not None:
            run.session_started = ctx.now().timestamp()
        return run

    def _resume_run(self, ctx: RunContext, task: str) -> Progress:
        handoff = ctx.handoff
        if not handoff:
            started = ctx.now().timestamp() if self.agent.limits.max_wall_s is not None else 0.0
            return Progress(
                state=AgentState(goal=task),
                limits=self.agent.limits,
                started=started,
                earlier="",
                sessions=1,
            )
        state = AgentState(goal=task)
        for key, value in handoff["state"].items():
            setattr(state, key, value)
        state.plan = [_plan_item(p) for p in handoff["state"]["plan"]]
        limits = dataclasses.replace(self.agent.limits, **handoff["limits"])
        return Progress(
            state=state,
            limits=limits,
            started=handoff["started"],
            earlier=handoff["earlier"],
            sessions=handoff["sessions"] + 1,
        )

    def _hand_off(self, ctx: RunContext, run: Progress) -> NoReturn:
        run.history.fold(len(run.history.turns), self.agent.context)
        earlier = "\n".join(filter(None, [run.earlier, *run.history.summary_lines]))
        ctx.continue_as_new(
            {
                "state": dataclasses.asdict(run.state),
                "limits": dataclasses.asdict(run.limits),
                "started": run.started,
                "earlier": earlier[-self.agent.context.summary_chars :],
                "sessions": run.sessions,
            }
        )

    def _result(
        self,
        ctx: RunContext,
        run: Progress,
        status: Literal["done", "partial"],
        answer: Any,
        reason: str | None,
    ) -> AgentResult:
        s = run.state
        return AgentResult(
            status=status,
            answer=answer,
            reason=reason,
            state=dataclasses.asdict(s),
            turns=s.turns,
            tool_calls=s.tool_calls,
            input_tokens=s.input_tokens,
            output_tokens=s.output_tokens,
            cost_usd=round(s.cost_usd, 6),
            sessions=run.sessions,
        )


async def _admitted(use: ToolUse) -> ToolUse | ToolOutcome:
    return use


async def _run_tool(use: ToolUse) -> ToolOutcome:
    """The innermost tool policy: the tool's journaled step, its result rendered."""
    tool, args = use.tool, use.arguments
    assert tool is not None and args is not None  # admitted: resolved and validated
    try:
        if isinstance(tool, AgentTool):  # a sub-agent's usage counts in this budget
            value = await tool.run(use.ctx, args, state=use.state)
        else:
            value = await tool.run(use.ctx, args)
    except StepFailed as exc:
        return ToolOutcome(tool.render_error(exc), True)
    except StepInterrupted as exc:
        return ToolOutcome(
            f"{tool.name}: interrupted by a crash; it may or may not have taken "
            f"effect ({exc.message})",
            True,
        )
    return ToolOutcome(tool.render_result(value), False)


def _result(call: ToolCall, outcome: tuple[str, bool, bool] | None) -> ToolResultMessage:
    content, is_error, _ = outcome if outcome is not None else ("not run", True, False)
    return ToolResultMessage(
        tool_call_id=call.id, name=call.name, content=content, is_error=is_error
    )


class _PlanEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str
    status: Literal["todo", "doing", "done", "dropped"] = "todo"


class _StateUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    plan: list[_PlanEntry] | None = None
    facts: list[str] | None = None
    note: str | None = None


_UPDATE_EXPECTED = (
    "update_state(plan: [{text, status: todo|doing|done|dropped}] | None, "
    "facts: [str] | None, note: str | None)"
)


def _state_update(arguments: str) -> dict[str, Any]:
    """The validated arguments of an ``update_state`` call, worded for the model."""
    raw = parse_arguments(arguments, tool="update_state", expected=_UPDATE_EXPECTED)
    try:
        return _StateUpdate.model_validate(raw).model_dump(exclude_none=True)
    except ValidationError as exc:
        problems = "; ".join(describe_errors(exc.errors()))
        raise ToolInputError(f"update_state: {problems}\nExpected: {_UPDATE_EXPECTED}") from None


def _plan_item(data: dict[str, Any]) -> PlanItem:
    return PlanItem(text=data["text"], status=data.get("status", "todo"))


def _loop_detected(ctx: RunContext, why: str) -> Exception:
    return LoopDetected(f"the agent kept {why}, even after being told", run_id=ctx.run_id)


def _named(tool: str, error: str) -> str:
    """``tool: error``, unless the error names the tool already (``ValidationFailed:
    get: ...``, ``get: interrupted ...``): a state's ``last_error`` says it once."""
    _, sep, rest = error.partition(": ")
    if error.startswith(f"{tool}:") or (sep and rest.startswith(f"{tool}:")):
        return error
    return f"{tool}: {error}"


def _no_action(response: ModelResponse) -> str:
    """What the model is told when its reply carried no usable action."""
    why = {
        "refusal": "You refused",
        "content_filter": "Your reply was filtered",
        "length": "Your reply was cut off at the token limit",
    }.get(response.finish_reason, "Your reply was empty")
    return f"{why}. Call a tool, or call finish with the answer."
