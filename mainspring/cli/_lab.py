"""``mainspring lab`` (the reliability lab), ``lab chaos`` and ``mainspring preflight``."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.status import Status

from .. import ConfigError
from ..lab import (
    Contender,
    KillRates,
    LabProfile,
    LabResult,
    ProviderFaults,
    RunnerContender,
    SuiteProfile,
    failure_lines,
    html_report,
    markdown_report,
    parse_json_args,
    parse_policies,
    parse_steps,
    plot_results,
    rich_table,
    run_chaos,
    run_lab,
    run_regressions,
    run_suite,
    run_workflow_lab,
    suite_html,
    suite_markdown,
)
from ..lab import preflight as check
from ._common import JsonOption, cli_errors, console, print_json
from ._load import load_app
from ._sim import sim

__all__ = ["lab_commands", "preflight"]

lab_commands = typer.Typer(
    name="lab",
    help="The reliability lab: policies under seeded faults; `lab chaos` kills real workers.",
    invoke_without_command=True,
    no_args_is_help=False,
)

# The options `lab` and `lab run` share, each spelled and explained once.
CrashRateOption = Annotated[float, typer.Option(help="Worker crash rate per step.")]
CorrelatedRateOption = Annotated[
    float, typer.Option(help="Per task and step: broken for every trial and attempt.")
]
RetriesOption = Annotated[int, typer.Option(help="Retries per step for retrying policies.")]
PolicyOption = Annotated[
    str,
    typer.Option(help="naive, retries, checkpoint, validate, mainspring (comma-separated) or all."),
]
RepeatsOption = Annotated[int, typer.Option(help="Trials per task (for pass^k).")]
SeedOption = Annotated[int, typer.Option(help="The seed of every fault.")]
ReportOption = Annotated[
    Path | None,
    typer.Option(metavar="DIR", help="Write report.md, report.html and PNG plots here."),
]


lab_commands.command("sim")(sim)


@lab_commands.callback()
def lab(
    ctx: typer.Context,
    steps: Annotated[str, typer.Option(help="Task lengths, comma-separated.")] = "3,5,8,12,20",
    error_rate: Annotated[float, typer.Option(help="Model error rate per step attempt.")] = 0.1,
    tool_failure_rate: Annotated[float, typer.Option(help="Tool failure rate.")] = 0.0,
    timeout_rate: Annotated[float, typer.Option(help="Model call timeout rate.")] = 0.0,
    malformed_rate: Annotated[float, typer.Option(help="Malformed model output rate.")] = 0.0,
    crash_rate: CrashRateOption = 0.0,
    correlated_rate: CorrelatedRateOption = 0.0,
    retries: RetriesOption = 2,
    policy: PolicyOption = "all",
    trials: Annotated[int, typer.Option(help="Trials per policy and task length.")] = 1000,
    repeats: RepeatsOption = 10,
    seed: SeedOption = 42,
    out: ReportOption = None,
    json_out: JsonOption = False,
) -> None:
    """Run seed 000's sandbox task under faults for each policy and compare them."""
    if ctx.invoked_subcommand is not None:
        return

    with cli_errors():
        profile = LabProfile(
            model_error_rate=error_rate,
            tool_failure_rate=tool_failure_rate,
            timeout_rate=timeout_rate,
            malformed_rate=malformed_rate,
            crash_rate=crash_rate,
            correlated_rate=correlated_rate,
            retries=retries,
        )
        chosen = parse_policies(policy)
        lengths = parse_steps(steps)
        with _progress("running trials...") as status:

            def progress(p: str, n: int) -> None:
                status.update(f"done: {p} at {n} steps")

            result = run_lab(
                profile,
                steps=lengths,
                policies=chosen,
                trials=trials,
                repeats=repeats,
                seed=seed,
                progress=progress,
            )
        _show(result, out, json_out)


@lab_commands.command("run")
def run_target(
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:OBJECT",
            help="A workflow (@app.workflow, app.agent) or an App (with --workflow).",
        ),
    ],
    workflow: Annotated[
        str | None, typer.Option(help="The workflow to run when OBJECT is an App.")
    ] = None,
    args: Annotated[
        str | None, typer.Option("--args", help="Positional arguments, a JSON list.")
    ] = None,
    kwargs: Annotated[
        str | None, typer.Option("--kwargs", help="Keyword arguments, a JSON object.")
    ] = None,
    error_rate: Annotated[
        float, typer.Option(help="Error rate per step attempt (model steps: the model call).")
    ] = 0.1,
    tool_failure_rate: Annotated[
        float, typer.Option(help="Failure rate of non-model steps (half after the effect).")
    ] = 0.0,
    timeout_rate: Annotated[float, typer.Option(help="Timeout rate per step attempt.")] = 0.0,
    malformed_rate: Annotated[
        float, typer.Option(help="Malformed model output rate (agents' model steps).")
    ] = 0.0,
    crash_rate: CrashRateOption = 0.0,
    correlated_rate: CorrelatedRateOption = 0.0,
    retries: RetriesOption = 2,
    policy: PolicyOption = "all",
    trials: Annotated[int, typer.Option(help="Trials per policy.")] = 100,
    repeats: RepeatsOption = 10,
    seed: SeedOption = 42,
    out: ReportOption = None,
    json_out: JsonOption = False,
    live: Annotated[
        bool,
        typer.Option(
            "--live",
            help="Run the real write and irreversible tools (asks first; default: stubs).",
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask before --live.")] = False,
    stub: Annotated[
        list[str] | None,
        typer.Option(
            "--stub",
            metavar="TOOL=JSON",
            help="What a stubbed tool returns (repeatable), when no placeholder fits.",
        ),
    ] = None,
    regressions: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Instead of trials: shadow the runs of this regression suite (`mainspring"
            " shadow --save-suite`) against MODULE:APP; exit 1 when a decision moved.",
        ),
    ] = None,
) -> None:
    """Run your own workflow or agent under faults for each policy and compare them.

    Each trial runs on a fresh temporary SQLite store under simulated time. No real
    effect is performed: write and irreversible tools run as stubs unless --live.
    With --out DIR, each failed trial's store is kept in DIR/trials for `mainspring show`.
    """
    if regressions is not None:
        _regressions(target, regressions, stub or [], json_out)
        return
    with cli_errors():
        stubs = _stubs(stub or [])
        if live and not yes:
            if not sys.stdin.isatty():
                raise ConfigError(
                    "--live runs the target's real write and irreversible tools many times; "
                    "confirm with --yes (stdin is not a terminal to ask)"
                )
            if not typer.confirm(
                f"--live: {trials} trials per policy will run the real write and "
                "irreversible tools of "
                f"{target!r} (approved automatically), and their effects will happen. Go on?",
                default=False,
            ):
                raise typer.Exit(1)
        profile = LabProfile(
            model_error_rate=error_rate,
            tool_failure_rate=tool_failure_rate,
            timeout_rate=timeout_rate,
            malformed_rate=malformed_rate,
            crash_rate=crash_rate,
            correlated_rate=correlated_rate,
            retries=retries,
        )
        chosen = parse_policies(policy)
        positional, named = parse_json_args(args, kwargs)
        with _progress("running trials...") as status:
            result = run_workflow_lab(
                target,
                profile,
                args=positional,
                kwargs=named,
                workflow=workflow,
                policies=chosen,
                trials=trials,
                repeats=repeats,
                seed=seed,
                progress=lambda p, n: status.update(f"done: {p}"),
                live=live,
                stubs=stubs,
                keep=out / "trials" if out is not None else None,
            )
        _show(result, out, json_out)


def _progress(text: str) -> Status:
    """A spinner showing ``text`` on stderr: stdout carries the report alone (or the
    ``--json`` document)."""
    err = console()
    err.stderr = True
    return err.status(text)


def _regressions(target: str, path: Path, stub: list[str], json_out: bool) -> None:
    """``lab run MODULE:APP --regressions FILE``: the suite's runs shadowed again."""
    with cli_errors():
        given = _stubs(stub)
        stubs = {name: (lambda value: lambda arguments: value)(v) for name, v in given.items()}
        app = load_app(target)
        try:
            result = asyncio.run(run_regressions(app, path, stubs=stubs))
        finally:
            app.close()
    if json_out:
        print_json(result.to_dict())
    else:
        out = console()
        for run_id, reply, expected, got in result.failures:
            out.print(f"{run_id[:12]}: reply {reply} moved: expected {expected}, got {got}")
        out.print(
            f"{result.checked - len(result.failures)} of {result.checked} runs decide as saved"
        )
    raise typer.Exit(0 if result.ok else 1)


def _stubs(given: list[str]) -> dict[str, object]:
    """``--stub TOOL=JSON`` options, parsed."""
    out: dict[str, object] = {}
    for item in given:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--stub takes TOOL=JSON, like --stub purge='\"ok\"', got {item!r}")
        try:
            out[name.strip()] = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--stub {name.strip()}: {text!r} is not JSON ({exc})") from None
    return out


def _show(result: LabResult, out: Path | None, json_out: bool) -> None:

    plots: list[str] = []
    if out is not None:
        try:
            plots = plot_results(result, out)
        except ImportError as exc:
            raise ConfigError(str(exc)) from None
        (out / "report.md").write_text(markdown_report(result, plots))
        (out / "report.html").write_text(html_report(result, plots))
    if json_out:
        print_json(result.to_dict())
        return
    console().print(rich_table(result))
    if result.target is not None:
        if result.live:
            console().print("live: the real write and irreversible tools ran")
        else:
            stubbed = ", ".join(result.stubbed) or "none"
            console().print(f"no real effects: these tools ran as stubs: {stubbed} (--live)")
    if result.failures:
        console().print(f"failed trials ({len(result.failures)}):", markup=False)
        for line in failure_lines(result, limit=10):
            console().print(line, markup=False, highlight=False, soft_wrap=True)
    if out is not None:
        console().print(
            f"report: {out / 'report.md'}, {out / 'report.html'}; plots: {', '.join(plots)}"
        )


@lab_commands.command()
def chaos(
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="URL",
            help="sqlite:///... or postgresql://... (default: a temp SQLite file).",
        ),
    ] = None,
    runs: Annotated[int, typer.Option(help="Runs to execute.")] = 20,
    steps: Annotated[int, typer.Option(help="Steps per run (every 10th is at_most_once).")] = 40,
    kills: Annotated[int, typer.Option(help="SIGKILLs to send.")] = 20,
    workers: Annotated[int, typer.Option(help="Worker processes alive at once.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the kill schedule.")] = 0,
    lease_s: Annotated[float, typer.Option(help="Lease of a claimed run, seconds.")] = 1.0,
    json_out: JsonOption = False,
) -> None:
    """Run real workers, SIGKILL them at random, and audit the journal and effect ledger.

    Exits 1 when a run was lost, an effect duplicated or a journal inconsistent.
    """
    from rich.table import Table

    with cli_errors(), _progress("chaos: starting workers...") as status:
        result = run_chaos(
            url=db,
            runs=runs,
            steps=steps,
            kills=kills,
            workers=workers,
            seed=seed,
            lease_s=lease_s,
            progress=lambda done, total: status.update(f"chaos: {done}/{total} kills"),
        )
    if json_out:
        print_json(result.to_dict())
    else:
        table = Table(title=f"mainspring lab chaos ({result.store})")
        table.add_column("check")
        table.add_column("value", justify="right")
        for name, value in (
            ("SIGKILLs (mid-run)", f"{result.kills} ({result.kills_mid_run})"),
            ("runs", str(result.runs)),
            ("runs lost", str(result.lost)),
            ("steps audited", str(result.steps)),
            ("steps re-executed after a kill", str(result.reexecuted_steps)),
            ("effects duplicated", str(result.duplicate_effects)),
            ("re-executions deduplicated by key", str(result.duplicate_calls)),
            ("at_most_once steps interrupted (not re-run)", str(result.interrupted_at_most_once)),
            ("journal problems", str(len(result.journal_problems))),
            ("wall time", f"{result.wall_s:.1f} s"),
        ):
            table.add_row(name, value)
        out = console()
        out.print(table)
        for problem in result.journal_problems[:20]:
            out.print(f"  problem: {problem}")
        out.print("OK: nothing lost, nothing duplicated" if result.ok else "FAILED")
    if not result.ok:
        raise typer.Exit(1)


def preflight(
    target: Annotated[str, typer.Argument(metavar="MODULE:OBJECT", help="An agent or workflow.")],
    json_out: JsonOption = False,
) -> None:
    """Check an agent or workflow against the pre-release checklist.

    Exits 1 when an item is missing (each with how to fix it), 2 on bad input.
    """

    with cli_errors():
        report = check(target)
    if json_out:
        print_json(report.to_dict())
    else:
        out = console()
        out.print(f"preflight {report.target} ({report.kind})")
        for f in report.findings:
            mark = {"pass": "ok  ", "fail": "MISS", "n/a": "n/a "}[f.status]
            out.print(f"  [{mark}] {f.title}")
            if f.status == "fail":
                for problem in f.problems:
                    out.print(f"         - {problem}")
                out.print(f"         fix: {f.fix}")
        missing = sum(f.status == "fail" for f in report.findings)
        out.print("ready" if report.ok else f"{missing} item(s) missing")
    if not report.ok:
        raise typer.Exit(1)


_KILLRATES, _PROVIDERFAULTS = KillRates(), ProviderFaults()
_QUICK_KILLS = KillRates(model=0.02, tool=0.02, commit=0.005)


def _contender(text: str) -> Contender:
    """``mainspring``, or ``NAME=COMMAND`` (a runner script's command, split as a shell does)."""
    if text.strip() == "mainspring":
        return "mainspring"
    name, sep, command = text.partition("=")
    if not sep or not name.strip() or not command.strip():
        raise ConfigError(
            f"--contender {text!r}: give 'mainspring' or NAME=COMMAND "
            "(e.g. 'openai-loop=python bench/horizon/openai_loop.py')"
        )
    return RunnerContender(name.strip(), tuple(shlex.split(command)))


@lab_commands.command()
def suite(
    task: Annotated[
        str,
        typer.Option(help="Tasks, comma-separated: migrate, support, reconcile, research."),
    ] = "migrate,support",
    steps: Annotated[str, typer.Option(help="Task lengths in steps, comma-separated.")] = "10,100",
    runs: Annotated[int, typer.Option(help="Runs per task and length.")] = 20,
    seed: Annotated[int, typer.Option(help="Seed of every draw (policy, faults, kills).")] = 0,
    contender: Annotated[
        list[str] | None,
        typer.Option(
            help="Who plays: 'mainspring', or NAME=COMMAND for a runner script "
            "(repeat for several; default mainspring)."
        ),
    ] = None,
    kill_model: Annotated[
        float, typer.Option(help="SIGKILL chance after each model reply.")
    ] = _KILLRATES.model,
    kill_tool: Annotated[
        float, typer.Option(help="SIGKILL chance after each tool effect.")
    ] = _KILLRATES.tool,
    kill_commit: Annotated[
        float, typer.Option(help="SIGKILL chance after each durable commit.")
    ] = _KILLRATES.commit,
    kill_before_commit: Annotated[
        bool, typer.Option(help="mainspring: a commit kill point before each commit too.")
    ] = False,
    server_errors: Annotated[
        float, typer.Option(help="Share of model requests answered 500/503.")
    ] = _PROVIDERFAULTS.server_error,
    rate_limits: Annotated[
        float, typer.Option(help="Share of model requests answered 429.")
    ] = _PROVIDERFAULTS.rate_limited,
    timeouts: Annotated[
        float, typer.Option(help="Share of model requests held past the client timeout.")
    ] = _PROVIDERFAULTS.timeout,
    client_timeout: Annotated[
        float | None,
        typer.Option(help="The provider's client timeout in seconds (default 30; --quick 1)."),
    ] = None,
    kill_every: Annotated[
        int,
        typer.Option(help="Also SIGKILL a process from outside every N model calls (0: never)."),
    ] = 0,
    workers: Annotated[int, typer.Option(help="Contender processes alive at once.")] = 2,
    model_attempts: Annotated[
        int | None,
        typer.Option(help="Attempts per model call (default: mainspring's model_retry)."),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(help="Seconds a cell may take (default: 900 plus 5 a step)."),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="A small sample for CI: 10 steps, 3 runs, denser kill points, a 1 s client "
            "timeout.",
        ),
    ] = False,
    html_path: Annotated[
        Path | None,
        typer.Option("--html", help="Also write the report (table and plots) as one HTML page."),
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """The horizon suite: long agent tasks under model, provider and process faults.

    Exits 1 when a run failed or an effect happened twice.
    """
    with cli_errors():
        tasks = [t.strip() for t in task.split(",") if t.strip()]
        lengths = [10] if quick else parse_steps(steps)
        contenders = [_contender(c) for c in contender or ["mainspring"]]
        given = KillRates(kill_model, kill_tool, kill_commit)
        profile = SuiteProfile(
            kills=_QUICK_KILLS if quick and given == KillRates() else given,
            provider=ProviderFaults(
                server_errors,
                rate_limits,
                timeouts,
                timeout_s=client_timeout or (1.0 if quick else _PROVIDERFAULTS.timeout_s),
            ),
            kill_every=kill_every,
            kill_before_commit=kill_before_commit,
            model_attempts=model_attempts,
        )
        cells = []
        with _progress("suite: starting...") as status:
            for who in contenders:
                cells += run_suite(
                    tasks=tasks,
                    steps=lengths,
                    runs=3 if quick else runs,
                    seed=seed,
                    profile=profile,
                    workers=workers,
                    timeout_s=timeout,
                    contender=who,
                    progress=lambda c: status.update(
                        f"suite: {c.contender} {c.task} at {c.steps} steps done"
                    ),
                )
    ok = all(c.succeeded == c.runs and c.duplicate_effects == 0 for c in cells)
    if html_path is not None:
        html_path.write_text(suite_html(cells))
    if json_out:
        print_json({"ok": ok, "cells": [c.to_dict() for c in cells]})
    else:
        print(suite_markdown(cells))
        for cell in cells:
            for failure in cell.failures[:10]:
                print(f"  failure: {failure}")
        print("OK: every run succeeded, no effect twice" if ok else "FAILED")
    if not ok:
        raise typer.Exit(1)
