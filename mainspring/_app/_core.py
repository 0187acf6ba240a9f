"""``App``: the registry of workflows over one store, and the way to start runs.

The App is its core verbs (defining workflows, tools and agents; submitting and running
runs; looking at and steering them) over a :class:`~._runtime.Runtime` built once here,
and a handful of parts over that same runtime. Some parts are namespaces users reach as
attributes (``app.admin``, ``app.observe``, ``app.queues``, ``app.schedules``,
``app.mcp``); the others (agents, children, lineage, streams) lend the App a few core
verbs (:class:`~._runtime.Via`). The methods that moved into a namespace stay one
release under their old names, warning (:class:`~._runtime.Moved`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from typing import Any, Concatenate, Generic, Literal, ParamSpec, TypeVar, overload

from typing_extensions import TypeVar as DefaultTypeVar

from .._clock import Clock, SystemClock
from .._errors import (
    ConfigError,
    ReservedSignal,
    RunConflict,
    RunFailed,
    RunNotFound,
)
from .._keys import check_client_key
from .._serde import dumps, loads
from .._signals import is_request_signal
from ..agent import Agent, AgentWorkflow, split_tools
from ..hitl import Decision, Request, answer_payload
from ..journal import Committer, Engine, RetryPolicy, RunContext, StepInterceptor, Workflow
from ..limits import RateLimit, RateLimits
from ..models import without_endpoint
from ..observability import Redactor, Telemetry, parse_traceparent
from ..storage import RunRecord, Store, redact_url
from ..tools import Effect, MCPToolset, Tool, ToolRegistry, Toolset, Validator
from ..tools import tool as make_tool
from ..worker import Worker
from ._admin import Admin
from ._agents import Agents, agent_options
from ._children import Children
from ._handle import RunHandle, run_id_of
from ._lineage import Lineage, local_user, new_id
from ._mcp import MCPServers
from ._observe import Observe
from ._queues import Queue, Queues
from ._replay_check import ReplayReport, replay_check
from ._runtime import DEFAULT_URL, Moved, Runtime, Via, deprecated, rate_limits_of
from ._schedules import Schedules
from ._shadow_app import app_shadow
from ._streams import Streams
from ._versions import check_version
from ._waiting import raise_if_refused, waiting

__all__ = ["DEFAULT_URL", "App", "RunHandle"]

log = logging.getLogger("mainspring")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

OutputT = DefaultTypeVar("OutputT", default=Any)

_DEFAULT_REDACTOR = Redactor()
# What a deprecated alias of the engine's plumbing says instead of a new spelling.
_PLUMBING = "the engine starts child runs itself (ctx.child); no App method is needed"


class Shared(Generic[T]):
    """An attribute of the App that is its runtime's (``app.clock`` is
    ``app._runtime.clock``), read and set there so that every part sees the same."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Shared[T]: ...

    @overload
    def __get__(self, obj: App, owner: type | None = None) -> T: ...

    def __get__(self, obj: App | None, owner: type | None = None) -> T | Shared[T]:
        if obj is None:
            return self
        value: T = getattr(obj._runtime, self._name)
        return value

    def __set__(self, obj: App, value: T) -> None:
        setattr(obj._runtime, self._name, value)


class App:
    """Workflows registered over one store.

    Args:
        url: ``sqlite:///path.db`` (the default is ``sqlite:///mainspring.db``; the
            ``MAINSPRING_DATABASE_URL`` environment variable overrides it when no
            URL is given), or a :class:`Store`.
        clock: time source (a :class:`FakeClock` in tests).
        rng: randomness for ``ctx.uuid()``, ``ctx.random()`` and back-off jitter.
        lease_s: how long a claim lasts without a heartbeat.
        heartbeat_s: how often workers extend their leases (default ``lease_s / 3``).
        max_recoveries: a run recovered this many times in a row without progress
            is moved to ``failed`` (dead-lettered). From its second such recovery a
            run is executed alone on its worker until it progresses, so that a run
            whose step kills workers is charged for its own crashes only.
        inline_wait_s: waits up to this long (sleeps, back-offs) keep the worker;
            longer ones release it and the run sleeps in the store.
        default_retry: the retry policy of ``at_least_once`` steps.
        poll_interval_s: how often idle workers look for runnable runs.
        redact: what to hide from the journal (and so from traces and exports):
            common API-key shapes, bearer tokens and ``password=...`` by default;
            ``Redactor(patterns=[...])`` adds patterns, ``None`` turns it off.
        rate_limits: rate limiting shared by every worker of the store, on by
            default: every remote model learns its provider's limits from the
            response headers and paces its calls to them (``True``). Declare limits
            with a list of :class:`~mainspring.limits.RateLimit`, a
            :class:`~mainspring.limits.RateLimits`, or the path of a TOML/JSON file
            (see ``docs/rate-limits.md``); models without a declared limit still learn
            theirs. ``False`` (or ``None``) turns rate limiting off: refusals (429)
            are then only waited out.
        interceptors: :class:`~mainspring.journal.StepInterceptor` s wrapped around
            every executed step attempt, the first outermost (tracing, fault
            injection: the reliability lab's ``mainspring lab run`` is one).
        version: this code's version (``"2026.12.1"``, a git tag...), stamped on every
            run it submits (:attr:`RunRecord.version`, ``mainspring runs --version``).
            Its workers claim runs of this version and runs with no version by
            default (``app.worker(versions=...)`` chooses; docs/workflows.md,
            "Changing code under running runs"). ``None`` (default): runs carry no
            version and this App's workers claim runs of every version.
    """

    def __init__(
        self,
        url: str | Store | None = None,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        lease_s: float = 15.0,
        heartbeat_s: float | None = None,
        max_recoveries: int = 5,
        inline_wait_s: float = 1.0,
        default_retry: RetryPolicy | None = None,
        poll_interval_s: float = 0.1,
        redact: Redactor | None = _DEFAULT_REDACTOR,
        rate_limits: Sequence[RateLimit] | RateLimits | str | os.PathLike[str] | bool | None = True,
        interceptors: Sequence[StepInterceptor] = (),
        version: str | None = None,
    ) -> None:
        if lease_s <= 0:
            raise ConfigError(f"lease_s must be > 0, got {lease_s!r}")
        heartbeat = float(heartbeat_s) if heartbeat_s is not None else float(lease_s) / 3
        if heartbeat >= lease_s:
            raise ConfigError(
                f"heartbeat_s={heartbeat!r} must be shorter than lease_s={float(lease_s)!r}"
            )
        self._runtime = runtime = Runtime(
            database=url,
            clock=clock or SystemClock(),
            rng=rng or random.Random(),
            lease_s=float(lease_s),
            heartbeat_s=heartbeat,
            max_recoveries=max_recoveries,
            inline_wait_s=inline_wait_s,
            default_retry=default_retry or RetryPolicy(),
            poll_interval_s=poll_interval_s,
            redactor=redact,
            rate_limits=rate_limits_of(rate_limits),
            interceptors=tuple(interceptors),
            version=check_version(version),
        )
        self._admin = Admin(runtime)
        self._children = Children(runtime)
        self._lineage = Lineage(runtime, lambda run_id, created: RunHandle(self, run_id, created))
        self._mcp = MCPServers()
        self._agents = Agents(runtime)
        self._observe = Observe(runtime, self._children.children)
        self._queues = Queues(runtime)
        self._schedules = Schedules(runtime, self._queues)
        self._streams = Streams(runtime)

    # -- the runtime, as attributes ------------------------------------------------------

    clock = Shared[Clock]()
    rng = Shared[random.Random]()
    lease_s = Shared[float]()
    heartbeat_s = Shared[float]()
    max_recoveries = Shared[int]()
    inline_wait_s = Shared[float]()
    default_retry = Shared[RetryPolicy]()
    poll_interval_s = Shared[float]()
    redactor = Shared[Redactor | None]()
    rate_limits = Shared[RateLimits | None]()
    interceptors = Shared[tuple[StepInterceptor, ...]]()
    version = Shared[str | None]()
    telemetry = Shared[Telemetry]()
    workflows = Shared[dict[str, Workflow[Any, Any]]]()
    tools = Shared[ToolRegistry]()
    agents = Shared[dict[str, Agent]]()

    @property
    def url(self) -> str:
        """The database URL (resolved from the environment if none was given)."""
        return self._runtime.url

    @property
    def store(self) -> Store:
        """The store, opened (and migrated) on first use."""
        return self._runtime.store

    def close(self) -> None:
        self._runtime.close()

    # -- registration --------------------------------------------------------------

    @overload
    def workflow(
        self, fn: Callable[Concatenate[RunContext, P], Awaitable[R]], /
    ) -> Workflow[P, R]: ...

    @overload
    def workflow(
        self, *, name: str | None = None
    ) -> Callable[[Callable[Concatenate[RunContext, P], Awaitable[R]]], Workflow[P, R]]: ...

    def workflow(self, fn: Any = None, /, *, name: str | None = None) -> Any:  # type: ignore[misc]
        """Register an ``async def f(ctx: RunContext, ...)`` as a durable workflow.

        Use as ``@app.workflow`` or ``@app.workflow(name="...")``. The name (the
        function's name by default) is what the journal records: keep it stable
        while runs are in flight.
        """

        def register(f: Callable[..., Awaitable[Any]]) -> Workflow[Any, Any]:
            return self._runtime.register(f, name)

        return register(fn) if fn is not None else register

    @overload
    def tool(self, fn: Callable[P, R], /) -> Tool[P, R]: ...

    @overload
    def tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        effect: Effect = "read",
        timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
        requires_approval: bool | None = None,
        validators: Sequence[Validator] = (),
        max_result_chars: int = 4000,
    ) -> Callable[[Callable[P, R]], Tool[P, R]]: ...

    def tool(self, fn: Any = None, /, **options: Any) -> Any:  # type: ignore[misc]
        """Register a tool for this App's agents (see :func:`mainspring.tools.tool`).

        ``effect`` is ``"read"``, ``"write"`` or ``"irreversible"``; a keyword-only
        ``ctx: ToolContext`` parameter receives the call's idempotency key.
        """

        def register(f: Callable[..., Any]) -> Tool[Any, Any]:
            made: Tool[Any, Any] = make_tool(f, **options)
            self.tools.add(made)
            return made

        return register(fn) if fn is not None else register

    @agent_options(Agent)
    def agent(self, *args: Any, **options: Any) -> AgentWorkflow[Any]:
        """Define an agent and register it: ``app.agent("triage", model=...,
        instructions=..., tools=[...])`` is ``app.add(ms.Agent("triage", model=..., ...))``
        and takes the same arguments (see :class:`~mainspring.Agent`). Returns the
        workflow that runs it: ``app.submit(triage, "Answer ticket 7")``.

        Raises:
            ConfigError: a bad option (the message names it), or another workflow has
                the name.
        """
        return self.add(Agent(*args, **options))

    def add(self, agent: Agent[OutputT]) -> AgentWorkflow[OutputT]:
        return self._agents.add(agent)

    add.__doc__ = Agents.add.__doc__

    # A part's method that is a core verb is the App's with one line (Via).
    call_model = Via("_agents", Agents.call_model)

    def get_workflow(self, workflow: Workflow[Any, Any] | str) -> Workflow[Any, Any]:
        return self._runtime.get_workflow(workflow)

    # -- starting runs ---------------------------------------------------------------

    def submit(
        self,
        workflow: Workflow[Any, Any] | str,
        /,
        *args: Any,
        key: str | None = None,
        queue: Queue | str | None = None,
        queue_key: str | None = None,
        priority: int = 0,
        **kwargs: Any,
    ) -> RunHandle:
        """Enqueue a run for the workers and return at once.

        A ``key`` makes submission idempotent: the same key returns the same run.

        Args:
            queue: a queue declared with ``app.queues.add`` (or its name): the run starts
                only within the queue's limits.
            queue_key: the run's key within its queue, for its ``per_key`` limit
                (a customer, a tenant).
            priority: runs of a queue start by priority, higher first, then in
                submission order.
        """
        name = queue.name if isinstance(queue, Queue) else queue
        return self.enqueue(
            workflow,
            args,
            kwargs,
            key=key,
            queue=name,
            queue_key=queue_key,
            priority=priority,
        )

    def enqueue(
        self,
        workflow: Workflow[Any, Any] | str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        key: str | None = None,
        traceparent: str | None = None,
        queue: str | None = None,
        queue_key: str | None = None,
        priority: int = 0,
    ) -> RunHandle:
        """:meth:`submit` with the arguments as values (any keyword names, ``key``
        included): what the HTTP API calls. ``traceparent``: the caller's W3C trace
        context; the run's spans join that trace (a malformed one is ignored).
        ``queue`` / ``queue_key`` / ``priority``: as :meth:`submit`'s.

        Raises:
            UnknownWorkflow: no workflow of that name.
            ConfigError: the arguments do not fit the workflow's signature or types, or
                ``key`` starts with a prefix reserved for the keys mainspring derives
                (``schedule:``, ``child:``).
            RunConflict: ``key`` names a run of other input.
        """
        check_client_key(key)
        wf = self.get_workflow(workflow)
        encoded = self._redact(wf.encode_input(tuple(args), dict(kwargs or {})))
        queued = self._queues._fields(queue, queue_key, priority)
        record, created = self.store.create_run(
            **queued,
            run_id=new_id(),
            workflow=wf.name,
            input=encoded,
            key=key,
            now=self.clock.now(),
            version=self.version,
            # Kept only when valid, so every span exporter can trust what it reads back.
            traceparent=traceparent.strip()
            if traceparent and parse_traceparent(traceparent)
            else None,
        )
        if not created and loads(record.input) != loads(encoded):
            # Not the other run's input: the caller may not be allowed to read it.
            raise RunConflict(
                f"key {key!r} already names a run of {wf.name!r} with other input; "
                "use a new key for new input",
                run_id=record.id,
            )
        return RunHandle(self, record.id, created)

    async def run(
        self,
        workflow: Workflow[P, R] | str,
        *args: Any,
        key: str | None = None,
        on_wait: Literal["raise", "wait"] = "raise",
        **kwargs: Any,
    ) -> R:
        """Execute a run durably in this process and return its result.

        The run is journaled like any other: if this process dies, ``app.run`` with
        the same ``key`` (or any worker) resumes it at the step where it stopped.
        Sleeps (timers, back-offs, rate-limit slots) happen here too.

        A wait for a person or a signal (an approval, a question, a budget pause, a
        missing API key, ``ctx.wait_for``) is answered from elsewhere, so by default
        ``app.run`` does not sit on it: it raises :class:`RunWaiting`, whose message
        says what the run waits for and how to answer it. The run stays waiting in the
        store; once answered, ``app.run`` with the same ``key``, or any worker,
        finishes it. With ``on_wait="wait"`` it keeps waiting for the answer instead
        (from another process, a task of this one, the dashboard), logging at WARNING
        what the run waits for and how to answer each time it starts a new wait.

        Raises:
            RunFailed: the run ended failed or cancelled.
            RunWaiting: the run waits for a person or a signal (``on_wait="raise"``).
        """
        if on_wait not in ("raise", "wait"):
            raise ConfigError(f"on_wait must be 'raise' or 'wait', got {on_wait!r}")
        handle = self.submit(workflow, *args, key=key, **kwargs)
        worker = Worker(
            self,
            concurrency=1,
            batch=False,
            _run_id=handle.run_id,
            _return_on_wait=on_wait == "raise",
        )
        if on_wait == "raise":
            await worker.run()
            raise_if_refused(worker, handle.run_id)
            record = self.get_run(handle.run_id)
            if record.status == "waiting":
                raise waiting(self.store, record)
        else:
            await self._run_telling_waits(worker, handle.run_id)
            raise_if_refused(worker, handle.run_id)
        value: R = await self.result(handle.run_id)
        return value

    async def _run_telling_waits(self, worker: Worker, run_id: str) -> None:
        task = asyncio.create_task(worker.run())
        told: tuple[str | None, float | None] | None = None
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=max(self.poll_interval_s, 0.2))
                record = self.get_run(run_id)
                if record.status == "waiting" and told != (record.wait_reason, record.wake_at):
                    told = (record.wait_reason, record.wake_at)
                    log.warning(
                        "%s; app.run(on_wait='wait') waits for it", waiting(self.store, record)
                    )
        finally:
            if not task.done():
                worker.request_stop()
            await task

    def worker(self, **options: Any) -> Worker:
        """A :class:`Worker` for this App (see its arguments)."""
        return Worker(self, **options)

    def engine(self, committer: Committer, threads: Executor) -> Engine:
        """The step engine a :class:`Worker` of this App executes runs with (the
        App is its :class:`~mainspring.worker.WorkerHost`): this App's store, clock,
        randomness, retry policy, redaction and step interceptors."""
        engine = Engine(
            store=self.store,
            clock=self.clock,
            rng=self.rng,
            committer=committer,
            threads=threads,
            default_retry=self.default_retry,
            inline_wait_s=self.inline_wait_s,
            redact=self.redactor.redact_json if self.redactor is not None else None,
            live_redaction=self.redactor.live if self.redactor is not None else None,
            # telemetry outermost: it times the attempt as the step's policy sees it
            interceptors=(self.telemetry, *self.interceptors),
            children=self._children,
            canonical_step_name=without_endpoint,
        )
        committer.observers.append(self.telemetry.committed)
        self._observe._trace_from_environment()
        return engine

    # -- looking and steering ----------------------------------------------------------

    def resolve_run_id(self, prefix: str) -> str:
        """The id of the one run whose id is or starts with ``prefix`` (as git takes an
        abbreviated commit).

        Raises:
            RunNotFound: no run id starts with it.
            ConfigError: several do (the message names them).
        """
        text = prefix.strip()
        if not text:
            raise ConfigError("a run id (or a prefix of one) is needed, got ''")
        if self.store.get_run(text) is not None:
            return text
        found = self.store.run_ids_starting(text, limit=3)
        if not found:
            raise RunNotFound(
                f"no run {text!r} in {redact_url(self.url)!r} (nor one whose id starts with it)"
            )
        if len(found) > 1:
            more = ", ..." if len(found) > 2 else ""
            raise ConfigError(
                f"{text!r} is the start of several run ids ({', '.join(found[:2])}{more}): "
                "give more of it"
            )
        return found[0]

    def get_run(self, run_id: str | RunHandle) -> RunRecord:
        return self._runtime.get_run(run_id)

    def list_runs(
        self,
        *,
        status: Sequence[str] | str | None = None,
        workflow: str | None = None,
        limit: int = 50,
        offset: int = 0,
        since: float | None = None,
        search: str | None = None,
        summary: bool = False,
        versions: Sequence[str | None] | None = None,
        queue: str | None = None,
    ) -> list[RunRecord]:
        """Runs, newest first. ``since``: created at or after this timestamp;
        ``search``: text in the id, key, input, output or error (any case);
        ``summary``: without input, output and hand-off (``None``); ``versions``: only
        runs submitted by these code versions (``None`` in it: with no version);
        ``queue``: only runs submitted to that queue."""
        statuses = [status] if isinstance(status, str) else status
        return self.store.list_runs(
            statuses=statuses,
            queue=queue,
            workflow=workflow,
            limit=limit,
            offset=offset,
            since=since,
            search=search,
            summary=summary,
            versions=versions,
        )

    children = Via("_children", Children.children)
    follow_tokens = Via("_streams", Streams.follow_tokens)
    stream = Via("_streams", Streams.stream)

    def signal(self, run_id: str | RunHandle, name: str, payload: Any = None) -> int:
        """Send a signal to a run; it is kept until a ``ctx.wait_for(name)`` takes it.

        Names reserved for requests to humans (``approval:…``, ``question:…``,
        ``budget:…``, ``checkpoint:…``, ``resume``) are refused: answer those with
        :meth:`answer`, which checks the request exists and records who decided.

        Raises:
            ReservedSignal: ``name`` is reserved for the answer to a request.
            RunNotFound: no such run.
            RunConflict: the run has finished.
        """
        run_id = run_id_of(run_id)
        if is_request_signal(name):
            raise ReservedSignal(
                f"signal {name!r} is reserved for the answer to a request: answer it with "
                f"app.answer({run_id!r}, {name!r}, ...) (HTTP: POST /runs/{{id}}/requests/"
                f"{name} with the 'approve' scope; CLI: mainspring approve)",
                run_id=run_id,
            )
        encoded = self._redact(dumps(payload, what=f"payload of signal {name!r}"))
        return self.store.send_signal(run_id, name, encoded, self.clock.now())

    def requests(self, run_id: str | RunHandle | None = None) -> list[Request]:
        """Requests waiting for a human (of one run, or of all runs), oldest first."""
        run_id = run_id_of(run_id)
        return self.store.pending_requests(run_id)

    def answer(
        self,
        run_id: str | RunHandle,
        request_id: str,
        *,
        decision: Decision | None = None,
        reason: str | None = None,
        arguments: dict[str, Any] | None = None,
        answer: str | None = None,
        by: str | None = None,
    ) -> Request:
        """Answer a pending request once: ``decision`` (``approve``, ``reject`` with a
        ``reason``, or ``edit`` with new ``arguments``) for an approval, ``answer`` for
        a question. The run resumes on any worker. ``by`` (who decided) defaults to
        the local user; the HTTP API sets it to the API key's name.

        Raises:
            RunNotFound: no such run.
            RequestNotFound: the run has no such request.
            RunConflict: the run has finished or the request was already answered.
            InvalidAnswer: the answer does not fit the request.
        """
        run_id = run_id_of(run_id)

        who = by if by is not None else local_user()

        def payload(request: Request) -> str:
            return self._redact(
                answer_payload(
                    request,
                    decision=decision,
                    reason=reason,
                    arguments=arguments,
                    answer=answer,
                    by=who,
                )
            )

        request, _ = self.store.answer_request(run_id, request_id, payload, self.clock.now())
        return request

    def cancel(self, run_id: str | RunHandle, reason: str | None = None) -> str:
        """Cancel a run; returns its status afterwards (``running`` while its
        worker is stopping it)."""
        run_id = run_id_of(run_id)
        if reason is not None and self.redactor is not None:
            reason = self.redactor.redact_text(reason)
        return self.store.cancel(run_id, self.clock.now(), reason)

    fork = Via("_lineage", Lineage.fork)
    retry = Via("_lineage", Lineage.retry)

    async def replay_check(
        self,
        runs: Iterable[str] | None = None,
        *,
        workflows: Sequence[str] | None = None,
        versions: Sequence[str | None] | Literal["any"] | None = None,
        database: str | Store | None = None,
    ) -> ReplayReport:
        """Replay the journal of every unfinished run (queued, running, sleeping,
        waiting), or of ``runs``, against this App's code, writing nothing: the gate
        before a deploy (``mainspring replay-check``, docs/workflows.md).

        Each run replays cleanly, diverges at a journal position (what the journal
        holds there and what the code asked for, with a hint: usually
        ``ctx.patched``), or this code lacks its workflow or cannot read its input.

        Args:
            runs: run ids to check (any status), instead of every unfinished run.
            workflows: only runs of these workflows.
            versions: only runs of these code versions, as ``app.worker(versions=...)``
                takes them: by default the runs this App's workers claim (its
                ``version`` and runs with none, or every run when it declares none);
                a run of an older version that drains under the old code beside this
                one is not this code's to replay.
            database: check the runs of this database (a URL or a store) instead of
                this App's: production's, from a CI job holding the new code. A URL is
                opened without migrating it, and read-only on PostgreSQL.

        Returns:
            A :class:`ReplayReport`: ``.ok``, ``.failed``, ``.summary()``, ``.to_dict()``.
        """
        return await replay_check(
            self, runs, workflows=workflows, versions=versions, database=database
        )

    shadow = app_shadow  # the shadow lab (docs/lab.md), in a module of its own

    def _redact(self, text: str) -> str:
        return self._runtime.redact(text)

    async def result(self, run_id: str | RunHandle, *, timeout: float | None = None) -> Any:
        """Wait until the run finishes; return its result or raise :class:`RunFailed`."""
        run_id = run_id_of(run_id)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        told: str | None = None
        while True:
            record = self.get_run(run_id)
            if record.finished:
                break
            if record.status == "waiting" and record.wait_reason != told:
                # Not silent: this call waits on a person or a signal, and on a worker.
                told = record.wait_reason
                log.warning(
                    "%s; app.result keeps waiting until it is answered and a worker runs it",
                    waiting(self.store, record),
                )
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"run {run_id!r} is still {record.status} after {timeout}s")
            await asyncio.sleep(self.poll_interval_s)
        if record.status == "succeeded":
            wf = self.workflows.get(record.workflow)
            return wf.decode_output(record.output) if wf else loads(record.output)
        error = loads(record.error) or {}
        raise RunFailed(
            f"{record.workflow!r} {record.status}: "
            f"{error.get('type', '?')}: {error.get('message', '')}",
            status=record.status,
            error=error,
            run_id=run_id,
        )

    # -- the namespaces ------------------------------------------------------------------

    @property
    def admin(self) -> Admin:
        """API keys and webhook endpoints: ``app.admin.create_key(...)``,
        ``app.admin.add_webhook(...)``."""
        return self._admin

    @property
    def observe(self) -> Observe:
        """Traces, usage, diagnoses and metrics of the runs, and live span export:
        ``app.observe.trace(run_id)``, ``app.observe.metrics()``."""
        return self._observe

    @property
    def queues(self) -> Queues:
        """Queues: ``app.queues.add("emails", concurrency=2)``, ``app.queues.list()``."""
        return self._queues

    @property
    def schedules(self) -> Schedules:
        """Cron schedules: ``app.schedules.add("0 3 * * *")`` (a decorator) or
        ``app.schedules.add(name, cron, workflow, *args)``, ``.pause(name)``,
        ``.list()``..."""
        return self._schedules

    @property
    def mcp(self) -> MCPServers:
        """MCP tool servers: ``app.mcp.add("fs", command=[...])``, ``app.mcp.close()``."""
        return self._mcp

    # -- deprecated: the old spellings, for one release ---------------------------------

    create_key = Moved("admin", Admin.create_key)
    list_keys = Moved("admin", Admin.list_keys)
    get_key = Moved("admin", Admin.get_key)
    verify_key = Moved("admin", Admin.verify_key)
    revoke_key = Moved("admin", Admin.revoke_key)
    add_webhook = Moved("admin", Admin.add_webhook)
    list_webhooks = Moved("admin", Admin.list_webhooks)
    remove_webhook = Moved("admin", Admin.remove_webhook)

    trace = Moved("observe", Observe.trace)
    steps = Moved("observe", Observe.steps)
    usage = Moved("observe", Observe.usage)
    family = Moved("observe", Observe.family)
    diagnose = Moved("observe", Observe.diagnose)
    metrics = Moved("observe", Observe.metrics)
    enable_tracing = Moved("observe", Observe.enable_tracing)
    disable_tracing = Moved("observe", Observe.disable_tracing)

    queue = Moved("queues", Queues.add)

    schedule = Moved("schedules", Schedules.add)
    load_schedules = Moved("schedules", Schedules.load)
    schedule_now = Moved("schedules", Schedules.now)
    sync_schedules = Moved("schedules", Schedules.sync)
    tick_schedules = Moved("schedules", Schedules.tick)
    list_schedules = Moved("schedules", Schedules.list)
    get_schedule = Moved("schedules", Schedules.get)
    pause_schedule = Moved("schedules", Schedules.pause)
    resume_schedule = Moved("schedules", Schedules.resume)

    close_mcp = Moved("mcp", MCPServers.close)

    @property
    def mcp_servers(self) -> dict[str, MCPToolset]:
        """Deprecated: ``app.mcp.servers``."""
        deprecated("app.mcp_servers is deprecated: use app.mcp.servers")
        return self._mcp.servers

    def split_tools(
        self, agent: str, tools: Sequence[Tool[Any, Any] | Toolset]
    ) -> tuple[list[Tool[Any, Any]], tuple[Toolset, ...]]:
        """Deprecated: an :class:`Agent` splits its ``tools=`` itself
        (``agent.plain_tools``, ``agent.toolsets``)."""
        deprecated(
            "app.split_tools is deprecated: an ms.Agent splits its tools= itself "
            "(agent.plain_tools, agent.toolsets)"
        )
        return split_tools(agent, tools)

    child_workflow = Moved("_children", Children.child_workflow, instead=_PLUMBING)
    start_child = Moved("_children", Children.start_child, instead=_PLUMBING)
