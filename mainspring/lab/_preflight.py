"""``preflight``: a workflow or agent against seed 000's pre-release checklist.

Each check returns what is missing and how to fix it. Agents are checked in full
(their tools, limits, validators and allowlist are data); plain workflows are
checked from their signature and source (steps, timeouts, names, determinism).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .. import App, ConfigError
from ..agent import Agent
from ..journal import Workflow
from ..limits import price_of
from ..serde import return_type_problem
from ..tools import Tool
from ._imports import import_object

__all__ = ["CHECKS", "Finding", "PreflightReport", "load_target", "preflight"]

CheckId = Literal[
    "schemas",
    "bounds",
    "resume",
    "tool_contracts",
    "gate_irreversible",
    "traces",
    "completion",
    "compensation",
    "least_privilege",
]
CHECKS: dict[CheckId, str] = {
    "schemas": "stages with input and output schemas",
    "bounds": "max retries and max duration",
    "resume": "resume from the last checkpoint",
    "tool_contracts": "a success and failure contract per tool",
    "gate_irreversible": "approval or validation before irreversible steps",
    "traces": "traces and token/cost accounting on",
    "completion": "measurable completion criteria",
    "compensation": "compensation for writes",
    "least_privilege": "least-privilege tool allowlist",
}
_UNDO = ("undo_", "revert_", "rollback_", "cancel_", "refund_", "delete_", "compensate_")
_NONDETERMINISTIC = {
    ("time", "time"),
    ("time", "monotonic"),
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("uuid", "uuid4"),
    ("random", "random"),
    ("random", "randint"),
    ("random", "choice"),
    ("os", "urandom"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One checklist item: passed, or what is missing and the fix."""

    check: CheckId
    title: str
    status: Literal["pass", "fail", "n/a"]
    problems: tuple[str, ...] = ()
    fix: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PreflightReport:
    target: str
    kind: Literal["agent", "workflow"]
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return all(f.status != "fail" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "kind": self.kind,
            "ok": self.ok,
            "findings": [
                {
                    "check": f.check,
                    "title": f.title,
                    "status": f.status,
                    "problems": list(f.problems),
                    "fix": f.fix,
                }
                for f in self.findings
            ],
        }


def _finding(check: CheckId, problems: list[str], fix: str) -> Finding:
    return Finding(
        check=check,
        title=CHECKS[check],
        status="fail" if problems else "pass",
        problems=tuple(problems),
        fix=fix if problems else "",
    )


def _na(check: CheckId, why: str) -> Finding:
    return Finding(check=check, title=CHECKS[check], status="n/a", problems=(why,))


# -- loading -------------------------------------------------------------------------------


def load_target(spec: str) -> tuple[Agent | Workflow[Any, Any], App | None]:
    """Import ``MODULE:OBJECT``: an agent (the workflow ``app.agent`` returned, or
    the :class:`Agent`) or a workflow. The App is found in the module when it holds one.

    Raises:
        ConfigError: a malformed spec, a module that does not import, a missing
            attribute, or an object that is neither an agent nor a workflow.
    """
    obj, module = import_object(spec)
    apps = [v for v in vars(module).values() if isinstance(v, App)]
    if isinstance(obj, Agent):
        return obj, next((a for a in apps if obj.name in a.agents), None)
    if isinstance(obj, Workflow):
        for a in apps:
            if a.workflows.get(obj.name) is obj and obj.name in a.agents:
                return a.agents[obj.name], a
        return obj, next((a for a in apps if obj.name in a.workflows), None)
    raise ConfigError(
        f"{spec!r} is a {type(obj).__name__}: preflight checks an agent (what app.agent() "
        "returns) or a workflow (@app.workflow)"
    )


def preflight(
    spec_or_target: str | Agent | Workflow[Any, Any], app: App | None = None
) -> PreflightReport:
    """Check an agent or workflow (or ``"MODULE:OBJECT"``) against the checklist."""
    if isinstance(spec_or_target, str):
        target, app = load_target(spec_or_target)
        name = spec_or_target
    else:
        target, name = spec_or_target, spec_or_target.name
        if app is not None and app.workflows.get(name) is target and name in app.agents:
            target = app.agents[name]  # the workflow app.agent() returned: check the agent
    if isinstance(target, Agent):
        return PreflightReport(target=name, kind="agent", findings=_check_agent(target))
    return PreflightReport(target=name, kind="workflow", findings=_check_workflow(target, app))


# -- agents --------------------------------------------------------------------------------


def _tools(agent: Agent) -> list[Tool[Any, Any]]:
    return list(agent.plain_tools)


def _return_type(fn: Callable[..., Any]) -> Any:
    try:
        return typing.get_type_hints(fn).get("return", inspect.Signature.empty)
    except Exception:
        return inspect.signature(fn).return_annotation


def _untyped(tp: Any) -> bool:
    return tp in (inspect.Signature.empty, Any, None, type(None), object)


def _structured(tp: Any) -> bool:
    origin = typing.get_origin(tp) or tp
    if isinstance(origin, type) and (
        hasattr(origin, "model_fields")
        or hasattr(origin, "__dataclass_fields__")
        or typing.is_typeddict(origin)
    ):
        return True
    return origin in (int, float, bool) or typing.get_origin(tp) is Literal


def _check_agent(agent: Agent) -> tuple[Finding, ...]:
    tools = _tools(agent)
    writes = [t for t in tools if t.effect != "read"]
    names = set(agent.allowed)
    return (
        _finding(
            "schemas",
            [f"tool {t.name!r}: {what}" for t in tools for what in _schema_gaps(t)],
            "annotate every tool parameter and the return type (a dataclass, pydantic "
            "model or TypedDict for structured results): they become the tool's input "
            "and output schemas",
        ),
        _finding(
            "bounds",
            [
                p
                for p in (
                    None if agent.limits.max_steps else "limits.max_steps is not set",
                    None if agent.limits.max_wall_s else "limits.max_wall_s is not set",
                    None
                    if agent.limits.max_cost_usd or agent.limits.max_tokens
                    else "neither limits.max_cost_usd nor limits.max_tokens is set",
                )
                if p
            ]
            + [
                f"tool {t.name!r} retries up to {t.retry.max_attempts} attempts"
                for t in tools
                if t.retry is not None and t.retry.max_attempts > 10
            ],
            "pass limits=ms.Limits(max_steps=..., max_wall_s=..., max_cost_usd=...) and "
            "keep tool retries to a few attempts",
        ),
        _finding(
            "resume",
            [
                f"write tool {t.name!r} takes no `ctx: ToolContext`, so a step re-run after "
                "a crash cannot pass the same idempotency key"
                for t in writes
                if t.effect == "write" and t.schema.context_param is None
            ],
            "give write tools a keyword-only `ctx: ms.ToolContext` and pass "
            "ctx.idempotency_key to the outside world",
        ),
        _finding(
            "tool_contracts",
            [
                f"{t.effect} tool {t.name!r} has no validators and no structured return type"
                for t in writes
                if not t.validators and not _structured(_return_type(t.fn))
            ],
            "return a typed result (dataclass/pydantic/TypedDict) or pass validators=[...] "
            "to @tool so a failed call is told from a successful one",
        ),
        _finding(
            "gate_irreversible",
            [
                f"irreversible tool {t.name!r} runs with neither approval nor validators"
                for t in tools
                if t.effect == "irreversible" and not t.requires_approval and not t.validators
            ],
            "leave requires_approval on for irreversible tools (the default), or add "
            "validators that check the call before it acts",
        ),
        _finding(
            "traces",
            []
            if price_of(agent.resolved_model.model_id, agent.prices) is not None
            else [
                f"no price for model {agent.resolved_model.model_id!r}: its cost is recorded as 0 "
                "in every trace"
            ],
            "pass prices={model_id: ms.limits.Price(input=..., output=...)} to app.agent",
        ),
        _finding(
            "completion",
            [] if agent.validators else ["no completion validators: any `finish` is accepted"],
            "pass validators=[lambda answer, state: None if <check> else 'why'] to app.agent",
        ),
        _finding(
            "compensation",
            [
                f"{t.effect} tool {t.name!r} has no compensating tool "
                f"({', '.join(p + t.name for p in _UNDO[:3])}, ...) and its description "
                "names none"
                for t in writes
                if not any(p + t.name in names for p in _UNDO)
                and "compensat" not in t.description.lower()
                and "undo" not in t.description.lower()
            ],
            "register an undo tool (undo_<name>, revert_<name>, refund_<name>, ...) or say "
            "in the tool's description how its effect is compensated",
        ),
        _finding(
            "least_privilege",
            [
                f"{t.effect} tool {t.name!r} is allowed but the instructions never mention it"
                for t in writes
                if t.name not in agent.instructions
            ],
            "allow only the tools the task needs, and say in the instructions when to use "
            "each write tool",
        ),
    )


def _schema_gaps(t: Tool[Any, Any]) -> list[str]:
    gaps = []
    try:
        params = inspect.signature(t.fn).parameters
        hints = typing.get_type_hints(t.fn)
    except Exception:
        return ["its signature cannot be read"]
    for name, param in params.items():
        if name == t.schema.context_param or param.kind in (
            param.VAR_POSITIONAL,
            param.VAR_KEYWORD,
        ):
            continue
        if _untyped(hints.get(name, inspect.Signature.empty)):
            gaps.append(f"parameter {name!r} has no type")
    returns = _return_type(t.fn)
    if _untyped(returns):
        gaps.append("no return type")
    elif (problem := return_type_problem(t.schema.return_type)) is not None:
        # Recommending a typed result is only honest if the journal can give it back.
        gaps.append(
            f"its return type {returns!r} cannot be rebuilt from the journal, so a replay "
            f"would see plain JSON ({problem})"
        )
    return gaps


# -- workflows -----------------------------------------------------------------------------


def _calls(fn: Callable[..., Any]) -> list[ast.Call]:
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return []
    tree = ast.parse(textwrap.dedent("".join(lines)))
    ast.increment_lineno(tree, first - 1)  # line numbers of the file, for messages
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def _dotted(node: ast.AST) -> tuple[str, ...]:
    if isinstance(node, ast.Attribute):
        return (*_dotted(node.value), node.attr)
    if isinstance(node, ast.Name):
        return (node.id,)
    return ()


def _check_workflow(wf: Workflow[Any, Any], app: App | None) -> tuple[Finding, ...]:
    calls = _calls(wf.fn)
    steps = [c for c in calls if _dotted(c.func)[-1:] == ("step",)]
    try:  # as the workflow reads them (an unresolvable hint: none at all)
        hints = typing.get_type_hints(wf.fn)
    except Exception:
        hints = {}
    params = list(inspect.signature(wf.fn).parameters)[1:]
    schema = [
        f"argument {p!r} has no type"
        for p in params
        if _untyped(hints.get(p, inspect.Signature.empty))
    ]
    if _untyped(hints.get("return", inspect.Signature.empty)):
        schema.append("the workflow has no return type")
    if not steps:
        schema.append("no ctx.step(...) calls: nothing is checkpointed")
    kw = [{k.arg for k in c.keywords} for c in steps]
    bounds = [
        f"ctx.step at line {c.lineno} has no timeout="
        for c, k in zip(steps, kw, strict=True)
        if "timeout" not in k
    ]
    if app is not None and app.default_retry.max_attempts > 10:
        bounds.append(f"the App retries steps {app.default_retry.max_attempts} times")
    nondet = sorted(
        {
            ".".join(_dotted(c.func))
            for c in calls
            if _dotted(c.func)[-2:] in _NONDETERMINISTIC
            and not any(c in ast.walk(s) for s in steps)
        }
    )
    lambdas = [
        f"ctx.step at line {c.lineno} runs a lambda with no name="
        for c, k in zip(steps, kw, strict=True)
        if c.args and isinstance(c.args[0], ast.Lambda) and "name" not in k
    ]
    at_most = any(
        isinstance(k.value, ast.Constant) and k.value.value == "at_most_once"
        for c in steps
        for k in c.keywords
        if k.arg == "mode"
    )
    gated = any(_dotted(c.func)[-1:] in (("approval",), ("wait_for",)) for c in calls)
    return (
        _finding(
            "schemas",
            schema,
            "annotate the workflow's arguments and result, and make each stage a ctx.step(...)",
        ),
        _finding("bounds", bounds, "pass timeout= to each ctx.step (and keep retry= bounded)"),
        _finding(
            "resume",
            [f"{n}() is called in the workflow body: a replay takes another path" for n in nondet],
            "use ctx.now(), ctx.uuid() and ctx.random(), or call it inside a ctx.step",
        ),
        _na("tool_contracts", "a workflow has no tools; check its steps' return types"),
        _finding(
            "gate_irreversible",
            ["at_most_once (irreversible) steps run with no approval or signal before them"]
            if at_most and not gated
            else [],
            "wait for a human with ctx.wait_for(...) / ctx.approval(...) before the step",
        ),
        _finding("traces", lambdas, "name each step: ctx.step(fn, name='stage-name')"),
        _finding(
            "completion",
            []
            if not _untyped(hints.get("return", inspect.Signature.empty))
            else ["no return type: success is not defined by a checkable result"],
            "return a typed result that says what was done",
        ),
        _na("compensation", "declare compensation in the steps of the workflow itself"),
        _na("least_privilege", "a workflow calls its own functions; no allowlist"),
    )
