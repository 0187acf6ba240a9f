"""``Tool``: a function the model may call, with its schema, effect class and policies."""

from __future__ import annotations

import copy
import functools
import inspect
import math
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypedDict, TypeVar

from .._errors import ConfigError, ValidationFailed
from ..journal import RetryPolicy, StepMode, current_step
from ..models import ToolSpec
from ._arguments import parse_arguments, validate_arguments
from ._context import DEFAULT_TIMEOUT_S, EFFECTS, Effect, ToolContext, current_deps
from ._render import render_error, render_result
from ._schema import ArgumentSchema, brief_signature, build_schema

if TYPE_CHECKING:
    from ..journal import RunContext

__all__ = ["NAME_PATTERN", "Tool", "ToolOptions", "Validator", "tool_of"]

P = ParamSpec("P")
R = TypeVar("R")

Validator = Callable[[Any], "str | bool | None"]
"""An output rule: returns ``None`` (or ``True``, or ``""``) when the result is fine, an
error string (or ``False``) when it is not, or raises :class:`ValidationFailed`."""


class ToolOptions(TypedDict, total=False):
    """How a tool behaves, each option as :meth:`Tool.from_function` takes it (its
    defaults are there, its meanings in :func:`~mainspring.tools.tool`): the one list
    that the decorators forwarding these options type their ``**options`` with."""

    name: str | None
    description: str | None
    effect: Effect
    timeout_s: float | None
    retry: RetryPolicy | None
    requires_approval: bool | None
    validators: Sequence[Validator]
    max_result_chars: int


NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # what OpenAI and Anthropic accept
_MIN_RESULT_CHARS = 64


# Step function -> its tool: what an interceptor (the lab) reads to know a step's effect.
_TOOL_OF_STEP: weakref.WeakKeyDictionary[Callable[..., Any], Tool[..., Any]] = (
    weakref.WeakKeyDictionary()
)


def tool_of(step_function: Callable[..., Any]) -> Tool[..., Any] | None:
    """The tool whose :attr:`Tool.step_function` this is (``None`` for another step)."""
    try:
        return _TOOL_OF_STEP.get(step_function)
    except TypeError:  # not weak-referenceable: not a tool's step function
        return None


# Step function -> the effect class its caller declared, for step functions that are no
# Tool's (another framework's tool, called through an integration).
_EFFECT_OF_STEP: weakref.WeakKeyDictionary[Callable[..., Any], Effect] = weakref.WeakKeyDictionary()


def mark_step_effect(step_function: Callable[..., Any], effect: Effect) -> None:
    """Say what effect class the calls of ``step_function`` have, for interceptors that
    ask (:func:`step_effect`: the lab counts a ``read`` run twice as no duplicate). An
    integration marks the step functions it journals another framework's tools with."""
    _EFFECT_OF_STEP[step_function] = effect


def step_effect(step_function: Callable[..., Any]) -> Effect | None:
    """The effect class of a step function: its tool's, or the one
    :func:`mark_step_effect` gave it; ``None`` when nobody said."""
    found = tool_of(step_function)
    if found is not None:
        return found.effect
    try:
        return _EFFECT_OF_STEP.get(step_function)
    except TypeError:
        return None


@dataclass(frozen=True, eq=False, kw_only=True)
class Tool(Generic[P, R]):
    """A function the model may call, with its schema, effect class and policies.

    Create one with :func:`~mainspring.tools.tool`. Calling the ``Tool`` calls the function itself.

    Attributes:
        name: what the model calls it (``^[a-zA-Z0-9_-]{1,64}$``).
        description: what the model is told it does.
        fn: the decorated function.
        effect: ``"read"``, ``"write"`` or ``"irreversible"`` (see :data:`Effect`).
        timeout_s: seconds per attempt; by effect 30, 60 or 120 unless given.
        retry: the retry policy of its steps (``None``: the App's default, and no retry
            for ``irreversible`` tools, which run ``at_most_once``).
        requires_approval: a human must approve each call (default: only
            ``irreversible`` tools).
        validators: rules every result must pass (see :data:`Validator`).
        max_result_chars: longest text of a result shown to the model.
        step_function: what ``ctx.step`` runs: named ``tool:<name>`` (its
            ``__qualname__``, hence the journal's step name), sync for a sync tool and
            async for an async one. Call it with the validated arguments, as one
            positional mapping (safe for any argument names) or as keywords.
    """

    name: str
    description: str
    fn: Callable[P, R] = field(repr=False)
    effect: Effect
    timeout_s: float
    retry: RetryPolicy | None = field(repr=False)
    requires_approval: bool
    validators: tuple[Validator, ...] = field(repr=False)
    max_result_chars: int = field(repr=False)
    schema: ArgumentSchema = field(repr=False)
    step_function: Callable[..., Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "step_function", self._make_step_function())

    @classmethod
    def from_function(
        cls,
        fn: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
        effect: Effect = "read",
        timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
        requires_approval: bool | None = None,
        validators: Sequence[Validator] = (),
        max_result_chars: int = 4000,
        localns: Mapping[str, Any] | None = None,
    ) -> Tool[P, R]:
        """Build a tool from ``fn`` (what :func:`tool` does).

        Args:
            localns: names the annotations may use beyond ``fn``'s module (the locals
                of the function that defines the tool).

        Raises:
            ConfigError: a bad name, effect, timeout or limit, or arguments with no
                JSON schema.
        """
        tool_name = _tool_name(fn, name)
        timeout_s = _checked_settings(
            tool_name,
            effect=effect,
            timeout_s=timeout_s,
            retry=retry,
            max_result_chars=max_result_chars,
            validators=validators,
        )
        schema = build_schema(fn, tool_name, localns)
        return cls(
            name=tool_name,
            description=(description if description is not None else schema.description).strip(),
            fn=fn,
            effect=effect,
            timeout_s=timeout_s,
            retry=retry,
            requires_approval=(
                effect == "irreversible" if requires_approval is None else bool(requires_approval)
            ),
            validators=tuple(validators),
            max_result_chars=max_result_chars,
            schema=schema,
        )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the function directly (no step, no validation)."""
        return self.fn(*args, **kwargs)

    # -- what the model is told --------------------------------------------------------

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments (a copy)."""
        return copy.deepcopy(self.schema.json_schema)

    @functools.cached_property
    def signature(self) -> str:
        """A one-line summary of the arguments, shown in error messages."""
        return brief_signature(self.name, self.schema.json_schema)

    def spec(self) -> ToolSpec:
        """What the model is told about the tool: name, description, argument schema."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    # -- arguments -----------------------------------------------------------------------

    def parse_arguments(self, raw: str | Mapping[str, Any] | None) -> dict[str, Any]:
        """Read the arguments a model sent: JSON text (bare, in a markdown fence, or
        inside prose; ``""`` is ``{}``) or an already decoded mapping.

        Raises:
            ToolInputError: no JSON object could be read; says why, for the model.
        """
        return parse_arguments(raw, tool=self.name, expected=self.signature)

    def validate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Validate and coerce ``args`` against the schema.

        Returns:
            The arguments as the function's parameters expect them (``"3"`` becomes
            ``3`` for an ``int``, a dict becomes a nested model...), defaults filled in.

        Raises:
            ToolInputError: every problem in one message, e.g. ``send_email: argument
                'to' is required; argument 'count' must be an integer (got 'three');
                unexpected argument 'cc'``, then the expected call.
        """
        return validate_arguments(
            self.schema.model, self.schema.fields, args, tool=self.name, expected=self.signature
        )

    def prepare(self, raw: str | Mapping[str, Any] | None) -> dict[str, Any]:
        """``validate(parse_arguments(raw))``."""
        return self.validate(self.parse_arguments(raw))

    # -- running --------------------------------------------------------------------------

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @property
    def step_name(self) -> str:
        """The journal's name for this tool's steps: ``tool:<name>``."""
        return f"tool:{self.name}"

    @property
    def mode(self) -> StepMode:
        """``at_most_once`` for ``irreversible`` tools (never re-run after a crash
        left its outcome unknown), ``at_least_once`` for the others."""
        return "at_most_once" if self.effect == "irreversible" else "at_least_once"

    async def run(self, ctx: RunContext, arguments: Mapping[str, Any]) -> Any:
        """Run the tool as a journaled step with its timeout, retry policy and mode.

        ``arguments`` are validated ones (see :meth:`validate`). Approval is not asked
        here: that is the agent's policy.

        Raises:
            StepFailed: the tool failed for good (its error is the ``error_type``).
            StepInterrupted: an ``irreversible`` call was interrupted by a crash.
        """
        return await ctx.step(
            self.step_function,
            dict(arguments),
            name=self.step_name,
            mode=self.mode,
            retry=self.retry,
            timeout=self.timeout_s,
            role="tool",
        )

    def context(self) -> ToolContext:
        """The :class:`ToolContext` of the step running now.

        Raises:
            ConfigError: called outside a step.
        """
        try:
            info = current_step()
        except RuntimeError:
            raise ConfigError(
                f"tool {self.name!r} takes a ToolContext, so it must run as a step: "
                f"`await tool.run(ctx, arguments)` or `await ctx.step(tool.step_function, "
                "arguments)`"
            ) from None
        deps = current_deps()
        return ToolContext(
            run_id=info.run_id,
            session=info.session,
            seq=info.seq,
            attempt=info.attempt,
            idempotency_key=info.idempotency_key,
            tool=self.name,
            effect=self.effect,
            agent=None if deps is None else deps.agent,
            deps_source=deps,
        )

    def check_result(self, result: Any) -> None:
        """Run the validators on ``result``.

        Raises:
            ValidationFailed: a rule failed; the message names the tool and the rule.
        """
        for rule in self.validators:
            label = getattr(rule, "__name__", None) or repr(rule)
            try:
                verdict = rule(result)
            except ValidationFailed as exc:
                raise ValidationFailed(
                    f"{self.name}: result failed validator {label!r}: {exc.message}"
                ) from exc
            if verdict is None or verdict is True or verdict == "":
                continue
            reason = "it returned False" if verdict is False else str(verdict)
            raise ValidationFailed(f"{self.name}: result failed validator {label!r}: {reason}")

    def _call_kwargs(
        self, arguments: Mapping[str, Any] | None, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        call = dict(arguments or {})
        clash = call.keys() & kwargs.keys()
        if clash:
            raise TypeError(f"tool {self.name!r}: arguments given twice: {sorted(clash)}")
        call.update(kwargs)
        if self.schema.context_param is not None:
            call[self.schema.context_param] = self.context()
        return call

    def _make_step_function(self) -> Callable[..., Any]:
        fn: Callable[..., Any] = self.fn
        step: Callable[..., Any]
        if inspect.iscoroutinefunction(fn):

            async def run_async(arguments: Mapping[str, Any] | None = None, /, **kw: Any) -> Any:
                result = await fn(**self._call_kwargs(arguments, kw))
                self.check_result(result)
                return result

            step = run_async
        else:

            def run_sync(arguments: Mapping[str, Any] | None = None, /, **kw: Any) -> Any:
                result = fn(**self._call_kwargs(arguments, kw))
                self.check_result(result)
                return result

            step = run_sync
        step.__name__ = step.__qualname__ = self.step_name
        step.__doc__ = f"Run the tool {self.name!r} as a step."
        # ctx.step decodes a replayed result to the return annotation: the tool's.
        step.__annotations__ = {"return": self.schema.return_type}
        _TOOL_OF_STEP[step] = self
        return step

    # -- results ----------------------------------------------------------------------------

    def render_result(self, value: Any) -> str:
        """The result as the model sees it: compact JSON (a string as itself), cut to
        ``max_result_chars`` with a marker saying how much was cut."""
        return render_result(value, limit=self.max_result_chars)

    def render_error(self, exc: BaseException) -> str:
        """A failure as the model sees it: ``"ValueError: no ticket 42"``, short."""
        return render_error(exc)


def _tool_name(fn: object, name: str | None) -> str:
    """The name the model calls ``fn`` by, refused unless every provider accepts it."""
    if isinstance(fn, Tool):
        raise ConfigError(f"{fn.name!r} is already a tool")
    if not callable(fn):
        raise ConfigError(f"@tool needs a function, got {fn!r}")
    tool_name = name if name is not None else getattr(fn, "__name__", repr(fn))
    if not isinstance(tool_name, str) or not NAME_PATTERN.match(tool_name):
        raise ConfigError(
            f"tool name {tool_name!r} is not allowed: use 1 to 64 letters, digits, '_' "
            "or '-' (the rule of the model providers); pass name= to choose another"
        )
    return tool_name


def _checked_settings(
    tool_name: str,
    *,
    effect: Effect,
    timeout_s: float | None,
    retry: RetryPolicy | None,
    max_result_chars: int,
    validators: Sequence[Validator],
) -> float:
    """Refuse a bad setting when the tool is declared, not at its first call; the
    timeout, defaulted by effect."""
    if effect not in EFFECTS:
        raise ConfigError(f"tool {tool_name!r}: effect must be one of {EFFECTS}, got {effect!r}")
    if timeout_s is None:
        timeout_s = DEFAULT_TIMEOUT_S[effect]
    elif not (isinstance(timeout_s, int | float) and 0 < timeout_s < math.inf):
        raise ConfigError(
            f"tool {tool_name!r}: timeout_s must be a finite number > 0, got {timeout_s!r}"
        )
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigError(f"tool {tool_name!r}: retry must be a RetryPolicy, got {retry!r}")
    if not isinstance(max_result_chars, int) or max_result_chars < _MIN_RESULT_CHARS:
        raise ConfigError(
            f"tool {tool_name!r}: max_result_chars must be an int >= {_MIN_RESULT_CHARS}, "
            f"got {max_result_chars!r}"
        )
    for rule in validators:
        if not callable(rule):
            raise ConfigError(f"tool {tool_name!r}: validator {rule!r} is not callable")
    return float(timeout_s)
