"""The replay gate: :meth:`~mainspring.App.replay_check` replays the journal of every
unfinished run against the code it is given (the code about to be deployed) and says,
run by run, whether that code can carry it on: it replays cleanly, it diverges at
position N (what the journal holds there and what the code asked for), or the code
lacks the run's workflow or cannot read its input. Nothing is written and no step
function runs (see :mod:`mainspring.journal._replay`); pointed at another database,
that database is opened without migrating it, read-only where the server can enforce
it (PostgreSQL)."""

from __future__ import annotations

import inspect
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from .._describe import safe_str
from .._errors import NondeterminismError
from ..journal import Committer, Engine, Replayed, replay_engine, replay_journal
from ..storage import RunRecord, Store, open_read_only
from ..worker import WorkerHost, accepted_versions

__all__ = ["UNFINISHED", "ReplayReport", "RunCheck", "replay_check"]

#: The statuses a deploy must carry on.
UNFINISHED = ("queued", "running", "sleeping", "waiting")

Verdict = Literal["clean", "diverged", "unknown workflow", "bad input", "error"]


@dataclass(frozen=True, slots=True)
class RunCheck:
    """One run, replayed against the code.

    Attributes:
        verdict: ``"clean"``, ``"diverged"``, ``"unknown workflow"`` (the code has no
            workflow of the run's name), ``"bad input"`` (the workflow's parameters no
            longer accept the run's input) or ``"error"`` (the replay itself failed:
            the database, a bug).
        journaled: positions in the run's current session's journal.
        reached: the last position the code took.
        position: where it diverged.
        expected: the journal's ``[kind, name]`` there; ``got``: the code's.
        then: what a worker running this code would do next (``"run"``, ``"wait"``,
            ``"finish"``, ``"fail"``, ...), for a clean replay.
        message: the replay's own words; ``hint``: what to do about it.
    """

    run_id: str
    workflow: str
    version: str | None
    status: str
    session: int
    verdict: Verdict
    journaled: int = 0
    reached: int = -1
    position: int | None = None
    expected: tuple[str, str] | None = None
    got: tuple[str, str] | None = None
    then: str | None = None
    message: str = ""
    hint: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == "clean"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """Every run checked, and how long it took.

    ``ok`` is true when every run replays cleanly; :meth:`summary` counts verdicts per
    workflow and code version."""

    runs: list[RunCheck]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runs)

    @property
    def failed(self) -> list[RunCheck]:
        return [r for r in self.runs if not r.ok]

    def summary(self) -> list[dict[str, Any]]:
        """One row per (workflow, version): ``{"workflow", "version", "runs", verdict: n}``."""
        rows: dict[tuple[str, str | None], Counter[str]] = {}
        for r in self.runs:
            rows.setdefault((r.workflow, r.version), Counter())[r.verdict] += 1
        return [
            {"workflow": wf, "version": version, "runs": sum(c.values()), **dict(c)}
            for (wf, version), c in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked": len(self.runs),
            "diverged": len(self.failed),
            "seconds": round(self.seconds, 3),
            "summary": self.summary(),
            "runs": [r.to_dict() for r in self.runs],
        }


async def replay_check(
    host: WorkerHost,
    runs: Iterable[str] | None = None,
    *,
    workflows: Sequence[str] | None = None,
    versions: Sequence[str | None] | Literal["any"] | None = None,
    database: str | Store | None = None,
) -> ReplayReport:
    """:meth:`App.replay_check <mainspring.App.replay_check>`, for any worker host."""
    started = time.perf_counter()
    runs = None if runs is None else list(dict.fromkeys(runs))
    claimed = accepted_versions(host.version, versions)
    store = open_read_only(database) if isinstance(database, str) else database
    try:
        source = store or host.store
        records = _selected(source, runs, workflows, claimed)
        with ThreadPoolExecutor(1, thread_name_prefix="mainspring-replay-check") as threads:
            engine = replay_engine(
                replace(host.engine(Committer(source, host.clock), threads), store=source), threads
            )
            checked = [await _check(host, engine, run) for run in records]
        checked += _missing(source, runs)
    finally:
        if isinstance(database, str) and store is not None:
            store.close()
    return ReplayReport(checked, time.perf_counter() - started)


async def _check(host: WorkerHost, engine: Engine, run: RunRecord) -> RunCheck:
    head = RunCheck(
        run_id=run.id, workflow=run.workflow, version=run.version, status=run.status,
        session=run.session, verdict="error",
    )  # fmt: skip
    workflow = host.workflows.get(run.workflow)
    if workflow is None:
        return replace(head, verdict="unknown workflow",
            message=f"this code has no workflow {run.workflow!r}",
            hint="keep the workflow registered until its runs finish, or drain them under "
            "the old code (a new version, app.worker(versions=...))",
        )  # fmt: skip
    try:
        args, kwargs = workflow.decode_input(run.input)
        inspect.signature(workflow.fn).bind(None, *args, **kwargs)
    except Exception as exc:
        return replace(head, verdict="bad input", got=("input", type(exc).__name__),
            message=f"the run's input no longer fits the workflow: {safe_str(exc)}",
            hint="keep the workflow's parameters compatible (new ones with defaults) "
            "until its runs finish",
        )  # fmt: skip
    try:
        found = await replay_journal(engine, run, workflow)
    except Exception as exc:
        return replace(head, verdict="error", message=f"{type(exc).__name__}: {safe_str(exc)}")
    return _of(head, found)


def _missing(store: Store, runs: list[str] | None) -> list[RunCheck]:
    """Runs asked for by id that the database does not hold: named, never passed over
    (a gate that checked nothing must not say yes)."""
    return [
        RunCheck(
            run_id=run_id,
            workflow="",
            version=None,
            status="missing",
            session=0,
            verdict="error",
            message=f"no run {run_id!r} in this database",
        )
        for run_id in runs or ()
        if store.get_run(run_id) is None
    ]


def _of(head: RunCheck, found: Replayed) -> RunCheck:
    div = found.divergence
    if div is None:
        message = (
            f"replays {found.reached + 1} of {found.journaled} journal positions; "
            f"then: {found.then}"
        )
        if found.raised:
            message += f" ({found.raised})"
        return replace(head, verdict="clean", journaled=found.journaled, reached=found.reached,
            then=found.then, message=message,
        )  # fmt: skip
    return replace(head, verdict="diverged", journaled=found.journaled, reached=found.reached,
        position=div.position, expected=div.expected, got=div.got, message=div.message,
        hint=_hint(div),
    )  # fmt: skip


def _hint(div: NondeterminismError) -> str:
    if div.got is not None and div.got[0] == "patch":
        return (
            "runs on this change's old path are still in flight: keep the code that "
            "checks it (ctx.patched / ctx.version) until they finish"
        )
    if div.got is not None and div.got[0] == "end":
        return (
            f"the code no longer asks for {div.expected[1] if div.expected else 'this step'!r}: "
            'remove it under `if not ctx.patched("<change-id>"):` so that runs which '
            "started before the change keep it"
        )
    return (
        'guard the change with `if ctx.patched("<change-id>"):` (new code) `else:` (the '
        "old code), so that runs which started before it replay their old path; or drain "
        "them under the old code (a new version, app.worker(versions=...))"
    )


def _selected(
    store: Store,
    runs: Iterable[str] | None,
    workflows: Sequence[str] | None,
    versions: Sequence[str | None] | None,
) -> list[RunRecord]:
    if runs is not None:
        found = [store.get_run(run_id) for run_id in runs]
        records = [r for r in found if r is not None]
    else:
        records = []
        page = 1000
        while True:
            got = store.list_runs(
                statuses=list(UNFINISHED), versions=versions, limit=page, offset=len(records)
            )
            records.extend(got)
            if len(got) < page:
                break
    if workflows is not None:
        records = [r for r in records if r.workflow in workflows]
    return records
