"""The shadow lab: :meth:`~mainspring.App.shadow` re-runs recorded runs against a
candidate (another model, prompt, tool version or policy) and says where its decisions
part from the recorded ones, with no effect reaching the world.

Each recorded run is run again, under its own id and input, in a scratch database (a
temporary SQLite file unless told otherwise) by a worker of a scratch App holding the
candidate's workflows, tools and agents; the recorded run's database is only read. A
step interceptor (:class:`_Stand`) answers every step the candidate executes:

* before ``from_step``: from the recorded journal at the same position (the past is
  kept: the candidate decides from that step on);
* a model call: the candidate's model, live;
* a ``write`` or ``irreversible`` tool, or a plain step nobody declared ``read``: the
  user's stub for that tool if given, else the recorded result of the matching call
  (tool name and arguments, else tool name and order), else a
  :class:`~mainspring.ShadowStubMissing` error that the model sees as the tool's
  result. The real tool never runs;
* a ``read`` tool (or a step marked ``read``): live, or from the journal as above
  (``reads="journal"``, the default).

Requests to people are answered as the recorded run's people answered them (see
:class:`_Answers`). Then the two journals are compared reply by reply.
"""

from __future__ import annotations

import asyncio
import inspect
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal, Protocol

from .._errors import ConfigError, MainspringError, ShadowStubMissing
from .._serde import loads
from ..journal import StepCall, StepInterceptor
from ..limits import Price
from ..storage import RunRecord, SQLiteStore, Store, open_read_only, open_store
from ..tools import ToolRegistry, step_effect, tool_of
from ._shadow_journal import Decision, RecordedResults, RecordedRun, decisions, position
from ._shadow_verdict import ShadowReport, ShadowRun, StubAnswer, compare, side

__all__ = ["Reads", "ScratchApp", "ShadowOptions", "recorded_runs", "shadow"]

Reads = Literal["live", "journal"]
_BY = "mainspring shadow"
_POLL_S = 0.005  # how often the driver looks at the shadow's status
_LONG_S = 5.0  # a sleep longer than this ends the shadow (it would idle the report)


class ScratchApp(Protocol):
    """What a shadow runs on: an App over the scratch database (``App`` is one)."""

    store: Store
    tools: ToolRegistry

    @property
    def workflows(self) -> dict[str, Any]: ...
    @property
    def agents(self) -> dict[str, Any]: ...
    def worker(self, **options: Any) -> Any: ...
    def requests(self, run_id: Any = None) -> list[Any]: ...
    def answer(self, run_id: Any, request_id: str, **options: Any) -> Any: ...
    def close(self) -> None: ...


@dataclass(slots=True)
class _Recorded:
    """A recorded run as its shadow's steps are answered from it."""

    by_position: dict[tuple[int, int], Any]
    results: RecordedResults
    start: tuple[int, int]
    answers: list[StubAnswer] = field(default_factory=list)


class _Stand(StepInterceptor):
    """Stands in for every effect of the scratch App's runs (see the module)."""

    def __init__(self, stubs: Mapping[str, Callable[..., Any]], reads: Reads) -> None:
        self.stubs, self.reads = dict(stubs), reads
        self.recorded: dict[str, _Recorded] = {}

    async def execute_step(self, call: StepCall, proceed: Callable[[], Awaitable[Any]]) -> Any:
        info = call.info
        if info.role in ("rate", "wait"):
            return await proceed()
        rec = self.recorded.setdefault(  # a child run: nothing recorded, nothing real
            info.run_id, _Recorded({}, RecordedResults(), (0, 0))
        )
        at = position(info.session, info.seq)
        if (info.session, info.seq) < rec.start:
            row = rec.by_position.get((info.session, info.seq))
            if row is not None and row.name == info.name:
                rec.answers.append(StubAnswer(at, info.name, info.role, "journal: position"))
                return _replayed(row)
        if info.role == "model":
            return await proceed()
        tool = tool_of(call.fn)
        effect = step_effect(call.fn) or "write"  # undeclared: assume the worst
        name = tool.name if tool is not None else info.name
        if effect == "read" and self.reads == "live":
            rec.answers.append(StubAnswer(at, info.name, effect, "live"))
            return await proceed()
        arguments = dict(call.args[0]) if tool is not None and call.args else None
        if tool is not None and name in self.stubs:
            rec.answers.append(StubAnswer(at, info.name, effect, "stub"))
            value = self.stubs[name](arguments or {})
            return await value if inspect.isawaitable(value) else value
        found = rec.results.take(name, arguments)
        if found is None:
            rec.answers.append(StubAnswer(at, info.name, effect, "missing"))
            raise ShadowStubMissing(
                f"shadow: {name} was not run ({effect}): the recorded run has no result "
                f"left for it and no stub was given (stubs={{{name!r}: ...}})",
                run_id=info.run_id,
                step=f"{at} {info.name}",
            )
        row, how = found
        rec.answers.append(StubAnswer(at, info.name, effect, how))
        return _replayed(row)


_ERRORS: dict[str, type[MainspringError]] = {}


def _replayed(row: Any) -> Any:
    """A journaled step's result as the step returns it again, or its error raised
    under the recorded type's name (what the model saw then)."""
    if row.error is None:
        return loads(row.output)
    error = loads(row.error)
    kind = str(error.get("type", "Error")) if isinstance(error, dict) else "Error"
    message = str(error.get("message", "")) if isinstance(error, dict) else str(error)
    short = kind.rsplit(".", 1)[-1] or "Error"
    cls = _ERRORS.get(short)
    if cls is None:  # same name, no retry (the recorded failure was final)
        cls = _ERRORS[short] = type(short, (MainspringError,), {"retryable": False})
    raise cls(message)


def _since(value: float | datetime | timedelta | None, now: float) -> float | None:
    if value is None or isinstance(value, int | float):
        return value
    if isinstance(value, timedelta):
        return now - value.total_seconds()
    return value.timestamp()


def _selected(
    source: Store,
    runs: Iterable[str] | None,
    *,
    workflows: Sequence[str] | None,
    statuses: Sequence[str] | None,
    since: float | None,
    until: float | None,
    limit: int,
) -> list[RunRecord]:
    if runs is not None:
        found = [source.get_run(r) for r in runs]
        missing = [r for r, f in zip(runs, found, strict=True) if f is None]
        if missing:
            raise ConfigError(f"shadow: no run {missing[0]!r} in the recorded database")
        records = [f for f in found if f is not None]
    else:
        records = []
        chosen: list[str | None] = list(workflows) if workflows else [None]
        for wf in chosen:
            records += source.list_runs(
                statuses=list(statuses) if statuses else None,
                workflow=wf,
                since=since,
                limit=limit,
            )
    keep = [r for r in records if until is None or r.created_at < until]
    if workflows is not None:
        keep = [r for r in keep if r.workflow in workflows]
    picked = sorted({r.id: r for r in keep}.values(), key=lambda r: (r.created_at, r.id))
    return picked if runs is not None else picked[:limit]


def _start(from_step: int | str) -> tuple[int, int]:
    if isinstance(from_step, int):
        return (0, from_step)
    session, sep, seq = from_step.partition(":")
    try:
        return (int(session), int(seq)) if sep else (0, int(session))
    except ValueError:
        raise ConfigError(
            f"from_step must be a position like 12 or '1:4' (session:seq), got {from_step!r}"
        ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ShadowOptions:
    """What the candidate is and how the shadow answers its steps (see App.shadow)."""

    from_step: int | str = 0
    stubs: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    reads: Reads = "journal"
    prices: dict[str, Price] | None = None
    candidate: dict[str, Any] = field(default_factory=dict)


async def shadow(
    recordings: Sequence[RecordedRun],
    scratch_app: Callable[[Store, StepInterceptor], ScratchApp],
    options: ShadowOptions,
    scratch: str | None = None,
) -> ShadowReport:
    """Shadow ``recordings`` on an App made by ``scratch_app`` (holding the candidate)
    over the scratch database."""
    if options.reads not in ("live", "journal"):
        raise ConfigError(f"reads must be 'live' or 'journal', got {options.reads!r}")
    started = time.perf_counter()
    start = _start(options.from_step)
    with tempfile.TemporaryDirectory(prefix="mainspring-shadow-") as tmp:
        url = scratch or f"sqlite:///{Path(tmp) / 'shadow.db'}"
        store = open_store(url) if scratch else SQLiteStore(Path(tmp) / "shadow.db")
        stand = _Stand(options.stubs, options.reads)
        app = scratch_app(store, stand)
        try:
            out = [await _one(app, stand, rec, start, options) for rec in recordings]
        finally:
            app.close()
    report = ShadowReport(
        runs=[r for r, _ in out],
        seconds=time.perf_counter() - started,
        candidate=options.candidate,
        scratch=url if scratch else "a temporary SQLite file (deleted)",
        recordings={rec.run.id: rec for rec in recordings},
        decisions={r.run_id: d for r, d in out},
    )
    return report


async def _one(
    app: ScratchApp,
    stand: _Stand,
    rec: RecordedRun,
    start: tuple[int, int],
    options: ShadowOptions,
) -> tuple[ShadowRun, list[Decision]]:
    run = rec.run
    head = ShadowRun(
        run_id=run.id, workflow=run.workflow, from_step=position(*start), verdict="error"
    )
    if run.workflow not in app.workflows:
        return replace(head, message=f"the candidate has no workflow {run.workflow!r}"), []
    tools = app.tools

    def prepare(name: str, arguments: Any) -> Any:
        found = tools.get(name)
        if found is None or not isinstance(arguments, dict):
            return arguments
        try:
            return found.validate(arguments)
        except MainspringError:
            return arguments

    stand.recorded[run.id] = _Recorded(
        {(r.session, r.seq): r for r in rec.steps},
        RecordedResults.of(rec.steps, prepare),
        start,
    )
    try:
        app.store.create_run(
            run_id=run.id, workflow=run.workflow, input=run.input, key=None, now=time.time()
        )
        await _drive(app, run.id, _Answers(rec.steps))
    except MainspringError as exc:
        return replace(head, message=f"{type(exc).__name__}: {exc.message}"), []
    made = app.store.get_run(run.id)
    assert made is not None
    steps = app.store.load_steps(run.id)
    answers = tuple(stand.recorded[run.id].answers)
    effects = sum(
        1 for a in answers if a.effect in ("write", "irreversible") and a.source != "live"
    )
    head = replace(head, stubbed=answers, effects_stubbed=effects)
    before, after = decisions(rec.steps), decisions(steps)
    verdict = compare(
        head, before, after, side(run, rec.steps, options.prices),
        side(made, steps, options.prices),
    )  # fmt: skip
    return verdict, after


class _Answers:
    """What the recorded run's people answered, to answer the shadow's requests with:
    the answer to the request of the same id, else the next one of its kind in order
    (a question, an approval). An approval with no recorded answer is approved (what it
    guards is stubbed); a question with none ends the shadow there."""

    def __init__(self, steps: Sequence[Any]) -> None:
        self.given: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for row in steps:
            kind = row.name.partition(":")[0]
            if row.kind != "signal" or kind not in ("approval", "question") or not row.output:
                continue
            signal = loads(row.output)
            signal = signal.get("signal") if isinstance(signal, dict) else None
            if isinstance(signal, dict):
                self.given.setdefault(kind, []).append((row.name, signal))

    def take(self, kind: str, request_id: str) -> dict[str, Any] | None:
        found = self.given.get(kind, [])
        i = next((i for i, (name, _) in enumerate(found) if name == request_id), 0)
        return found.pop(i)[1] if found else None


async def _drive(app: ScratchApp, run_id: str, answers: _Answers) -> None:
    """Work the shadow until it ends or waits for what a shadow cannot give (a
    question nobody answered in the recorded run, a signal, a long sleep); answer its
    requests as the recorded run's people did. One worker all along, so that a run
    suspended for a request resumes where it stood."""
    worker = app.worker(concurrency=1, batch=False)
    task = asyncio.create_task(worker.run())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=_POLL_S)
            record = app.store.get_run(run_id)
            if record is None or record.finished:
                break
            if record.status == "sleeping" and (record.wake_at or 0) - time.time() > _LONG_S:
                break
            if record.status == "waiting" and not _answer(app, run_id, answers):
                break
    finally:
        worker.request_stop()
        await asyncio.gather(task, return_exceptions=True)


def _answer(app: ScratchApp, run_id: str, answers: _Answers) -> bool:
    """Answer what the run asks; ``False`` when it waits for something no one can give
    (an answer already given but not yet taken is waited for)."""
    pending = app.requests(run_id)
    if not pending:
        return any(s.consumed_at is None for s in app.store.list_signals(run_id))
    for r in pending:
        given = answers.take(r.kind, r.id)
        if r.kind == "question":
            if given is None or not given.get("answer"):
                return False
            app.answer(run_id, r.id, answer=given["answer"], by=_BY)
        elif given is None:
            app.answer(run_id, r.id, decision="approve", by=_BY)
        else:
            decision = given.get("decision", "approve")
            reason, arguments = given.get("reason"), given.get("arguments")
            app.answer(run_id, r.id, decision=decision, reason=reason, arguments=arguments, by=_BY)
    return True


def recorded_runs(
    source: Store | str,
    runs: Iterable[str] | None = None,
    *,
    workflows: Sequence[str] | None = None,
    statuses: Sequence[str] | None = None,
    since: float | datetime | timedelta | None = None,
    until: float | datetime | timedelta | None = None,
    limit: int = 100,
) -> list[RecordedRun]:
    """The runs to shadow and their journals, read from ``source`` (a URL is opened
    read-only and closed)."""
    store = open_read_only(source) if isinstance(source, str) else source
    now = time.time()
    try:
        records = _selected(
            store,
            None if runs is None else list(runs),
            workflows=workflows,
            statuses=statuses,
            since=_since(since, now),
            until=_since(until, now),
            limit=limit,
        )
        return [RecordedRun(r, tuple(store.load_steps(r.id))) for r in records]
    finally:
        if isinstance(source, str):
            store.close()
