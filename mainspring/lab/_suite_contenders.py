"""The horizon suite's contenders: mainspring's worker pool, or a peer's runner script.

A contender plays every run of a cell against the cell's world and model server. The
harness drives it and restarts what the kill points SIGKILLed, answers approvals as a
scripted reviewer (mainspring's human-in-the-loop requests, and
:meth:`~mainspring.lab.SuiteFaults.pending` for contenders with none), and says how
each run ended: ``None`` when it ended well, else why not. The world's audit of the
end state is the harness's (:func:`~mainspring.lab.run_suite`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .. import App, ConfigError, MainspringError
from ._suite_app import build_app
from ._suite_faults import HARNESS_PID_ENV
from ._tasks import SuiteWorld

__all__ = ["AppContender", "Contender", "RunnerContender", "contender_name"]

_APP_SPEC = "mainspring.lab._suite_app:app"


@dataclass(frozen=True, slots=True)
class RunnerContender:
    """A contender that runs one process per run: a peer's runner script.

    The harness runs ``[*argv_prefix, "--task", TASK, "--label", LABEL, "--world",
    WORLD, "--state", DIR, "--max-steps", N]`` with ``OPENAI_BASE_URL``,
    ``OPENAI_API_KEY`` and ``MAINSPRING_SUITE_CLIENT_TIMEOUT_S`` set, at most
    ``workers`` at once. A SIGKILLed runner is started again with the same command (it
    resumes as its framework does); the run fails on any other non-zero exit, on more
    than ``max_restarts`` restarts, or when the cell's time is up.

    Args:
        name: the contender's name in the report (``"openai-loop"``, ``"langgraph"``).
        argv_prefix: the command before the suite's arguments
            (``("/venv/bin/python", "bench/horizon/langgraph_runner.py")``).
        max_restarts: restarts allowed per run.
    """

    name: str
    argv_prefix: tuple[str, ...]
    max_restarts: int = 500

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv_prefix", tuple(self.argv_prefix))
        if not self.name or not self.argv_prefix:
            raise ConfigError(
                f"RunnerContender needs a name and a command, got {self.name!r} and "
                f"{self.argv_prefix!r}"
            )
        if self.name == "mainspring":
            raise ConfigError("RunnerContender: 'mainspring' names the built-in contender")


@dataclass(frozen=True, slots=True)
class AppContender:
    """A contender that is another App on mainspring: its own workflows under the
    task names (an agent of another framework made durable, say), run by a pool of
    ``mainspring worker APP`` processes exactly as the built-in contender's.

    The harness submits each run as it does for ``"mainspring"`` (the task's workflow,
    the task text as the one argument) and answers its requests; the App's workers
    see the cell's environment (``MAINSPRING_SUITE_WORLD``, the provider, ...) and
    keep the kill points themselves.

    Args:
        name: the contender's name in the report.
        app: ``MODULE:ATTR`` of the App its workers run.
        python: the interpreter of its workers (a venv with the framework).
        pythonpath: directories its workers import from (the module's).
    """

    name: str
    app: str
    python: str = sys.executable
    pythonpath: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "pythonpath", tuple(self.pythonpath))
        if not self.name or ":" not in self.app or self.name == "mainspring":
            raise ConfigError(
                f"AppContender needs a name other than 'mainspring' and an App as "
                f"MODULE:ATTR, got {self.name!r} and {self.app!r}"
            )


Contender = Literal["mainspring"] | RunnerContender | AppContender
"""``"mainspring"`` (its worker pool), a :class:`RunnerContender` or an
:class:`AppContender`."""


def contender_name(contender: Contender) -> str:
    """The contender's name in the report.

    Raises:
        ConfigError: neither ``"mainspring"`` nor a :class:`RunnerContender`.
    """
    if isinstance(contender, RunnerContender | AppContender):
        return contender.name
    if contender == "mainspring":
        return "mainspring"
    raise ConfigError(
        f"unknown contender {contender!r}: 'mainspring' or a RunnerContender(name, argv_prefix)"
    )


@dataclass(slots=True, kw_only=True)
class CellDrive:
    """What a contender needs to play a cell's runs."""

    task: str
    labels: list[str]
    world: SuiteWorld
    env: dict[str, str]
    where: Path
    workers: int
    timeout_s: float
    max_steps: int
    kill_every: int = 0  # external SIGKILLs: one every N paid model calls (0: none)
    external_kills: int = 0

    def review(self) -> None:
        """The scripted reviewer's answers to the approval requests of the world."""
        for label, key, _tool, _arguments in self.world.faults.pending():
            self.world.faults.answer(label, key, True)

    def external_kill(self, procs: Sequence[subprocess.Popen[bytes]], next_kill: int) -> int:
        """SIGKILL a process when the paid calls reach ``next_kill``; the next mark."""
        if not self.kill_every:
            return next_kill
        calls, _ = self.world.model_calls()
        if calls < next_kill:
            return next_kill
        alive = [p for p in procs if p.poll() is None]
        if alive:
            victim = alive[self.external_kills % len(alive)]
            victim.send_signal(signal.SIGKILL)
            victim.wait(30)
            self.external_kills += 1
        return calls + self.kill_every


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def _tail(log: Path, lines: int = 3) -> str:
    """Why a runner ended, from its log: a traceback's exception line (the frames are in
    the log), else the last ``lines`` lines."""
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    starts = [i for i, line in enumerate(text) if line.startswith("Traceback (most recent")]
    if starts:
        raised = [line for line in text[starts[-1] + 1 :] if line and not line[0].isspace()]
        if raised:
            return f"{' | '.join(raised)} (traceback in {log})"
    return " | ".join(text[-lines:])


def drive_mainspring(
    cell: CellDrive,
    *,
    model_attempts: int | None,
    kill_before_commit: bool,
    other: AppContender | None = None,
) -> dict[str, str | None]:
    """Play the cell with mainspring: submit every run, keep ``workers`` worker
    processes alive (a supervisor restarts the killed), answer the approvals.
    ``other``: the workers run that App (an :class:`AppContender`) instead of the
    suite's agents."""
    url = f"sqlite:///{cell.where / 'suite.db'}"
    env = _worker_env(cell, url, model_attempts, kill_before_commit, other)
    app = build_app(url, kill_points=False)
    try:
        runs: dict[str, str] = {}
        for label in cell.labels:
            run_id = app.submit(cell.task, f"{cell.task} batch {label}").run_id
            cell.world.bind(label, run_id)
            runs[run_id] = label
        concurrency = str(max(2, len(runs) // cell.workers + 1))
        python, spec = (
            (other.python, other.app) if other is not None else (sys.executable, _APP_SPEC)
        )
        argv = [python, "-m", "mainspring", "worker", spec]
        argv += ["--concurrency", concurrency]
        spawned = 0

        def spawn() -> subprocess.Popen[bytes]:
            nonlocal spawned
            spawned += 1
            return _spawn(argv, env, cell.where / f"worker-{spawned}.log")

        procs = [spawn() for _ in range(cell.workers)]
        next_kill, deadline = cell.kill_every, time.monotonic() + cell.timeout_s
        try:
            while not all(app.get_run(r).finished for r in runs):
                if time.monotonic() > deadline:
                    break
                _approve(app, runs)
                cell.review()
                next_kill = cell.external_kill(procs, next_kill)
                for i, proc in enumerate(procs):
                    if proc.poll() is not None:  # a supervisor restarts the dead
                        procs[i] = spawn()
                time.sleep(0.05)
        finally:
            _stop(procs)
        return {label: _run_outcome(app, run_id, cell) for run_id, label in runs.items()}
    finally:
        app.close()


def _worker_env(
    cell: CellDrive,
    url: str,
    model_attempts: int | None,
    kill_before_commit: bool,
    other: AppContender | None,
) -> dict[str, str]:
    """The environment of the cell's worker processes: the cell's, with the suite's
    store and the options that the suite's App reads from it (``_suite_app.py``)."""
    env = {**cell.env, "MAINSPRING_DATABASE_URL": url}
    if other is not None and other.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*other.pythonpath, env.get("PYTHONPATH", "")])
    if model_attempts is not None:
        env["MAINSPRING_SUITE_MODEL_ATTEMPTS"] = str(model_attempts)
    if kill_before_commit:
        env["MAINSPRING_SUITE_KILL_BEFORE_COMMIT"] = "1"
    return env


def _approve(app: App, runs: dict[str, str]) -> None:
    """The scripted reviewer: approve every open request of the cell's runs."""
    for request in app.requests():
        if request.run_id in runs:
            # One answered already, or whose run moved on, is left alone.
            with contextlib.suppress(MainspringError):
                app.answer(request.run_id, request.id, decision="approve", by="reviewer")


def _run_outcome(app: App, run_id: str, cell: CellDrive) -> str | None:
    """How a run ended: ``None`` when it succeeded, else why not."""
    record = app.get_run(run_id)
    if record.status == "succeeded":
        return None
    if not record.finished:
        return f"run {run_id} did not finish within {cell.timeout_s:g}s (logs in {cell.where})"
    return f"run {run_id} ended {record.status}: {record.error}"


def _stop(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """Kill what still runs of a contender's processes and reap them all."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def drive_runners(cell: CellDrive, contender: RunnerContender) -> dict[str, str | None]:
    """Play the cell with a runner script: one process per run, at most ``workers`` at
    once, a SIGKILLed one started again."""
    queue = list(cell.labels)
    runners = _Runners(cell, contender)
    next_kill, deadline = cell.kill_every, time.monotonic() + cell.timeout_s
    try:
        while queue or runners.running:
            if time.monotonic() > deadline:
                for label in [*runners.running, *queue]:
                    runners.outcome[label] = f"did not finish within {cell.timeout_s:g}s"
                break
            cell.review()
            next_kill = cell.external_kill(list(runners.running.values()), next_kill)
            runners.reap()
            while queue and len(runners.running) < cell.workers:
                runners.spawn(queue.pop(0))
            time.sleep(0.05)
    finally:
        _stop(runners.running.values())
    return runners.outcome


class _Runners:
    """A runner contender's processes in one cell: those running by label, how often
    each was SIGKILLed and started again, and how each run ended."""

    def __init__(self, cell: CellDrive, contender: RunnerContender) -> None:
        self.cell, self.contender = cell, contender
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts = dict.fromkeys(cell.labels, 0)
        self.outcome: dict[str, str | None] = {}

    def spawn(self, label: str) -> None:
        cell, state = self.cell, self.cell.where / "state"
        (state / label).mkdir(parents=True, exist_ok=True)
        argv = [*self.contender.argv_prefix, "--task", cell.task, "--label", label]
        argv += ["--world", cell.world.path, "--state", str(state / label)]
        argv += ["--max-steps", str(cell.max_steps)]
        self.running[label] = _spawn(argv, cell.env, cell.where / f"{label}.log")

    def reap(self) -> None:
        """Take in the runners that exited: a SIGKILLed one starts again (up to
        ``max_restarts`` times), any other exit is its run's outcome."""
        for label, proc in list(self.running.items()):
            code = proc.poll()
            if code is None:
                continue
            del self.running[label]
            if code == -signal.SIGKILL:
                self.restarts[label] += 1
                if self.restarts[label] <= self.contender.max_restarts:
                    self.spawn(label)
                    continue
                self.outcome[label] = f"killed more than {self.contender.max_restarts} times"
            elif code == 0:
                self.outcome[label] = None
            else:
                log = self.cell.where / f"{label}.log"
                self.outcome[label] = f"runner exited {code}: {_tail(log)}"


def child_env(base_url: str, client_timeout_s: float) -> dict[str, str]:
    """The environment of a contender's processes: the cell's provider."""
    return {
        **os.environ,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "sk-suite",
        "MAINSPRING_SUITE_CLIENT_TIMEOUT_S": f"{client_timeout_s:g}",
        HARNESS_PID_ENV: str(os.getpid()),  # they exit once the harness is gone
    }
