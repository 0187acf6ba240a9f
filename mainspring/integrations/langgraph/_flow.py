"""``durable(app, graph)``: a compiled LangGraph graph as a registered mainspring
workflow, and the driver that runs it.

The driver is the workflow: it runs the graph (nodes wrapped by :mod:`._run`) over an
in-memory checkpointer that each execution rebuilds by replay, turns the graph's
interrupts into requests to humans (durable waits: the run leaves its worker), resumes
it with the answers (``Command(resume=...)``), and mirrors its checkpoints into
mainspring's database (:class:`~._saver.MainspringSaver`, the run's id as the thread),
where LangGraph's state APIs read them.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.language_models import BaseLanguageModel
from langchain_core.runnables import (
    RunnableBinding,
    RunnableConfig,
    RunnableLambda,
    RunnableSequence,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.pregel import Pregel
from langgraph.types import Command, Durability
from langgraph.types import RetryPolicy as GraphRetry

from ... import App, Approval, ApprovalRejected, ConfigError, Limits, RunContext, Workflow
from ... import RetryPolicy as MsRetry
from ...limits import Price
from ._mirror import Mirror
from ._models import ModelCalls
from ._run import ASK, EXECUTION, Execution, NodeSpec
from ._saver import MainspringSaver
from ._serde import decode, encode
from ._tasks import TaskCalls, TaskResults, task_policy

__all__ = ["DurableGraph", "InterruptKind", "durable"]

InterruptKind = Literal["approval", "question"]

# Model calls inside a model node: transient errors must almost never end a long run
# (mainspring's own model retry, DEFAULT_MODEL_RETRY).
_MODEL_RETRY = MsRetry(max_attempts=8, initial_s=1.0, max_s=30.0)
_RECURSION_LIMIT = 10_000


@dataclass(frozen=True, eq=False)
class DurableGraph(Workflow[..., Any]):
    """A LangGraph graph registered as a mainspring workflow (what :func:`durable`
    returns): submit it, run it, fork it, like any workflow.

    Its input and result keep LangGraph's values (messages stay messages).

    Attributes:
        graph: the graph compiled over mainspring's checkpoints, for LangGraph's state
            APIs on a run: ``flow.graph.get_state({"configurable": {"thread_id":
            run_id}})``, ``get_state_history``.
    """

    graph: Any = field(default=None, repr=False)

    def encode_input(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if len(args) + len(kwargs) > 1 or set(kwargs) - {"input"}:
            raise ConfigError(
                f"graph workflow {self.name!r} takes one input (the graph's), got "
                f"args={args!r} kwargs={kwargs!r}"
            )
        try:
            return json.dumps(
                {
                    "args": [encode(a) for a in args],
                    "kwargs": {k: encode(v) for k, v in kwargs.items()},
                }
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"input of graph workflow {self.name!r}: {exc}") from None

    def decode_input(self, text: str) -> tuple[list[Any], dict[str, Any]]:
        data = json.loads(text)
        args = [decode(a) for a in data.get("args", [])]
        return args, {k: decode(v) for k, v in dict(data.get("kwargs", {})).items()}

    def decode_output(self, text: str | None) -> Any:
        return None if text is None else decode(json.loads(text))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Options:
    app: App
    name: str
    limits: Limits
    interrupts: InterruptKind | Callable[[Any], InterruptKind]
    resume: Callable[[Approval | str], Any] | None
    durability: Durability
    recursion_limit: int
    calls: ModelCalls
    loop_repeats: int
    make_input: Callable[[Any], Any] | None


def durable(
    app: App,
    graph: Any,
    *,
    name: str | None = None,
    limits: Limits | None = None,
    interrupts: InterruptKind | Callable[[Any], InterruptKind] = "approval",
    resume: Callable[[Approval | str], Any] | None = None,
    durability: Durability = "exit",
    recursion_limit: int | None = None,
    model_nodes: Sequence[str] | None = None,
    repair: bool = True,
    prices: Mapping[str, Price] | None = None,
    loop_repeats: int = 3,
    make_input: Callable[[Any], Any] | None = None,
) -> DurableGraph:
    """Register a LangGraph graph on ``app`` as a durable workflow and return it.

    Each node execution is a journaled step (``node:<name>``); ``interrupt()`` is a
    request to a human; a run resumes at the exact node after a crash. See
    docs/bring-your-agent.md.

    Args:
        app: the App to register on.
        graph: a compiled graph (``builder.compile()``), or its ``StateGraph`` builder.
        name: the workflow's name (default: the graph's name).
        limits: budgets (``max_steps`` counts node executions, ``max_cost_usd`` and
            ``max_tokens`` the model calls inside nodes, ``max_wall_s``); reaching
            one pauses the run and asks a human (``budget:<limit>``).
        interrupts: what an ``interrupt(value)`` asks: ``"approval"`` (approve or
            reject; the node gets ``True``/``False``, or the edited arguments) or
            ``"question"`` (the node gets the answer's text), or a function of the
            value that says which.
        resume: turns the answer (an :class:`~mainspring.Approval` or the question's
            text) into the value ``interrupt()`` returns, instead of the above.
        durability: LangGraph's durability mode, for the checkpoints mirrored for
            its state APIs: ``"exit"`` (default: at each interrupt and at the end),
            ``"async"``/``"sync"`` (every superstep, the whole history). The run's own
            durability is the journal's, whatever this says.
        recursion_limit: LangGraph's superstep limit (default 10,000; budgets and
            the loop guard are the brakes).
        model_nodes: the nodes that call a model, journaled with role ``model`` (their
            tokens and cost in the trace); default: nodes whose function refers to a
            LangChain chat model.
        repair: a model reply whose tool-call arguments are not JSON is asked again
            (the node's step fails its attempt and runs again) instead of reaching the
            graph as ``invalid_tool_calls``.
        prices: USD per million tokens by model id, for the cost of model calls
            (default: mainspring's table).
        loop_repeats: a node (or two nodes taking turns) getting the same input this
            many times in a row pauses the run and asks a human.
        make_input: turns the run's input into the graph's (a plain text submitted
            through the API into ``{"messages": [...]}``, say); it must be
            deterministic: a replay calls it again.

    Raises:
        ConfigError: ``graph`` is not a LangGraph graph, or the name is taken.
    """
    if not isinstance(graph, Pregel):
        compile_ = getattr(graph, "compile", None)
        if compile_ is None:
            raise ConfigError(
                f"durable() takes a compiled LangGraph graph or its StateGraph builder, "
                f"not {type(graph).__name__}"
            )
        graph = compile_()
    flow_name = name or graph.get_name()
    if flow_name in app.workflows:
        raise ConfigError(f"a workflow named {flow_name!r} is already registered on this App")
    options = _Options(
        app=app,
        name=flow_name,
        limits=limits or Limits(max_steps=None),
        interrupts=interrupts,
        resume=resume,
        durability=durability,
        recursion_limit=recursion_limit
        or int(graph.config.get("recursion_limit", 0) if graph.config else 0)
        or _RECURSION_LIMIT,
        calls=ModelCalls(app, repair=repair, prices=dict(prices) if prices else None),
        loop_repeats=loop_repeats,
        make_input=make_input,
    )
    wrapped = _wrap(graph, options, set(model_nodes) if model_nodes is not None else None)

    async def run(ctx: RunContext, input: Any = None) -> Any:
        return await _drive(ctx, input, wrapped, options)

    run.__qualname__ = run.__name__ = flow_name
    made = DurableGraph.create(run, flow_name)
    assert isinstance(made, DurableGraph)
    flow = dataclasses.replace(made, graph=graph.copy({"checkpointer": MainspringSaver(app)}))
    app.workflows[flow_name] = flow
    return flow


# -- the graph, wrapped ---------------------------------------------------------------


def _wrap(
    graph: Pregel[Any, Any, Any, Any], options: _Options, model_nodes: set[str] | None
) -> Pregel[Any, Any, Any, Any]:
    nodes = {}
    for node_name, node in graph.nodes.items():
        if node_name.startswith("__"):  # LangGraph's own (__start__)
            nodes[node_name] = node
            continue
        bound = node.bound
        child = None
        if isinstance(bound, Pregel):  # a subgraph added as a node: a child run
            child = durable(
                options.app,
                bound,
                name=f"{options.name}.{node_name}",
                limits=options.limits,
                interrupts=options.interrupts,
                resume=options.resume,
                durability=options.durability,
                recursion_limit=options.recursion_limit,
                model_nodes=sorted(model_nodes) if model_nodes is not None else None,
                repair=options.calls.repair,
                prices=options.calls.prices,
                loop_repeats=options.loop_repeats,
            )
        is_model = node_name in model_nodes if model_nodes is not None else _calls_model(bound)
        spec = NodeSpec(
            name=node_name,
            bound=bound,
            role="model" if is_model else "step",
            retry=_retry(node.retry_policy, graph.retry_policy, is_model),
            timeout=_timeout(node.timeout),
            child=child,
        )
        nodes[node_name] = node.copy(
            {"bound": _node_runnable(spec), "retry_policy": None, "timeout": None, "subgraphs": []}
        )
    # @task calls inside a node keep their results as they complete (._tasks).
    return graph.copy(
        {
            "nodes": nodes,
            "checkpointer": None,
            "retry_policy": (),
            "cache": TaskResults(_task_calls, graph.cache),
            "cache_policy": task_policy(_task_calls, graph.cache_policy),
        }
    )


def _task_calls() -> TaskCalls | None:
    ex = EXECUTION.get()
    return None if ex is None else ex.task_calls


def _node_runnable(spec: NodeSpec) -> RunnableLambda[Any, Any]:
    async def node(state: Any, config: RunnableConfig) -> Any:
        ex = EXECUTION.get()
        if ex is None:  # the wrapped graph run outside mainspring: the node as it is
            return await spec.bound.ainvoke(state, config)
        return await ex.run_node(spec, state, config)

    return RunnableLambda(node, name=spec.name)


def _retry(
    own: Sequence[GraphRetry] | None, graph_wide: Sequence[GraphRetry] | None, is_model: bool
) -> MsRetry | None:
    """The node step's retry policy: the node's LangGraph ``RetryPolicy`` (its first),
    else the graph's, else mainspring's model retry for a model node, else the App's
    default."""
    policy = (own or None) or (graph_wide or None)
    if policy:
        first = policy[0]
        return MsRetry(
            max_attempts=first.max_attempts,
            initial_s=first.initial_interval,
            multiplier=max(1.0, first.backoff_factor),
            max_s=first.max_interval,
            jitter=first.jitter,
        )
    return _MODEL_RETRY if is_model else None


def _timeout(policy: Any) -> float | None:
    found = getattr(policy, "run_timeout", None)
    if found is None:
        return None
    return float(found.total_seconds()) if hasattr(found, "total_seconds") else float(found)


def _is_model(value: Any, depth: int = 0) -> bool:
    if isinstance(value, BaseLanguageModel):
        return True
    if depth >= 3:
        return False
    if isinstance(value, RunnableBinding):
        return _is_model(value.bound, depth + 1)
    if isinstance(value, RunnableSequence):
        return any(_is_model(step, depth + 1) for step in value.steps)
    return False


def _calls_model(bound: Any) -> bool:
    """Whether a node's function refers to a chat model (a closure, a default, a
    global it names): the node is journaled as a model call."""
    for fn in (getattr(bound, "func", None), getattr(bound, "afunc", None)):
        if fn is None:
            continue
        fn = inspect.unwrap(fn)
        code = getattr(fn, "__code__", None)
        if code is None:
            continue
        seen: list[Any] = list(getattr(fn, "__defaults__", None) or ())
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                seen.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
        names = getattr(fn, "__globals__", {})
        seen += [names[n] for n in code.co_names if n in names]
        if any(_is_model(v) for v in seen):
            return True
    return False


# -- the driver -----------------------------------------------------------------------


async def _drive(
    ctx: RunContext, given: Any, wrapped: Pregel[Any, Any, Any, Any], options: _Options
) -> Any:
    execution = Execution(
        ctx=ctx,
        clock=ctx.clock,
        limits=options.limits,
        started=ctx.now().timestamp(),
        loop_repeats=options.loop_repeats,
        task_calls=TaskCalls(ctx),
    )
    token = EXECUTION.set(execution)
    try:
        memory = InMemorySaver()
        graph = wrapped.copy({"checkpointer": memory})
        config: RunnableConfig = {
            "configurable": {"thread_id": ctx.run_id},
            "callbacks": [options.calls],
            "recursion_limit": options.recursion_limit,
        }
        # The run's own store (the lab runs a workflow on an App of its own).
        mirror = Mirror(MainspringSaver(ctx.store), ctx)
        if options.make_input is not None:
            given = options.make_input(given)
        asked = 0
        while True:
            out = await graph.ainvoke(given, config, durability=options.durability)
            snapshot = await graph.aget_state(config)
            await mirror.sync(memory)
            pending = [(task.name, i) for task in snapshot.tasks for i in task.interrupts]
            if not pending and not snapshot.next:
                return encode(_values(out))
            if not pending:  # a static breakpoint (interrupt_before / interrupt_after)
                asked += 1
                where = "+".join(snapshot.next)
                decision = await ctx.request(
                    f"approval:breakpoint.{where}.{asked}",
                    title=f"breakpoint before {where}: continue?",
                    preview={"next": list(snapshot.next)},
                )
                if not decision.approved:
                    why = f": {decision.reason}" if decision.reason else ""
                    raise ApprovalRejected(
                        f"breakpoint before {where} rejected{why}", run_id=ctx.run_id
                    )
                given = None
                continue
            answers = {}
            for node, found in pending:
                asked += 1
                answers[found.id] = await _ask(ctx, options, node, found.value, asked)
            given = Command(resume=answers)
    finally:
        EXECUTION.reset(token)


def _values(out: Any) -> Any:
    if isinstance(out, dict):
        return {k: v for k, v in out.items() if k != "__interrupt__"}
    return out


async def _ask(ctx: RunContext, options: _Options, node: str, value: Any, n: int) -> Any:
    """One interrupt, asked as a request; the value ``interrupt()`` returns."""
    if isinstance(value, dict) and ASK in value:
        if value[ASK] == "budget":
            which = value["limit"]
            decision = await ctx.request(
                f"budget:{which}",
                title=f"{which} reached ({value['used']:g} of {value['cap']:g}) before "
                f"node {value['node']!r}: continue?",
                preview={k: value[k] for k in ("limit", "cap", "used", "node")},
            )
            raised = (decision.arguments or {}).get("limit")
            return {"approved": decision.approved, "limit": raised}
        decision = await ctx.request(
            f"approval:loop.{value['n']}",
            title=f"node {value['node']!r} repeats the same update ({value['pattern']}): continue?",
            preview={"node": value["node"], "pattern": value["pattern"]},
        )
        return {"approved": decision.approved}
    kind = options.interrupts(value) if callable(options.interrupts) else options.interrupts
    preview = encode(value)
    answer: Approval | str
    if kind == "question":
        title = value if isinstance(value, str) else f"node {node!r} asks"
        answer = await ctx.request(
            f"question:{node}.{n}", kind="question", title=title, preview=preview
        )
    else:
        answer = await ctx.request(
            f"approval:{node}.{n}", title=f"node {node!r} asks to go on", preview=preview
        )
    if options.resume is not None:
        return options.resume(answer)
    if isinstance(answer, str):
        return answer
    if answer.approved and answer.arguments is not None:
        return answer.arguments
    return answer.approved
