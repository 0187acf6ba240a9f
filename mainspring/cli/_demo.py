"""``mainspring demo``: a run survives the SIGKILL of its worker, and no effect happens twice.

The demo is an operator of real processes: it submits one run of the workflow in
``_demo_app.py``, starts ``mainspring worker`` as a subprocess, kills it with
SIGKILL mid-run, starts a fresh worker that takes the run over when the dead
worker's lease expires, and then checks the journal and the effect ledger (the
"CRM") instead of trusting the workers. Every claim in its summary is one of
those checks.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.text import Text

import mainspring

from ..storage import RunRecord, StepRecord
from ..testing import EffectLedger

__all__ = ["demo"]

APP_SPEC = "mainspring.cli._demo_app:app"
LEDGER_ENV = "MAINSPRING_DEMO_LEDGER"  # read by _demo_app
LEASE_S = 2.0
RUN_KEY = "demo-migrate-customers"
_POLL_S = 0.005  # the window between a CRM call and the step's end is ~50 ms
_PHASE_TIMEOUT_S = 90.0
_STOP_TIMEOUT_S = 30.0


class DemoError(Exception):
    """The demo could not do what it shows (a worker died, the run ended early...)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Effect:
    """What the CRM saw for one step's idempotency key."""

    step: int
    key: str
    calls: int
    applied: int


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
class Summary:
    """The demo's findings; ``--json`` prints exactly this."""

    ok: bool
    dir: str
    database_url: str
    ledger_path: str
    run_id: str
    key: str
    status: str
    result: Any
    error: Any
    steps: int
    steps_completed: int
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
    crm_calls: int
    crm_keys: int
    repeated_calls: int
    duplicates: int
    effects: list[Effect]
    at_most_once: Effect
    worker_exit_code: int
    checks: list[Check]
    inspect: list[str]
    logs: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Kill:
    pid: int
    seq: int  # the step in flight
    name: str
    epoch: int
    lease_until: float
    at: float  # time.monotonic()
    status: str  # the run's status when it was killed
    rows: dict[int, StepRecord]  # the journal as the dead worker left it
    calls: dict[int, int]  # CRM calls per step so far


def demo(
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            metavar="PATH",
            file_okay=False,
            help="Directory for the database, ledger and worker logs (default: a new temp dir).",
        ),
    ] = None,
    steps: Annotated[
        int, typer.Option(min=3, help="Steps of the workflow: an export, N-2 upserts, an email.")
    ] = 30,
    kill_at: Annotated[
        float,
        typer.Option(
            metavar="FRACTION", help="Kill the first worker this far into the run (0 < f < 1)."
        ),
    ] = 0.4,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Approve without asking (nothing asks yet).")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print only the summary, as JSON.")
    ] = False,
) -> None:
    """Crash a worker mid-run with SIGKILL and watch the run finish with every effect once.

    Needs no API key and no network: SQLite in a directory of its own, real worker
    processes, and a ledger that counts every call to the outside world.
    """
    del yes  # the demo asks for no approval yet; the flag already works for scripts
    if not 0.0 < kill_at < 1.0:
        raise typer.BadParameter(
            f"must be between 0 and 1, got {kill_at!r}", param_hint="--kill-at"
        )
    # soft_wrap: long lines are left to the terminal, and stay whole when piped.
    console = Console(quiet=as_json, highlight=False, markup=False, emoji=False, soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 160  # piped: room for the progress bar beside its note
    try:
        folder = _prepare(directory)
    except DemoError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    session = _Demo(folder, steps=steps, kill_at=kill_at, console=console)
    try:
        summary = session.run()
    except KeyboardInterrupt:
        typer.echo(f"\ninterrupted; workers stopped. Files are in {folder}", err=True)
        raise typer.Exit(130) from None
    except DemoError as exc:
        if as_json:
            _print_json({"ok": False, "error": str(exc), "dir": str(folder)})
        typer.echo(f"error: {exc}\nfiles (worker logs included) are in {folder}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        _print_json(asdict(summary))
    else:
        _render(console, summary)
    if not summary.ok:
        failed = ", ".join(c.name for c in summary.checks if not c.ok)
        typer.echo(f"error: demo check(s) failed: {failed}", err=True)
        raise typer.Exit(1)


# -- the session ---------------------------------------------------------------------


def _prepare(directory: Path | None) -> Path:
    if directory is None:
        return Path(tempfile.mkdtemp(prefix="mainspring-demo-")).resolve()
    folder = directory.expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    leftovers = [n for n in ("mainspring.db", "crm-ledger.db") if (folder / n).exists()]
    if leftovers:
        raise DemoError(
            f"{folder} already holds {', '.join(leftovers)} from an earlier demo; the demo "
            "starts from a fresh database: pass another --dir or remove them"
        )
    return folder


class _Demo:
    app: mainspring.App
    crm: EffectLedger

    def __init__(self, folder: Path, *, steps: int, kill_at: float, console: Console) -> None:
        self.folder = folder
        self.steps = steps
        self.records = steps - 2
        # The kill lands in an upsert (seq 1 .. steps-2): an effect with a key is in flight.
        self.target = min(max(round(kill_at * steps), 1), steps - 2)
        self.console = console
        self.url = f"sqlite:///{folder / 'mainspring.db'}"
        self.ledger_path = folder / "crm-ledger.db"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.run_id = ""

    def key(self, seq: int) -> str:
        return f"{self.run_id}:0:{seq}"

    def run(self) -> Summary:
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            module = self._load_app()
            self.app, self.crm = module.app, module.crm
            try:
                return self._play(module)
            finally:
                self._stop_all()
                self.app.close()
                self.crm.close()
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _load_app(self) -> ModuleType:
        # The workers read these; the App and ledger of this process must match theirs.
        os.environ["MAINSPRING_DATABASE_URL"] = self.url
        os.environ[LEDGER_ENV] = str(self.ledger_path)
        module = importlib.import_module("mainspring.cli._demo_app")
        if module.app.url != self.url:
            raise DemoError(f"{APP_SPEC} was already loaded with {module.app.url!r}")
        return module

    def _play(self, module: ModuleType) -> Summary:
        out = self.console
        out.print(Text("mainspring demo: a durable run survives the SIGKILL of its worker", "bold"))
        facts = [
            (
                "workflow",
                f"{module.migrate_customers.name}, {self.steps} steps ({module.__file__})",
            ),
            (
                "",
                f"export {self.records} customer records → upsert each into a CRM that "
                "deduplicates by idempotency key → send one email (at_most_once)",
            ),
            ("directory", str(self.folder)),
            ("database", self.url),
            ("CRM ledger", f"{self.ledger_path} (counts every call and every effect, by key)"),
        ]
        _facts(out, facts)
        handle = self.app.submit(module.migrate_customers, self.records, key=RUN_KEY)
        self.run_id = handle.run_id
        out.print(f"\nsubmitted run {self.run_id} (key {RUN_KEY!r})")
        first = self._start_worker(1)
        kill = self._until_kill(first)
        second = self._start_worker(2)
        takeover_s = self._until_finished(second, kill)
        out.print(f"stopping worker 2 (pid {second.pid}) with SIGTERM (graceful shutdown)")
        exit_code = self._terminate(second)
        out.print(f"worker 2 exited with code {exit_code}")
        return self._summary(kill, takeover_s, second, exit_code)

    # -- processes ---------------------------------------------------------------------

    def _start_worker(self, n: int) -> subprocess.Popen[bytes]:
        args = ["worker", APP_SPEC, "--lease-s", f"{LEASE_S:g}"]
        root = str(Path(mainspring.__file__).resolve().parent.parent)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
        }
        with open(self.folder / f"worker-{n}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mainspring", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.procs.append(proc)
        command = " ".join(shlex.quote(a) for a in ("mainspring", *args))
        self.console.print(f"started worker {n}: pid {proc.pid} ({command})")
        return proc

    def _alive(self, proc: subprocess.Popen[bytes], n: int) -> None:
        code = proc.poll()
        if code is not None:
            log = (self.folder / f"worker-{n}.log").read_text(errors="replace")
            tail = "\n".join(log.strip().splitlines()[-15:])
            raise DemoError(f"worker {n} (pid {proc.pid}) exited with code {code}:\n{tail}")

    def _terminate(self, proc: subprocess.Popen[bytes]) -> int:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise DemoError(
                f"worker pid {proc.pid} did not stop within {_STOP_TIMEOUT_S:g}s of SIGTERM; "
                "killed it"
            ) from None

    def _stop_all(self) -> None:
        """Leave no worker behind, whatever happened."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # -- watching ----------------------------------------------------------------------

    def _state(self) -> tuple[RunRecord, dict[int, StepRecord]]:
        record = self.app.get_run(self.run_id)
        return record, {r.seq: r for r in self.app.store.load_steps(self.run_id, 0)}

    @contextlib.contextmanager
    def _progress(self, label: str, done: int) -> Iterator[tuple[Progress, TaskID]]:
        progress = Progress(
            TextColumn("  {task.description}"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TextColumn("steps  {task.fields[note]}"),
            console=self.console,
        )
        with progress:
            yield progress, progress.add_task(label, total=self.steps, completed=done, note="")

    def _until_kill(self, proc: subprocess.Popen[bytes]) -> _Kill:
        deadline = time.monotonic() + _PHASE_TIMEOUT_S
        with self._progress("worker 1", 0) as (progress, task):
            while True:
                self._alive(proc, 1)
                record, rows = self._state()
                done = sum(r.status == "completed" for r in rows.values())
                live = next((r for r in rows.values() if r.status != "completed"), None)
                if record.status == "queued":
                    note = "queued: worker 1 is starting"
                elif live is None:
                    note = record.status
                else:
                    note = f"{record.status} · step {live.seq} {live.name}"
                progress.update(task, completed=done, note=note)
                if record.finished:
                    raise DemoError(
                        f"the run ended {record.status} before the kill at step {self.target}"
                    )
                if live is not None and self._kill_now(live):
                    proc.kill()  # SIGKILL: no handler, no flush, no goodbye
                    proc.wait()
                    at = time.monotonic()
                    break
                if time.monotonic() > deadline:
                    raise DemoError(f"no kill after {_PHASE_TIMEOUT_S:g}s: the run is stuck")
                time.sleep(_POLL_S if done >= self.target - 1 else 0.05)
            # The worker is dead: this is exactly the journal it left.
            record, rows = self._state()
            done = sum(r.status == "completed" for r in rows.values())
            progress.update(task, completed=done, note="killed")
        unfinished = [r for r in rows.values() if r.status != "completed"]
        seq = unfinished[0].seq if unfinished else len(rows)
        kill = _Kill(
            pid=proc.pid,
            seq=seq,
            name=unfinished[0].name if unfinished else "-",
            epoch=record.epoch,
            lease_until=record.lease_until or 0.0,
            at=at,
            status=record.status,
            rows=rows,
            calls={s: self.crm.calls(self.key(s)) for s in range(1, self.steps)},
        )
        if kill.calls.get(seq):
            how = "the CRM had applied its write; the journal had not yet recorded the step's end"
        else:
            how = "before its CRM write"
        self.console.print(
            Text(
                f"killed worker pid {kill.pid} with SIGKILL at step {seq} ({kill.name}, "
                f"{done} of {self.steps} steps completed): {how}",
                "bold red",
            )
        )
        left = max(0.0, kill.lease_until - time.time())
        self.console.print(
            f"the run stays leased to the dead worker for {left:.1f}s more (a {LEASE_S:g}s "
            "lease it can no longer renew); no other worker may touch it until then"
        )
        return kill

    def _kill_now(self, live: StepRecord) -> bool:
        if live.kind != "step" or not 1 <= live.seq <= self.steps - 2 or live.seq < self.target:
            return False
        # Best: the CRM has applied this step's write and the journal does not know yet.
        # If the poll missed that window, kill in the next upsert anyway.
        return live.seq > self.target or self.crm.calls(self.key(live.seq)) > 0

    def _until_finished(self, proc: subprocess.Popen[bytes], kill: _Kill) -> float:
        deadline = time.monotonic() + _PHASE_TIMEOUT_S
        takeover_s: float | None = None
        done = sum(r.status == "completed" for r in kill.rows.values())
        with self._progress("worker 2", done) as (progress, task):
            while True:
                self._alive(proc, 2)
                record, rows = self._state()
                done = sum(r.status == "completed" for r in rows.values())
                if takeover_s is None and record.epoch > kill.epoch:
                    takeover_s = time.monotonic() - kill.at
                    progress.console.print(
                        f"worker 2 (pid {proc.pid}) took over the run {takeover_s:.1f}s after "
                        f"the kill (epoch {kill.epoch} → {record.epoch}) and replays it: "
                        f"{_span(0, kill.seq - 1)} return their journaled results, step "
                        f"{kill.seq} runs again under the same idempotency key"
                    )
                if takeover_s is None:
                    left = kill.lease_until - time.time()
                    note = (
                        f"dead worker's lease ends in {left:.1f}s"
                        if left > 0
                        else "lease ended; worker 2 is claiming"
                    )
                else:
                    live = next((r for r in rows.values() if r.status != "completed"), None)
                    note = (
                        record.status
                        if live is None
                        else f"{record.status} · step {live.seq} {live.name}"
                    )
                progress.update(task, completed=done, note=note)
                if record.finished:
                    break
                if time.monotonic() > deadline:
                    raise DemoError(f"the run did not finish within {_PHASE_TIMEOUT_S:g}s")
                time.sleep(0.05)
        if takeover_s is None:
            raise DemoError("the run finished but no takeover by worker 2 was seen")
        return takeover_s

    # -- the verdict -------------------------------------------------------------------

    def _effect(self, seq: int) -> Effect:
        key = self.key(seq)
        return Effect(step=seq, key=key, calls=self.crm.calls(key), applied=self.crm.applied(key))

    def _summary(
        self, kill: _Kill, takeover_s: float, second: subprocess.Popen[bytes], exit_code: int
    ) -> Summary:
        """Check the journal and the ledger, not the workers' word."""
        record, rows = self._state()
        report = self.crm.report()
        effects = [self._effect(s) for s in range(1, self.steps)]
        upserts, email = effects[:-1], effects[-1]
        before = [s for s, r in kill.rows.items() if r.status == "completed"]
        # Rows the dead worker left completed must be untouched by the new one (same epoch
        # and attempt), and their CRM calls must not have grown: replayed, not re-executed.
        untouched = [
            s
            for s in before
            if s in rows
            and (rows[s].epoch, rows[s].attempt) == (kill.rows[s].epoch, kill.rows[s].attempt)
            and (s == 0 or self.crm.calls(self.key(s)) == kill.calls[s])
        ]
        interrupted = [
            Rerun(
                step=r.seq,
                name=r.name,
                key=self.key(r.seq),
                attempt_killed=r.attempt,
                attempt_final=rows[r.seq].attempt if r.seq in rows else 0,
                status=rows[r.seq].status if r.seq in rows else "missing",
                calls=self.crm.calls(self.key(r.seq)),
                applied=self.crm.applied(self.key(r.seq)),
            )
            for r in kill.rows.values()
            if r.status != "completed"
        ]
        completed = sum(r.status == "completed" for r in rows.values())
        checks = [
            Check(
                name="the run succeeded",
                ok=record.status == "succeeded",
                detail=f"status {record.status}",
            ),
            Check(
                name="the kill landed mid-run",
                ok=0 < kill.seq < self.steps - 1 and kill.status == "running",
                detail=f"step {kill.seq} of {self.steps} was in flight, run status {kill.status}",
            ),
            Check(
                name="a fresh worker took the run over",
                ok=record.epoch > kill.epoch,
                detail=f"epoch {kill.epoch} → {record.epoch}",
            ),
            Check(
                name="the journal is complete",
                ok=sorted(rows) == list(range(self.steps)) and completed == self.steps,
                detail=f"{completed} of {self.steps} steps completed",
            ),
            Check(
                name="steps completed before the crash were not executed again",
                ok=len(untouched) == len(before),
                detail=f"{len(untouched)} of {len(before)} journal rows untouched, "
                "no new CRM calls for them",
            ),
            Check(
                name="the interrupted step ran again under the same idempotency key",
                ok=bool(interrupted)
                and all(
                    e.status == "completed"
                    and e.attempt_final > e.attempt_killed
                    and e.applied == 1
                    for e in interrupted
                ),
                detail="; ".join(
                    f"step {e.step}: attempt {e.attempt_killed} → {e.attempt_final}, "
                    f"{_plural(e.calls, 'CRM call')} with key {e.key}, "
                    f"{_plural(e.applied, 'effect')}"
                    for e in interrupted
                )
                or "no step was in flight",
            ),
            Check(
                name="every CRM effect happened exactly once per key",
                ok=not report.duplicate_effects
                and report.keys == self.steps - 1
                and all(e.applied == 1 for e in upserts),
                detail=f"{report.keys} keys, {report.calls} calls, "
                f"{len(report.duplicate_effects)} duplicate effects",
            ),
            Check(
                name="the at_most_once email ran at most once",
                ok=email.calls <= 1 and email.applied <= 1,
                detail=_plural(email.calls, "call"),
            ),
            Check(
                name="worker 2 stopped gracefully on SIGTERM",
                ok=exit_code == 0,
                detail=f"exit code {exit_code}",
            ),
        ]
        url = shlex.quote(self.url)
        return Summary(
            ok=all(c.ok for c in checks),
            dir=str(self.folder),
            database_url=self.url,
            ledger_path=str(self.ledger_path),
            run_id=self.run_id,
            key=RUN_KEY,
            status=record.status,
            result=json.loads(record.output) if record.output else None,
            error=json.loads(record.error) if record.error else None,
            steps=self.steps,
            steps_completed=completed,
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
            crm_calls=report.calls,
            crm_keys=report.keys,
            repeated_calls=len(report.duplicate_calls),
            duplicates=len(report.duplicate_effects),
            effects=effects,
            at_most_once=email,
            worker_exit_code=exit_code,
            checks=checks,
            inspect=[
                f"mainspring show {self.run_id} --db {url}",
                f"mainspring runs --db {url}",
            ],
            logs=[str(self.folder / f"worker-{n}.log") for n in (1, 2)],
        )


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM to the demo: stop the workers on the way out


# -- rendering ------------------------------------------------------------------------


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _span(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}–{last}"


def _facts(out: Console, facts: list[tuple[str, str]]) -> None:
    for label, value in facts:
        out.print(Text.assemble("  ", (f"{label:<11}", "bold"), value))


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def _render(out: Console, s: Summary) -> None:
    email = s.at_most_once
    if s.effect_applied_before_kill:
        moment = "after the CRM applied its write, before the journal recorded the step's end"
    else:
        moment = "before its CRM write"
    reruns = "; ".join(
        f"step {e.step} ran again as attempt {e.attempt_final} with key {e.key}: "
        f"{_plural(e.calls, 'CRM call')}, {_plural(e.applied, 'effect')}"
        for e in s.interrupted
    )
    out.print(Text("\nsummary", "bold"))
    _facts(
        out,
        [
            ("run", f"{s.run_id} {s.status}"),
            ("result", json.dumps(s.result if s.status == "succeeded" else s.error)),
            (
                "journal",
                f"{s.steps_completed} of {s.steps} steps completed, "
                f"{s.steps_completed_before_kill} of them before the crash",
            ),
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
                "CRM ledger",
                f"{_plural(s.crm_calls, 'call')} for {_plural(s.crm_keys, 'key')}: "
                f"{_plural(s.repeated_calls, 'key')} called more than once, "
                f"{_plural(s.duplicates, 'duplicate effect')}",
            ),
            (
                "email",
                f"at_most_once step {email.step}: {_plural(email.calls, 'call')}, "
                f"{_plural(email.applied, 'email')} sent",
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
    out.print(Text("\ninspect it", "bold"))
    for command in s.inspect:
        out.print(f"  {command}")
    out.print(f"  worker logs: {', '.join(s.logs)}")
