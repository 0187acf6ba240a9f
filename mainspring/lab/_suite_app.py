"""The App that ``mainspring lab suite`` runs in worker processes (and then kills).

Configured by the environment the suite gives its workers: ``MAINSPRING_DATABASE_URL``
(the store), ``MAINSPRING_SUITE_WORLD`` (the world's SQLite file, which also holds the
cell's seed and fault rates), ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (the cell's
:class:`~mainspring.lab.SuiteModelServer`), ``MAINSPRING_SUITE_CLIENT_TIMEOUT_S`` (the
provider's client timeout), ``MAINSPRING_SUITE_MAX_STEPS``,
``MAINSPRING_SUITE_MODEL_ATTEMPTS`` (the model retry policy's attempts; mainspring's
default when unset) and ``MAINSPRING_SUITE_KILL_BEFORE_COMMIT``.

The agents use mainspring's :class:`~mainspring.models.OpenAIModel` (the official
``openai`` SDK) with mainspring's defaults. The suite's kill points are two thin
wrappers: :class:`_KillAfterReply` around the model (``"model"``: after a reply
arrived, before the loop uses or journals it) and :class:`_KillingStore` around the
store (``"commit"``: right after a commit returns, and right before it when asked).
The world's tools do the ``"tool"`` point themselves.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from typing import Any

from .. import App, Limits, RetryPolicy, Tool, ToolContext, models, tool
from ..models import Message, Model, ModelResponse, ModelSettings, ToolSpec, UserMessage
from ..storage import Store, open_store
from ..testing import FaultyStore
from ._suite_faults import Phase, _watch_harness
from ._tasks import TASKS, SuiteWorld

__all__ = ["build_app", "world"]

_LABEL = re.compile(r"\bbatch (\w+)")
_world_at = functools.cache(SuiteWorld)  # one handle per file in this process


def world() -> SuiteWorld:
    """This process's handle on the world file of ``MAINSPRING_SUITE_WORLD``."""
    return _world_at(os.environ["MAINSPRING_SUITE_WORLD"])


def _label(messages: Sequence[Message]) -> str:
    for message in messages:
        if not isinstance(message, UserMessage):
            continue
        found = _LABEL.search(message.content)
        if found:
            return found.group(1)
    raise ValueError("the task text names no batch")


class _KillAfterReply(Model):
    """The ``"model"`` kill point around mainspring's :class:`OpenAIModel`: after the
    reply arrived (paid for), before the agent loop uses or journals it.

    The OpenAIModel (and the ``openai`` SDK) is made on first use, so the harness, which
    only submits runs, needs neither."""

    provider = "openai"

    def __init__(self, model_id: str, *, timeout_s: float) -> None:
        self.model_id, self.name, self.timeout_s = model_id, f"openai:{model_id}", timeout_s
        self._inner: Model | None = None

    @property
    def inner(self) -> Model:
        if self._inner is None:
            # Its base URL and key: OPENAI_BASE_URL and OPENAI_API_KEY, the cell's server.
            self._inner = models.OpenAIModel(self.model_id, timeout_s=self.timeout_s)
        return self._inner

    async def request(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        settings: ModelSettings | None = None,
    ) -> ModelResponse:
        reply = await self.inner.request(messages, tools=tools, settings=settings)
        world().faults.kill_point(_label(messages), "model")
        return reply

    async def warm(self) -> None:
        await self.inner.warm()

    async def aclose(self) -> None:
        if self._inner is not None:
            await self._inner.aclose()


class _KillingStore(FaultyStore):
    """The ``"commit"`` kill point: every store call goes through :meth:`_call` (as in
    :class:`~mainspring.testing.FaultyStore`, unrecorded here: a worker lives long);
    a commit that wrote a bound run's rows may be followed by a SIGKILL before the
    worker hears back (and, with ``before``, preceded by one)."""

    def __init__(self, inner: Store, *, before: bool = False) -> None:
        super().__init__(inner)
        self.before = before
        self._labels: dict[str, str | None] = {}

    def _label_of(self, run_id: str) -> str | None:
        if run_id not in self._labels:
            try:
                self._labels[run_id] = world().label_for(run_id)
            except KeyError:  # a run the suite did not bind: no kill points
                self._labels[run_id] = None
        return self._labels[run_id]

    def _points(self, batch: Sequence[Any], phase: Phase) -> None:
        for write in batch:
            label = self._label_of(write.run_id)
            if label is not None:
                world().faults.kill_point(label, phase)

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if method != "commit":
            return getattr(self.inner, method)(*args, **kwargs)
        batch = list(kwargs.get("batch", args[0] if args else []))
        if self.before:
            self._points(batch, "commit")
        results = self.inner.commit(*args, **kwargs)
        self._points([w for w, r in zip(batch, results, strict=False) if r.ok], "commit")
        return results


def _call(ctx: ToolContext, tool: str, **arguments: int | str) -> dict[str, Any]:
    w = world()
    return w.call(w.label_for(ctx.run_id), tool, arguments, ctx.idempotency_key)


@tool
def progress(*, ctx: ToolContext) -> dict[str, Any]:
    """What is left to do: the next action and its item."""
    return _call(ctx, "progress")


@tool
def validate(record: int, *, ctx: ToolContext) -> dict[str, Any]:
    """Validate one record."""
    return _call(ctx, "validate", record=record)


@tool(effect="write")
def write(record: int, *, ctx: ToolContext) -> dict[str, Any]:
    """Write one validated record to the new store."""
    return _call(ctx, "write", record=record)


@tool(effect="write", requires_approval=True)
def checkpoint(upto: int, *, ctx: ToolContext) -> dict[str, Any]:
    """Ask a reviewer to approve the writes so far."""
    return _call(ctx, "checkpoint", upto=upto)


@tool
def open_ticket(ticket: int, *, ctx: ToolContext) -> dict[str, Any]:
    """Open a ticket and read it."""
    return _call(ctx, "open_ticket", ticket=ticket)


@tool(effect="irreversible")
def refund(ticket: int, *, ctx: ToolContext) -> dict[str, Any]:
    """Refund a ticket (irreversible)."""
    return _call(ctx, "refund", ticket=ticket)


@tool(effect="write")
def close_ticket(ticket: int, *, ctx: ToolContext) -> dict[str, Any]:
    """Close a ticket."""
    return _call(ctx, "close_ticket", ticket=ticket)


@tool
def compare(first: int, last: int, *, ctx: ToolContext) -> dict[str, Any]:
    """Compare entries first..last (inclusive) of ledgers A and B."""
    return _call(ctx, "compare", first=first, last=last)


@tool(effect="write")
def post(entry: int, amount: int, *, ctx: ToolContext) -> dict[str, Any]:
    """Post an adjusting entry of amount cents to entry of ledger B."""
    return _call(ctx, "post", entry=entry, amount=amount)


@tool
def search(fact: int, *, ctx: ToolContext) -> dict[str, Any]:
    """Search for a fact; returns its source."""
    return _call(ctx, "search", fact=fact)


@tool
def read(source: int, *, ctx: ToolContext) -> dict[str, Any]:
    """Read a source; returns its fact."""
    return _call(ctx, "read", source=source)


@tool(effect="write")
def handoff(notes: str, *, ctx: ToolContext) -> dict[str, Any]:
    """End the session: store its notes for the next one."""
    return _call(ctx, "handoff", notes=notes)


@tool
def resume(session: int, *, ctx: ToolContext) -> dict[str, Any]:
    """Start a session from the notes so far."""
    return _call(ctx, "resume", session=session)


@tool(effect="write")
def report(facts: str, *, ctx: ToolContext) -> dict[str, Any]:
    """Report every fact gathered (the final answer)."""
    return _call(ctx, "report", facts=facts)


# Each task's agent and the tools it may call (its world answers them).
_TASK_TOOLS: dict[str, list[Tool[Any, Any]]] = {
    "migrate": [progress, validate, write, checkpoint],
    "support": [progress, open_ticket, refund, close_ticket],
    "reconcile": [progress, compare, post],
    "research": [progress, search, read, handoff, resume, report],
}


def build_app(url: str | None = None, *, kill_points: bool | None = None) -> App:
    """The suite's App over ``url`` (``MAINSPRING_DATABASE_URL`` when None): the tasks'
    agents on mainspring's defaults but for a step budget sized to the task.

    Args:
        kill_points: wrap the store with the ``"commit"`` kill point (``None``: in a
            suite worker, where ``MAINSPRING_SUITE_WORLD`` is set). Never in the harness.
    """
    suite = App(
        _suite_store(url, kill_points), max_recoveries=1000, poll_interval_s=0.05, lease_s=2.0
    )
    max_steps = int(os.environ.get("MAINSPRING_SUITE_MAX_STEPS", "100"))
    attempts = os.environ.get("MAINSPRING_SUITE_MODEL_ATTEMPTS")
    retry = RetryPolicy(max_attempts=int(attempts)) if attempts else None
    timeout = float(os.environ.get("MAINSPRING_SUITE_CLIENT_TIMEOUT_S", "60"))
    for name, spec in TASKS.items():
        model = _KillAfterReply(f"horizon-{name}", timeout_s=timeout)
        suite.agent(
            name,
            model=model,
            instructions=spec.instructions,
            tools=_TASK_TOOLS[name],
            limits=Limits(max_steps=max_steps),
            model_retry=retry,
        )
    return suite


def _suite_store(url: str | None, kill_points: bool | None) -> str | Store | None:
    """What the suite's App opens: ``url``, or (with kill points) the store it names
    wrapped with the ``"commit"`` kill point."""
    if kill_points is None:
        kill_points = "MAINSPRING_SUITE_WORLD" in os.environ
    if not kill_points:
        return url
    _watch_harness()  # a worker of a harness that is gone exits
    before = os.environ.get("MAINSPRING_SUITE_KILL_BEFORE_COMMIT") == "1"
    return _KillingStore(open_store(url or os.environ["MAINSPRING_DATABASE_URL"]), before=before)


_built: list[App] = []


def __getattr__(name: str) -> Any:
    # ``app``, built on first use: in a suite worker (``mainspring worker
    # mainspring.lab._suite_app:app``), not in every process that imports mainspring.lab
    # (a peer's runner has the suite's environment but no store).
    if name == "app":
        if not _built:
            _built.append(build_app())
        return _built[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
