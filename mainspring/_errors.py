"""The one error tree of mainspring.

Every error the runtime raises derives from :class:`MainspringError`, except
:class:`Cancelled`, which derives from ``BaseException`` so that a workflow's
``except Exception`` cannot swallow a cancellation.

Each class says whether retrying can help through its ``retryable`` attribute:

* ``retryable = True``: the same call may succeed later (network, timeouts, 5xx,
  rate limits, a locked database). Retry policies back off and try again, honouring
  ``retry_after`` when the error carries one.
* ``retryable = False``: retrying the same call cannot help. The input, the code,
  the configuration or a human decision must change first.

Messages name the run, the step and the offending value (quoted with ``{value!r}``)
so that a line in a log is enough to find the problem.

Tree::

    MainspringError
    ├── TransientError            retryable: network, timeout, 5xx, locked database
    │   ├── RateLimited           retryable after ``retry_after`` seconds
    │   ├── Overloaded            the provider is overloaded (529, 503 "overloaded")
    │   ├── StepTimeout           one attempt of a step ran past its timeout
    │   └── StoreUnavailable      the database is locked or unreachable
    ├── ToolInputError            arguments do not match a tool's schema (the model can repair)
    ├── ModelOutputError          a model's output cannot be parsed (the model can repair)
    ├── ContextOverflow           the prompt is too long (compact, then retry once)
    ├── PermissionDenied          auth or permission refused: ask a human
    │   └── ReservedSignal        a raw signal to a request's name: answer the request
    ├── QuotaExhausted            the account is out of quota: ask a human
    ├── UnknownTool               the model called a tool that does not exist
    ├── ToolNotAllowed            the tool exists but is not on the agent's allowlist
    ├── BudgetExceeded            steps, tokens, cost or wall time ran out
    ├── LoopDetected              the agent repeats itself
    ├── StepInterrupted           an at_most_once step started and never finished
    ├── StepFailed                a journaled step failed for good (what workflow code sees)
    ├── WaitTimeout               ``ctx.wait_for`` timed out with no default
    ├── NondeterminismError       replay met a different step than the journal holds
    ├── LeaseLost                 another worker took the run over (epoch fencing)
    ├── ValidationFailed          an output failed its validators
    ├── ShadowStubMissing         a shadow has no recorded result or stub for an effect
    ├── RunNotFound               no run with that id
    ├── ScheduleNotFound          no schedule with that name
    ├── RunConflict               the run is not in a state that allows the request
    ├── RequestNotFound           no pending request to a human by that id
    ├── InvalidAnswer             a malformed answer to a request (bad decision or choice)
    ├── ApprovalRejected          a reviewer rejected a stage gate
    ├── RunFailed                 the awaited run ended failed or cancelled
    ├── ChildFailed               a child run (``ctx.child``) ended failed or cancelled
    │   └── ChildCancelled        ... cancelled
    ├── RunWaiting                ``app.run``'s run waits for a person or a signal
    ├── ConfigError               a mistake in code or configuration
    │   ├── UnknownWorkflow       no workflow registered under that name
    │   ├── SerializationError    a payload is not JSON-serialisable (never pickled)
    │   └── MissingExtra          an optional dependency is missing (also an ImportError)
    └── StoreError                the database is corrupt, foreign or of a newer schema
        └── SchemaVersionError    the database was written by a newer mainspring
    Cancelled (BaseException)     the run was cancelled
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "ApprovalRejected",
    "BudgetExceeded",
    "Cancelled",
    "ChildCancelled",
    "ChildFailed",
    "ConfigError",
    "ContextOverflow",
    "InvalidAnswer",
    "LeaseLost",
    "LoopDetected",
    "MainspringError",
    "MissingExtra",
    "ModelOutputError",
    "NondeterminismError",
    "Overloaded",
    "PermissionDenied",
    "QuotaExhausted",
    "RateLimited",
    "RequestNotFound",
    "ReservedSignal",
    "RunConflict",
    "RunFailed",
    "RunNotFound",
    "RunWaiting",
    "ScheduleNotFound",
    "SchemaVersionError",
    "SerializationError",
    "ShadowStubMissing",
    "StepFailed",
    "StepInterrupted",
    "StepTimeout",
    "StoreError",
    "StoreUnavailable",
    "ToolInputError",
    "ToolNotAllowed",
    "TransientError",
    "UnknownTool",
    "UnknownWorkflow",
    "ValidationFailed",
    "WaitTimeout",
]


class MainspringError(Exception):
    """Base of every error mainspring raises (but :class:`Cancelled`).

    Attributes:
        retryable: whether the same call may succeed if tried again later.
        run_id: the run the error happened in, when known.
        step: ``"session:seq name"`` of the step, when known.
    """

    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, run_id: str | None = None, step: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.run_id = run_id
        self.step = step

    def __reduce__(self) -> tuple[Any, ...]:
        return _revive, (type(self), self.args, self.__dict__)

    def __str__(self) -> str:
        where = []
        if self.run_id:
            where.append(f"run {self.run_id}")
        if self.step:
            where.append(f"step {self.step}")
        return f"{self.message} ({', '.join(where)})" if where else self.message


class TransientError(MainspringError):
    """A failure that may pass: network, timeout, 5xx, overload. Retry with back-off."""

    retryable = True

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        run_id: str | None = None,
        step: str | None = None,
    ) -> None:
        super().__init__(message, run_id=run_id, step=step)
        self.retry_after = retry_after


class RateLimited(TransientError):
    """The provider refused for rate. Wait at least ``retry_after`` seconds.

    Attributes:
        headers: the refusal's rate-limit headers (``retry-after``, ``x-ratelimit-*``,
            ``anthropic-ratelimit-*``), names lower-cased; the rate limiter tightens
            from them.
    """

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        headers: dict[str, str] | None = None,
        run_id: str | None = None,
        step: str | None = None,
    ) -> None:
        super().__init__(message, retry_after=retry_after, run_id=run_id, step=step)
        self.headers: dict[str, str] = dict(headers or {})


class Overloaded(TransientError):
    """The provider is overloaded (Anthropic's 529, OpenAI's 503 "overloaded"): back
    pressure, like a 429, but not about this account's limits. Model calls wait
    (``retry_after`` when the provider says, else a growing back-off) and never spend
    a step's attempts on it."""


class StepTimeout(TransientError):
    """One attempt of a step ran past its timeout. Retried by the step's policy."""


class StoreUnavailable(TransientError):
    """The database is locked past its busy timeout, or unreachable. Retry later."""


class ToolInputError(MainspringError):
    """A tool's arguments do not match its schema; the message says how to fix them."""


class ModelOutputError(MainspringError):
    """A model's output cannot be parsed into actions; the model is asked to repair it."""


class ContextOverflow(MainspringError):
    """The request is longer than the model's context. Compact, then retry once."""


class PermissionDenied(MainspringError):
    """Authentication or permission was refused. A human must fix credentials."""


class ReservedSignal(PermissionDenied):
    """A raw signal named for a request to a human (``approval:…``, ``question:…``,
    ``budget:…``, ``checkpoint:…``, ``resume``). Only the answer path
    (:meth:`App.answer`, the HTTP answer endpoint with the ``approve`` scope,
    ``mainspring approve``) satisfies a request: it checks the request exists and
    records who decided."""


class QuotaExhausted(MainspringError):
    """The account has no quota left. A human must raise it or wait for the period."""


class UnknownTool(MainspringError):
    """The model called a tool that does not exist: a configuration error, stop at once."""


class ToolNotAllowed(MainspringError):
    """The tool exists but is not on this agent's allowlist: stop at once."""


class BudgetExceeded(MainspringError):
    """A budget of steps, tokens, cost or wall time ran out."""


class LoopDetected(MainspringError):
    """The agent repeats the same action, error or alternation."""


class StepInterrupted(MainspringError):
    """An ``at_most_once`` step started and its end was never journaled.

    It may or may not have taken effect. It is not re-run: the workflow decides
    (ask a human, fail, or compensate) by catching this error.
    """


class StepFailed(MainspringError):
    """A journaled step failed for good (retries exhausted or not retryable).

    Workflow code sees this same error on the first execution and on every replay,
    so ``except StepFailed`` behaves identically whether or not the run recovered.
    The original exception is ``__cause__`` on the first execution only.

    Attributes:
        error_type: qualified name of the original exception class.
        attempts: how many attempts were made.
    """

    def __init__(
        self,
        message: str,
        *,
        error_type: str,
        attempts: int,
        run_id: str | None = None,
        step: str | None = None,
    ) -> None:
        super().__init__(message, run_id=run_id, step=step)
        self.error_type = error_type
        self.attempts = attempts


class WaitTimeout(MainspringError):
    """``ctx.wait_for`` reached its timeout and no default was given."""


class NondeterminismError(MainspringError):
    """Replay met a step other than the one journaled at that position (or a patch
    version the code no longer supports).

    The workflow's code changed the order or names of its steps while runs were in
    flight. A worker that meets it never fails the run: it leaves the run for a worker
    whose code can replay it (a rolling deploy runs old and new code side by side),
    and a run that no worker can replay for long waits where an operator sees it
    (``wait_reason`` ``replay``). Deploy code that matches the journal, patch the
    change (``ctx.patched``), or version the workflow.

    Attributes:
        position: the journal position (``seq``) where replay stopped, when known.
        expected: ``(kind, name)`` of what the journal holds there (``None`` when the
            error is about a patch's version).
        got: ``(kind, name)`` of what the code asked for there.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        step: str | None = None,
        position: int | None = None,
        expected: tuple[str, str] | None = None,
        got: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(message, run_id=run_id, step=step)
        self.position = position
        self.expected = expected
        self.got = got


class LeaseLost(MainspringError):
    """Another worker claimed the run (its epoch moved on). This worker must stop acting."""

    retryable = False


class ShadowStubMissing(MainspringError):
    """A shadow (:meth:`App.shadow <mainspring.App.shadow>`) met a call with an effect
    that it can answer neither from the recorded run's journal nor from a stub: the
    model sees this error as the tool's result, and the real tool never runs. Give a
    stub (``stubs={"refund": fn}``) to answer such calls."""


class ValidationFailed(MainspringError):
    """An output failed its schema or business-rule validators."""


class RunNotFound(MainspringError):
    """No run has that id."""


class ScheduleNotFound(MainspringError):
    """No schedule has that name."""


class RunConflict(MainspringError):
    """The run's state does not allow the request (a signal to a finished run, say)."""


class RequestNotFound(MainspringError):
    """The run has no pending request to a human by that id."""


class InvalidAnswer(MainspringError):
    """An answer to a human request is malformed: an unknown decision, a choice
    that was not offered, edited arguments that are not an object."""


class ApprovalRejected(MainspringError):
    """A reviewer rejected a stage gate; the message carries their reason."""


class RunFailed(MainspringError):
    """The awaited run ended ``failed`` or ``cancelled``.

    Attributes:
        status: the run's final status.
        error: the journaled error as a JSON object (``type``, ``message``).
    """

    def __init__(self, message: str, *, status: str, error: Any, run_id: str | None = None):
        super().__init__(message, run_id=run_id)
        self.status = status
        self.error = error


class ChildFailed(MainspringError):
    """A child run started with ``ctx.child`` / ``ctx.start_child`` ended ``failed``
    (or ``cancelled``: :class:`ChildCancelled`). Raised in the parent, identically on
    every replay; catch it to recover in the parent (``except ChildFailed``).

    Attributes:
        child_id: the child run's id.
        status: the child's final status.
        error: the child's journaled error as a JSON object (``type``, ``message``).
    """

    def __init__(
        self,
        message: str,
        *,
        child_id: str,
        status: str,
        error: Any,
        run_id: str | None = None,
        step: str | None = None,
    ) -> None:
        super().__init__(message, run_id=run_id, step=step)
        self.child_id = child_id
        self.status = status
        self.error = error


class ChildCancelled(ChildFailed):
    """The child run was cancelled (by itself, by an operator, or by its parent's
    cancel cascading down)."""


class RunWaiting(MainspringError):
    """``app.run``'s run is waiting durably for a person or a signal; it is not lost.

    The message says what it waits for and how to answer. Once answered, any worker
    (``mainspring worker``, ``await app.worker().run()``) or ``app.run`` with the same
    ``key`` finishes it, and ``await app.result(run_id)`` returns its result.

    Attributes:
        wait_reason: what the run waits for (``"signal:approval:purge-1"``).
        requests: the ids of its pending requests to humans (``"approval:purge-1"``).
    """

    def __init__(
        self, message: str, *, run_id: str, wait_reason: str | None, requests: tuple[str, ...]
    ) -> None:
        super().__init__(message, run_id=run_id)
        self.wait_reason = wait_reason
        self.requests = requests


class ConfigError(MainspringError):
    """A mistake in code or configuration. Fix it; retrying cannot help."""


class UnknownWorkflow(ConfigError):
    """No workflow is registered under that name in this App."""


class SerializationError(ConfigError):
    """A payload cannot be encoded as JSON. mainspring never pickles."""


class MissingExtra(ConfigError, ImportError):
    """An optional dependency is not installed; the message names the ``pip install``.

    Also an ``ImportError``, so ``except ImportError`` around an optional feature works.
    The CLI prints it as one line.
    """

    def __init__(self, feature: str, extra: str, missing: str | None = None) -> None:
        what = f" ({missing} is missing)" if missing else ""
        super().__init__(
            f"{feature} needs the {extra} extra{what}: pip install 'mainspring[{extra}]'"
        )
        self.extra = extra
        self.name = missing  # ImportError's attribute: the module that is not there

    def __reduce__(self) -> tuple[Any, ...]:
        # ``name`` is ImportError's own slot, not in ``__dict__``.
        return _revive, (type(self), self.args, {**self.__dict__, "name": self.name})


class StoreError(MainspringError):
    """The database cannot be used: corrupt, not a mainspring database, or similar."""


class SchemaVersionError(StoreError):
    """The database's schema is newer than this version of mainspring knows."""


class Cancelled(BaseException):
    """The run was cancelled. A ``BaseException`` so user code cannot swallow it."""

    def __init__(self, run_id: str | None = None, reason: str | None = None) -> None:
        super().__init__(f"run {run_id} was cancelled" + (f": {reason}" if reason else ""))
        self.run_id = run_id
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return _revive, (type(self), self.args, self.__dict__)


def _revive(
    cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]
) -> BaseException:
    """An error back from a pickle (a process pool, a multiprocessing queue, pytest-xdist)
    as it was: its attributes set again without calling ``__init__``, whose keyword-only
    arguments pickle's default (``cls(*args)``) does not pass, and which would build
    the message a second time."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    for name, value in state.items():
        setattr(exc, name, value)
    return exc
