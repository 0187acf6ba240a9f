"""The demo's findings: what it checks after the crash, and how it prints them.

Every claim of the summary is a check of the journal, the target's rows or its effect
ledger (:func:`summarize`), never the workers' word; :func:`with_lab` adds the short lab
comparison, :func:`render` prints it all for a person (``--json`` prints the
:class:`Summary` itself).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.text import Text

from ..lab import LabProfile, plot_results, run_lab
from ..storage import RunRecord, StepRecord
from ..testing import EffectLedger

__all__ = [
    "DemoError",
    "Kill",
    "Seen",
    "Summary",
    "add_lab",
    "facts",
    "plural",
    "print_json",
    "progress_bar",
    "render",
    "summarize",
]

APP_MODULE = "mainspring.examples.migration.worker_app"
APP_SPEC = f"{APP_MODULE}:app"
TARGET_ENV = "MIGRATION_TARGET"  # read by the worker app
LEASE_S = 2.0
RUN_KEY = "demo-migrate-customers"
IMPORT = "import_customer"


class DemoError(Exception):
    """The demo could not do what it shows (a worker died, the run ended early...)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Rerun:
    """A step that was in flight when the worker died, and what became of it."""

    step: int
    name: str
    key: str
    attempt_killed: int
    attempt_final: int
    status: str
    calls: int
    applied: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LabRow:
    policy: str
    steps: int
    success_rate: float
    ci_low: float
    ci_high: float
    duplicate_effects: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """The demo's findings; ``--json`` prints exactly this."""

    ok: bool
    dir: str
    database_url: str
    target_path: str
    run_id: str
    key: str
    status: str
    result: Any
    error: Any
    customers: int
    steps: int
    steps_completed: int
    imports: int
    gate: str
    gate_preview: Any
    retried_steps: list[str]
    killed_pid: int
    killed_at_step: int
    killed_step_name: str
    steps_completed_before_kill: int
    effect_applied_before_kill: bool
    lease_s: float
    takeover_pid: int
    takeover_after_s: float
    epoch: int
    interrupted: list[Rerun]
    target_calls: int
    target_keys: int
    target_rows: int
    repeated_calls: int
    duplicates: int
    worker_exit_code: int
    checks: list[Check]
    lab: list[LabRow]
    lab_plot: str | None
    lab_note: str
    inspect: list[str]
    logs: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Kill:
    """Where the first worker was killed, and what it left behind."""

    pid: int
    seq: int  # the step in flight
    name: str
    epoch: int
    lease_until: float
    at: float  # time.monotonic()
    status: str  # the run's status when it was killed
    rows: dict[int, StepRecord]  # the journal as the dead worker left it
    calls: dict[int, int]  # target calls per import step so far


@dataclass(frozen=True, slots=True, kw_only=True)
class Seen:
    """What the checks read once the run is over: its record and journal, the target's
    effect ledger, and where the demo keeps them."""

    record: RunRecord
    rows: dict[int, StepRecord]
    ledger: EffectLedger
    run_id: str
    folder: Path
    url: str
    target_path: Path
    customers: int

    def key(self, seq: int) -> str:
        """The idempotency key of the run's step ``seq`` (session 0)."""
        return f"{self.run_id}:0:{seq}"


def summarize(
    seen: Seen,
    kill: Kill,
    takeover_s: float,
    second: subprocess.Popen[bytes],
    exit_code: int,
    preview: dict[str, Any],
    gate: str,
) -> Summary:
    """Check the journal, the target's rows and its ledger, not the workers' word."""
    record, rows = seen.record, seen.rows
    report = seen.ledger.report()
    module = importlib.import_module(APP_MODULE)
    stored = module.target.rows()
    imports = sorted(s for s, r in rows.items() if r.name == IMPORT)
    result = json.loads(record.output) if record.output else None
    before = [s for s, r in kill.rows.items() if r.status == "completed"]
    # Rows the dead worker left completed must be untouched by the new one (same epoch
    # and attempt), and their target calls must not have grown: replayed, not re-run.
    untouched = [
        s
        for s in before
        if s in rows
        and (rows[s].epoch, rows[s].attempt) == (kill.rows[s].epoch, kill.rows[s].attempt)
        and (s not in kill.calls or seen.ledger.calls(seen.key(s)) == kill.calls[s])
    ]
    interrupted = [
        Rerun(
            step=r.seq,
            name=r.name,
            key=seen.key(r.seq),
            attempt_killed=r.attempt,
            attempt_final=rows[r.seq].attempt if r.seq in rows else 0,
            status=rows[r.seq].status if r.seq in rows else "missing",
            calls=seen.ledger.calls(seen.key(r.seq)),
            applied=seen.ledger.applied(seen.key(r.seq)),
        )
        for r in kill.rows.values()
        if r.status != "completed"
    ]
    completed = sum(r.status == "completed" for r in rows.values())
    import_keys = {seen.key(s) for s in imports}
    gate_seq = next((q for q, r in rows.items() if r.name == gate), None)
    checks = [
        Check(
            name="the run succeeded",
            ok=record.status == "succeeded",
            detail=f"status {record.status}",
        ),
        Check(
            name="the stage gate held the import until it was approved",
            ok=gate_seq is not None
            and rows[gate_seq].status == "completed"
            and bool(imports)
            and min(imports) > gate_seq,
            detail=f"{gate} (step {gate_seq}) answered before the first import step",
        ),
        Check(
            name="the kill landed mid-import",
            ok=kill.name == IMPORT and kill.status == "running" and kill.seq in imports,
            detail=f"step {kill.seq} ({kill.name}) was in flight, run status {kill.status}",
        ),
        Check(
            name="a fresh worker took the run over",
            ok=record.epoch > kill.epoch,
            detail=f"epoch {kill.epoch} → {record.epoch}",
        ),
        Check(
            name="steps completed before the crash were not executed again",
            ok=len(untouched) == len(before),
            detail=f"{len(untouched)} of {len(before)} journal rows untouched, "
            "no new target calls for them",
        ),
        Check(
            name="the interrupted step ran again under the same idempotency key",
            ok=bool(interrupted)
            and all(
                e.status == "completed" and e.attempt_final > e.attempt_killed and e.applied == 1
                for e in interrupted
            ),
            detail="; ".join(
                f"step {e.step}: attempt {e.attempt_killed} → {e.attempt_final}, "
                f"{plural(e.calls, 'target call')}, {plural(e.applied, 'effect')}"
                for e in interrupted
            )
            or "no step was in flight",
        ),
        Check(
            name="every import took effect exactly once per key",
            ok=not report.duplicate_effects
            and seen.ledger.keys() == import_keys
            and all(seen.ledger.applied(k) == 1 for k in import_keys),
            detail=f"{report.keys} keys for {len(imports)} import steps, {report.calls} "
            f"calls, {len(report.duplicate_effects)} duplicate effects",
        ),
        Check(
            name="the target holds exactly the approved customers",
            ok=len(stored) == preview["import"] == len(imports)
            and bool(result and result.get("reconciled")),
            detail=f"{len(stored)} rows, {preview['import']} approved, reconciled "
            f"{bool(result and result.get('reconciled'))}",
        ),
        Check(
            name="worker 2 stopped gracefully on SIGTERM",
            ok=exit_code == 0,
            detail=f"exit code {exit_code}",
        ),
    ]
    url = shlex.quote(seen.url)
    return Summary(
        ok=all(c.ok for c in checks),
        dir=str(seen.folder),
        database_url=seen.url,
        target_path=str(seen.target_path),
        run_id=seen.run_id,
        key=RUN_KEY,
        status=record.status,
        result=result,
        error=json.loads(record.error) if record.error else None,
        customers=seen.customers,
        steps=len(rows),
        steps_completed=completed,
        imports=len(imports),
        gate=gate,
        gate_preview=preview,
        retried_steps=[
            f"{r.seq}:{r.name}"
            for r in rows.values()
            if r.attempt > 1 and all(r.seq != e.step for e in interrupted)
        ],
        killed_pid=kill.pid,
        killed_at_step=kill.seq,
        killed_step_name=kill.name,
        steps_completed_before_kill=len(before),
        effect_applied_before_kill=kill.calls.get(kill.seq, 0) > 0,
        lease_s=LEASE_S,
        takeover_pid=second.pid,
        takeover_after_s=round(takeover_s, 3),
        epoch=record.epoch,
        interrupted=interrupted,
        target_calls=report.calls,
        target_keys=report.keys,
        target_rows=len(stored),
        repeated_calls=len(report.duplicate_calls),
        duplicates=len(report.duplicate_effects),
        worker_exit_code=exit_code,
        checks=checks,
        lab=[],
        lab_plot=None,
        lab_note="skipped (--no-lab)",
        inspect=[
            f"mainspring show {seen.run_id} --db {url}",
            f"mainspring runs --db {url}",
        ],
        logs=[str(seen.folder / f"worker-{n}.log") for n in (1, 2)],
    )


def add_lab(summary: Summary, folder: Path, console: Console) -> Summary:
    """The same faults, many seeded trials: the naive loop against mainspring."""
    profile = LabProfile(model_error_rate=0.05, tool_failure_rate=0.05, crash_rate=0.03)
    console.print(
        "\nlab: 40 trials per cell, 5% model errors, 5% tool failures, 3% worker crashes "
        "per step (simulated time)"
    )
    result = run_lab(
        profile, steps=(5, 10, 20), policies=["naive", "mainspring"], trials=40, repeats=4
    )
    rows = [
        LabRow(
            policy=c.policy,
            steps=c.steps,
            success_rate=c.success_rate,
            ci_low=c.ci_low,
            ci_high=c.ci_high,
            duplicate_effects=c.duplicate_effects,
        )
        for c in result.cells
    ]
    plot: str | None = None
    try:
        names = plot_results(result, folder / "lab")
        plot = str(folder / "lab" / names[0])
        note = "plot written"
    except ImportError:
        note = "no plot: matplotlib is missing (pip install 'mainspring[lab]')"
    return dataclasses.replace(summary, lab=rows, lab_plot=plot, lab_note=note)


# -- rendering ------------------------------------------------------------------------


def plural(n: int, noun: str) -> str:
    """``1 step``, ``2 steps``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def facts(out: Console, facts: list[tuple[str, str]]) -> None:
    """Label-value lines, the labels aligned."""
    for label, value in facts:
        out.print(Text.assemble("  ", (f"{label:<11}", "bold"), value))


@contextlib.contextmanager
def progress_bar(
    console: Console, label: str, total: int, done: int
) -> Iterator[tuple[Progress, TaskID]]:
    """A one-line bar of a worker's steps, with a note beside it."""
    progress = Progress(
        TextColumn("  {task.description}"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TextColumn("steps  {task.fields[note]}"),
        console=console,
    )
    with progress:
        yield progress, progress.add_task(label, total=total, completed=done, note="")


def print_json(value: Any) -> None:
    """One JSON document on stdout."""
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def render(out: Console, s: Summary) -> None:
    """The summary for a person: the facts, then each check."""
    if s.effect_applied_before_kill:
        moment = "after the target applied its write, before the journal recorded the step's end"
    else:
        moment = "before its target write"
    reruns = "; ".join(
        f"step {e.step} ran again as attempt {e.attempt_final} with key {e.key}: "
        f"{plural(e.calls, 'target call')}, {plural(e.applied, 'effect')}"
        for e in s.interrupted
    )
    result = s.result if s.status == "succeeded" else s.error
    if isinstance(result, dict) and "rejected" in result:
        result = {**result, "rejected": len(result["rejected"])}
    out.print(Text("\nsummary", "bold"))
    facts(
        out,
        [
            ("run", f"{s.run_id} {s.status}"),
            ("result", json.dumps(result)),
            (
                "journal",
                f"{s.steps_completed} of {s.steps} steps completed ({s.imports} imports), "
                f"{s.steps_completed_before_kill} of them before the crash",
            ),
            (
                "retries",
                f"{plural(len(s.retried_steps), 'step')} retried after injected faults "
                f"({', '.join(s.retried_steps) or 'none'})",
            ),
            ("gate", f"{s.gate}: {s.gate_preview['import']} customers approved before import"),
            (
                "crash",
                f"worker pid {s.killed_pid} SIGKILLed during step {s.killed_at_step} "
                f"({s.killed_step_name}), {moment}",
            ),
            (
                "recovery",
                f"worker pid {s.takeover_pid} claimed the run {s.takeover_after_s:.1f}s "
                f"after the kill ({s.lease_s:g}s lease); {reruns or 'no step was in flight'}",
            ),
            (
                "target",
                f"{s.target_rows} rows; {plural(s.target_calls, 'call')} for "
                f"{plural(s.target_keys, 'key')}: {plural(s.repeated_calls, 'key')} called "
                f"more than once, {plural(s.duplicates, 'duplicate effect')}",
            ),
        ],
    )
    out.print(Text("\nchecks", "bold"))
    for c in s.checks:
        mark = ("✓", "green") if c.ok else ("✗", "bold red")
        out.print(Text.assemble("  ", mark, f" {c.name} ", (f"({c.detail})", "dim")))
    failed = sum(not c.ok for c in s.checks)
    if failed:
        out.print(Text(f"\n{failed} of {len(s.checks)} checks FAILED", "bold red"))
    else:
        out.print(Text(f"\nall {len(s.checks)} checks passed", "bold green"))
    if s.lab:
        out.print(Text("\nlab: success rate by task length (95% Wilson CI)", "bold"))
        for row in s.lab:
            out.print(
                f"  {row.policy:<11} {row.steps:>3} steps  {row.success_rate:6.1%} "
                f"[{row.ci_low:.0%}, {row.ci_high:.0%}]  duplicate effects {row.duplicate_effects}"
            )
        out.print(f"  {s.lab_note}" + (f": {s.lab_plot}" if s.lab_plot else ""))
    out.print(Text("\ninspect it", "bold"))
    for command in s.inspect:
        out.print(f"  {command}")
    out.print(f"  worker logs: {', '.join(s.logs)}")
