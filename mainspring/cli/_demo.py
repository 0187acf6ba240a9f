"""``mainspring demo``: the migration example, crashed mid-import, finished exactly once.

The demo is an operator of real processes: it submits one run of the staged migration in
:mod:`mainspring.examples.migration` (export, validate, transform with a scripted model, a
stage gate, import, reconcile), starts ``mainspring worker`` as a subprocess, answers the stage gate
(a prompt, or ``--yes``), kills the worker with SIGKILL mid-import, starts a fresh worker
that takes the run over when the dead worker's lease expires, and then checks the journal,
the target's rows and its effect ledger instead of trusting the workers. Every claim in
its summary is one of those checks. It ends with a short lab comparison (naive loop
against mainspring) from :mod:`mainspring.lab`. This module drives the processes; the
checks and the printed summary are in ``_demo_report``.
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from types import FrameType, ModuleType
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

import mainspring

from ..storage import RunRecord, StepRecord
from ..testing import EffectLedger
from ._demo_report import (
    APP_MODULE,
    APP_SPEC,
    IMPORT,
    LEASE_S,
    RUN_KEY,
    TARGET_ENV,
    DemoError,
    Kill,
    Seen,
    Summary,
    add_lab,
    facts,
    plural,
    print_json,
    progress_bar,
    render,
    summarize,
)

__all__ = ["demo"]

_POLL_S = 0.005  # the window between a target write and the step's end is ~50 ms
_PHASE_TIMEOUT_S = 90.0
_STOP_TIMEOUT_S = 30.0


def demo(
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            metavar="PATH",
            file_okay=False,
            help="Directory for the database, target, worker logs and lab plot "
            "(default: a new temp dir).",
        ),
    ] = None,
    customers: Annotated[
        int, typer.Option(min=5, max=500, help="Legacy customers to export and migrate.")
    ] = 40,
    kill_at: Annotated[
        float,
        typer.Option(
            metavar="FRACTION", help="Kill the first worker this far into the import (0 < f < 1)."
        ),
    ] = 0.4,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Approve the stage gate without asking.")
    ] = False,
    lab: Annotated[
        bool, typer.Option(help="End with the lab comparison (naive loop against mainspring).")
    ] = True,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print only the summary, as JSON (implies --yes).")
    ] = False,
) -> None:
    """Migrate customers through a stage gate, SIGKILL the worker mid-import, and check
    that the run finished with every write once.

    Needs no API key and no network: SQLite in a directory of its own, real worker
    processes, a scripted model with injected faults, and a target that counts every call.
    """
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
    ask = not (yes or as_json)
    if ask and not sys.stdin.isatty():
        console.print("stdin is not a terminal: the stage gate will be approved automatically")
        ask = False
    session = _Demo(folder, customers=customers, kill_at=kill_at, ask=ask, console=console)
    try:
        summary = session.run(with_lab=lab)
    except KeyboardInterrupt:
        typer.echo(f"\ninterrupted; workers stopped. Files are in {folder}", err=True)
        raise typer.Exit(130) from None
    except DemoError as exc:
        if as_json:
            print_json({"ok": False, "error": str(exc), "dir": str(folder)})
        typer.echo(f"error: {exc}\nfiles (worker logs included) are in {folder}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        print_json(asdict(summary))
    else:
        render(console, summary)
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
    leftovers = [n for n in ("mainspring.db", "target.db") if (folder / n).exists()]
    if leftovers:
        raise DemoError(
            f"{folder} already holds {', '.join(leftovers)} from an earlier demo; the demo "
            "starts from a fresh database: pass another --dir or remove them"
        )
    return folder


class _Demo:
    app: mainspring.App
    ledger: EffectLedger

    def __init__(
        self, folder: Path, *, customers: int, kill_at: float, ask: bool, console: Console
    ) -> None:
        self.folder = folder
        self.customers = customers
        self.kill_at = kill_at
        self.ask = ask
        self.console = console
        self.url = f"sqlite:///{folder / 'mainspring.db'}"
        self.target_path = folder / "target.db"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.run_id = ""

    def key(self, seq: int) -> str:
        return f"{self.run_id}:0:{seq}"

    def run(self, *, with_lab: bool) -> Summary:
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            module = self._load_app()
            self.app, self.ledger = module.app, module.target.ledger
            try:
                summary = self._play(module)
            finally:
                self._stop_all()
                self.app.close()
                self.ledger.close()
            if with_lab:
                summary = add_lab(summary, self.folder, self.console)
            return summary
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _load_app(self) -> ModuleType:
        # The workers read these; the App and target of this process must match theirs.
        os.environ["MAINSPRING_DATABASE_URL"] = self.url
        os.environ[TARGET_ENV] = str(self.target_path)
        module = importlib.import_module(APP_MODULE)
        if module.app.url != self.url:
            raise DemoError(f"{APP_SPEC} was already loaded with {module.app.url!r}")
        return module

    def _play(self, module: ModuleType) -> Summary:
        out = self.console
        out.print(
            Text("mainspring demo: a staged migration survives the SIGKILL of its worker", "bold")
        )
        facts(
            out,
            [
                (
                    "workflow",
                    f"{module.migrate_customers.name} ({Path(str(module.__file__)).parent})",
                ),
                (
                    "",
                    f"export {self.customers} legacy customers → validate → transform (a scripted "
                    "model, with injected faults) → stage gate → import each into a target that "
                    "deduplicates by idempotency key → reconcile (undo the import if it fails)",
                ),
                ("directory", str(self.folder)),
                ("database", self.url),
                ("target", f"{self.target_path} (rows, and a ledger of every call and effect)"),
            ],
        )
        handle = self.app.submit(module.migrate_customers, self.customers, key=RUN_KEY)
        self.run_id = handle.run_id
        out.print(f"\nsubmitted run {self.run_id} (key {RUN_KEY!r})")
        first = self._start_worker(1)
        preview, gate = self._until_gate(first)
        self._answer_gate(preview)
        kill = self._until_kill(first, preview["import"])
        second = self._start_worker(2)
        takeover_s = self._until_finished(second, kill)
        out.print(f"stopping worker 2 (pid {second.pid}) with SIGTERM (graceful shutdown)")
        exit_code = self._terminate(second)
        out.print(f"worker 2 exited with code {exit_code}")
        record, rows = self._state()
        seen = Seen(
            record=record,
            rows=rows,
            ledger=self.ledger,
            run_id=self.run_id,
            folder=self.folder,
            url=self.url,
            target_path=self.target_path,
            customers=self.customers,
        )
        return summarize(seen, kill, takeover_s, second, exit_code, preview, gate)

    # -- processes ---------------------------------------------------------------------

    def _start_worker(self, n: int) -> subprocess.Popen[bytes]:
        args = ["worker", APP_SPEC, "--lease-s", f"{LEASE_S:g}"]
        # The app ships in the package; the workers must import this very mainspring
        # (a source checkout run as `python -m mainspring` is on no path by default).
        home = str(Path(mainspring.__file__).resolve().parent.parent)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (home, os.environ.get("PYTHONPATH")) if p),
        }
        with open(self.folder / f"worker-{n}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mainspring", *args],
                env=env,
                cwd=self.folder,
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

    def _note(self, record: RunRecord, rows: dict[int, StepRecord]) -> str:
        live = next((r for r in rows.values() if r.status != "completed"), None)
        if record.status == "queued":
            return "queued: the worker is starting"
        if live is None:
            return record.status
        retry = f" (attempt {live.attempt})" if live.attempt > 1 else ""
        return f"{record.status} · step {live.seq} {live.name}{retry}"

    def _until_gate(self, proc: subprocess.Popen[bytes]) -> tuple[dict[str, Any], str]:
        deadline = time.monotonic() + _PHASE_TIMEOUT_S
        with progress_bar(self.console, "worker 1", 4, 0) as (progress, task):
            while True:
                self._alive(proc, 1)
                record, rows = self._state()
                done = sum(r.status == "completed" for r in rows.values())
                progress.update(
                    task, total=max(4, len(rows)), completed=done, note=self._note(record, rows)
                )
                if record.finished:
                    raise DemoError(f"the run ended {record.status} before its stage gate")
                requests = self.app.requests(self.run_id)
                if record.status == "waiting" and requests:
                    progress.update(task, note="waiting at the stage gate 'import'")
                    break
                if time.monotonic() > deadline:
                    raise DemoError(f"no stage gate after {_PHASE_TIMEOUT_S:g}s: the run is stuck")
                time.sleep(0.05)
        [request] = requests
        retried = [f"{r.seq}:{r.name}" for r in rows.values() if r.attempt > 1]
        self.console.print(
            f"export, validate and transform done ({plural(len(retried), 'step')} retried "
            f"after injected model faults); the run left its worker and waits at {request.id}"
        )
        return dict(request.preview), request.id

    def _answer_gate(self, preview: dict[str, Any]) -> None:
        out = self.console
        out.print(Text("\nstage gate: import", "bold"))
        facts(
            out,
            [
                ("import", f"{preview['import']} customers, tiers {json.dumps(preview['tiers'])}"),
                (
                    "rejected",
                    f"{preview['rejected']} rows, e.g. "
                    + "; ".join(f"{r['id']}: {r['reason']}" for r in preview["rejections"][:2]),
                ),
                ("sample", json.dumps(preview["sample"][0]) if preview["sample"] else "-"),
            ],
        )
        approve, reason = True, ""
        if self.ask:
            approve = typer.confirm("Approve the import?", default=True)
            if not approve:
                reason = typer.prompt("Reason", default="rejected in the demo")
        if approve:
            self.app.answer(self.run_id, "approval:import", decision="approve", by="demo")
            how = "you approved" if self.ask else "approved automatically (--yes)"
            out.print(f"{how}: the run resumes on worker 1")
        else:
            self.app.answer(
                self.run_id, "approval:import", decision="reject", reason=reason, by="demo"
            )
            raise DemoError(
                f"you rejected the import ({reason}): the run failed at its gate; "
                "nothing was written"
            )

    def _until_kill(self, proc: subprocess.Popen[bytes], imports: int) -> Kill:
        deadline = time.monotonic() + _PHASE_TIMEOUT_S
        target: int | None = None
        with progress_bar(self.console, "worker 1", imports, 0) as (progress, task):
            while True:
                self._alive(proc, 1)
                record, rows = self._state()
                seqs = sorted(s for s, r in rows.items() if r.name == IMPORT)
                if seqs and target is None:
                    target = seqs[0] + min(max(round(self.kill_at * imports), 0), imports - 2)
                done = sum(rows[s].status == "completed" for s in seqs)
                progress.update(task, completed=done, note=self._note(record, rows))
                if record.finished:
                    raise DemoError(f"the run ended {record.status} before the kill")
                live = next((r for r in rows.values() if r.status != "completed"), None)
                if target is not None and live is not None and self._kill_now(live, target):
                    proc.kill()  # SIGKILL: no handler, no flush, no goodbye
                    proc.wait()
                    at = time.monotonic()
                    break
                if time.monotonic() > deadline:
                    raise DemoError(f"no kill after {_PHASE_TIMEOUT_S:g}s: the run is stuck")
                time.sleep(_POLL_S if target is not None and done >= target - seqs[0] - 1 else 0.05)
            record, rows = self._state()  # the journal exactly as the dead worker left it
            progress.update(
                task,
                completed=sum(r.status == "completed" and r.name == IMPORT for r in rows.values()),
                note="killed",
            )
        unfinished = [r for r in rows.values() if r.status != "completed"]
        seq = unfinished[0].seq if unfinished else len(rows)
        kill = Kill(
            pid=proc.pid,
            seq=seq,
            name=unfinished[0].name if unfinished else "-",
            epoch=record.epoch,
            lease_until=record.lease_until or 0.0,
            at=at,
            status=record.status,
            rows=rows,
            calls={s: self.ledger.calls(self.key(s)) for s, r in rows.items() if r.name == IMPORT},
        )
        how = (
            "the target had applied its write; the journal had not yet recorded the step's end"
            if kill.calls.get(seq)
            else "before its target write"
        )
        self.console.print(
            Text(
                f"killed worker pid {kill.pid} with SIGKILL at step {seq} ({kill.name}): {how}",
                "bold red",
            )
        )
        left = max(0.0, kill.lease_until - time.time())
        self.console.print(
            f"the run stays leased to the dead worker for {left:.1f}s more (a {LEASE_S:g}s "
            "lease it can no longer renew); no other worker may touch it until then"
        )
        return kill

    def _kill_now(self, live: StepRecord, target: int) -> bool:
        if live.name != IMPORT or live.seq < target:
            return False
        # Best: the target has applied this step's write and the journal does not know yet.
        # If the poll missed that window, kill in the next import anyway.
        return live.seq > target or self.ledger.calls(self.key(live.seq)) > 0

    def _until_finished(self, proc: subprocess.Popen[bytes], kill: Kill) -> float:
        deadline = time.monotonic() + _PHASE_TIMEOUT_S
        takeover_s: float | None = None
        done = sum(r.status == "completed" for r in kill.rows.values())
        with progress_bar(self.console, "worker 2", len(kill.rows) + 1, done) as (progress, task):
            while True:
                self._alive(proc, 2)
                record, rows = self._state()
                done = sum(r.status == "completed" for r in rows.values())
                if takeover_s is None and record.epoch > kill.epoch:
                    takeover_s = time.monotonic() - kill.at
                    progress.console.print(
                        f"worker 2 (pid {proc.pid}) took over the run {takeover_s:.1f}s after "
                        f"the kill (epoch {kill.epoch} → {record.epoch}) and replays it: "
                        f"steps 0–{kill.seq - 1} return their journaled results, step "
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
                    note = self._note(record, rows)
                progress.update(
                    task, total=max(len(rows), len(kill.rows) + 1), completed=done, note=note
                )
                if record.finished:
                    break
                if time.monotonic() > deadline:
                    raise DemoError(f"the run did not finish within {_PHASE_TIMEOUT_S:g}s")
                time.sleep(0.05)
        if takeover_s is None:
            raise DemoError("the run finished but no takeover by worker 2 was seen")
        return takeover_s

    # -- the verdict -------------------------------------------------------------------


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM to the demo: stop the workers on the way out
