"""``mainspring trace / tail / doctor / fork / retry``: seeing and steering one run."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Annotated, Any

import typer
from rich.text import Text
from rich.tree import Tree

from .. import ConfigError
from ..observability import RunTrace, TraceEntry, progress
from ._common import (
    AppOption,
    DbOption,
    ErrorsOption,
    JsonOption,
    LastOption,
    StepOption,
    cli_errors,
    console,
    iso_time,
    open_app,
    pick_steps,
    print_json,
)

__all__ = ["doctor", "fork", "retry", "tail", "trace"]

RunArg = Annotated[str, typer.Argument(metavar="RUN", help="The run's id.")]
_STATUS_STYLE = {"started": "blue", "retrying": "yellow", "completed": "green", "failed": "red"}


def trace(
    run_id: RunArg,
    db: DbOption = None,
    app_spec: AppOption = None,
    as_json: JsonOption = False,
    last: LastOption = None,
    errors: ErrorsOption = False,
    step: StepOption = None,
) -> None:
    """A run's timeline: each step with its duration, tokens, cost and errors.

    --last, --errors and --step pick the steps shown; the totals stay the whole run's.
    """
    with cli_errors(), open_app(db, app_spec) as app:
        run_id = app.resolve_run_id(run_id)  # a unique prefix will do
        t = app.observe.trace(run_id)
        kept = pick_steps(
            list(t.entries),
            where=lambda e: (e.session, e.seq),
            troubled=lambda e: e.status == "failed" or e.retries > 0 or e.error_class is not None,
            session=t.run.session,
            last=last,
            errors=errors,
            step=step,
        )
    if as_json:
        data = t.to_json()
        positions = {(e.session, e.seq) for e in kept}
        data["steps"] = [s for s in data["steps"] if (s["session"], s["seq"]) in positions]
        # Times as every command prints them: ISO-8601 UTC strings.
        for row, keys in [(data["run"], ("created_at", "finished_at"))] + [
            (step, ("started_at", "finished_at")) for step in data["steps"]
        ]:
            for k in keys:
                row[k] = iso_time(row[k])
        print_json(data)
        return
    console().print(_tree(t, kept))


def tail(
    run_id: RunArg,
    db: DbOption = None,
    app_spec: AppOption = None,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between looks.")] = 1.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per line (JSON Lines) per change.")
    ] = False,
) -> None:
    """Follow a run live (step, plan items done, tokens, cost, status) until it finishes."""
    with cli_errors(), open_app(db, app_spec) as app:
        run_id = app.resolve_run_id(run_id)  # a unique prefix will do
        out = console()
        last = None
        while True:
            t = app.observe.trace(run_id)
            p = progress(t)
            if as_json:
                line = json.dumps({"run_id": run_id, **dataclasses.asdict(p)}, default=str)
            else:
                line = (
                    f"{p.status:<9} steps {p.steps:>4}  plan {p.plan_done}/{p.plan_total}  "
                    f"tokens {p.tokens_in:,} in / {p.tokens_out:,} out  ${p.cost_usd:.4f}  "
                    f"errors {p.errors}  at {p.current or '-'}"
                )
            if line != last:
                if as_json:
                    print(line, flush=True)  # a line per change, for a pipe
                else:
                    out.print(line)
                last = line
            if t.run.finished:
                break
            time.sleep(interval)
    if t.run.status != "succeeded":
        raise typer.Exit(1)


def doctor(
    run_id: RunArg,
    db: DbOption = None,
    app_spec: AppOption = None,
    stall_after: Annotated[
        float, typer.Option(min=1, help="An unfinished run quiet this many seconds is stalled.")
    ] = 600.0,
    as_json: JsonOption = False,
) -> None:
    """Diagnose a stuck or failed run with the failure table, and say what to check next."""
    with cli_errors(), open_app(db, app_spec) as app:
        run_id = app.resolve_run_id(run_id)  # a unique prefix will do
        d = app.observe.diagnose(run_id, stall_after_s=stall_after)
    if as_json:
        print_json(d.to_json())
        return
    out = console()
    out.print(Text(f"run {d.run_id} ({d.status}): {d.summary}", style="bold"))
    for f in d.findings:
        out.print(Text(f"\n● {f.title} [{f.kind}]", style="bold red"))
        for line in f.evidence:
            out.print(f"  - {line}")
        out.print("  check next:")
        for line in f.next_steps:
            out.print(f"  → {line}")
    if not d.findings:
        out.print("\ncheck next: `mainspring trace RUN` for each step's errors and timings")


def fork(
    run_id: RunArg,
    from_step: Annotated[
        str,
        typer.Option("--from-step", metavar="N", help="Keep the journal up to step N (or S:N)."),
    ],
    edit_state: Annotated[
        str | None,
        typer.Option(
            "--edit-state",
            metavar="JSON",
            help="Merge this JSON (RFC 7386) into step N's recorded output first.",
        ),
    ] = None,
    keep_decisions: Annotated[
        bool,
        typer.Option(
            "--keep-decisions",
            help="Copy the answers to requests at or before step N, recorded as your "
            "decisions (default: the fork asks them again).",
        ),
    ] = False,
    db: DbOption = None,
    app_spec: AppOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start a new run that replays RUN's journal up to step N and runs live after it.
    A request to a human at or before step N is asked again unless --keep-decisions."""
    with cli_errors():
        edit: dict[str, Any] = {}
        if edit_state is not None:
            try:
                edit = {"edit": json.loads(edit_state)}
            except ValueError as exc:
                raise ConfigError(
                    f"--edit-state is not valid JSON ({exc}): {edit_state!r}"
                ) from None
        with open_app(db, app_spec) as app:
            run_id = app.resolve_run_id(run_id)  # a unique prefix will do
            handle = app.fork(
                run_id,
                from_step=from_step,
                decisions="keep" if keep_decisions else "ask",
                **edit,
            )
    if as_json:
        print_json({"run_id": handle.run_id, "forked_from": run_id, "from_step": from_step})
        return
    console().print(
        f"forked run {run_id} at step {from_step} into run {handle.run_id} (queued); "
        "a worker executes it"
    )


def retry(run_id: RunArg, db: DbOption = None, app_spec: AppOption = None) -> None:
    """Resume a failed run from its failing step (completed steps are not run again)."""
    with cli_errors(), open_app(db, app_spec) as app:
        run_id = app.resolve_run_id(run_id)  # a unique prefix will do
        app.retry(run_id)
    console().print(f"run {run_id} queued again from its failing step; a worker resumes it")


# -- rendering --------------------------------------------------------------------------


def _tree(t: RunTrace, entries: list[TraceEntry]) -> Tree:
    r = t.run
    took = f", {_secs(t.duration_s)}" if t.duration_s is not None else ""
    head = Text(f"run {r.id} {r.workflow} ", style="bold")
    head.append(
        r.status,
        style="green" if r.status == "succeeded" else "red" if r.status == "failed" else "blue",
    )
    head.append(
        f"{took} · {len(t.entries)} steps · tokens {t.tokens_in:,} in / {t.tokens_out:,} out"
        f" · {_cost(t.cost_usd, unpriced=t.unpriced)}"
    )
    if t.rate_limited or t.rate_waits:
        head.append(
            f" · rate limit: {t.rate_limited} refused (429), {t.rate_waits} wait(s)"
            f" {_secs(t.rate_wait_s)}",
            style="yellow",
        )
    root = Tree(head)
    if len(entries) < len(t.entries):
        head.append(f" (showing {len(entries)} of them)")
    sessions = sorted({e.session for e in entries})
    for session in sessions:
        branch = root.add(f"session {session}") if len(sessions) > 1 else root
        turn: Tree | None = None
        for e in (e for e in entries if e.session == session):
            label = _line(e)
            if e.kind == "model":
                turn = branch.add(label)
            elif e.kind == "tool" and turn is not None:
                turn.add(label)
            else:
                turn = None
                branch.add(label)
    if r.status == "failed" and r.error:
        try:
            err = json.loads(r.error)
            root.add(Text(f"error {err.get('type', '')}: {err.get('message', '')}", style="red"))
        except ValueError:
            root.add(Text(f"error {r.error}", style="red"))
    return root


def _cost(usd: float, *, unpriced: bool) -> str:
    """A cost as the dashboard says it: tokens of a model with no price are "no price",
    never a made-up $0.0000."""
    if not unpriced:
        return f"${usd:.4f}"
    return f"${usd:.4f} + no price for some" if usd else "no price"


def _line(e: TraceEntry) -> Text:
    out = Text(f"{e.position:>5} ")
    out.append(e.name, style="bold" if e.kind == "model" else "")
    out.append(f" {e.status}", style=_STATUS_STYLE.get(e.status, ""))
    if e.latency_s is not None:
        out.append(f" {_secs(e.latency_s)}")
    if e.retries:
        out.append(f" attempt {e.attempt}", style="yellow")
    if e.tokens_in or e.tokens_out:
        out.append(
            f" {e.tokens_in:,}→{e.tokens_out:,} tok {_cost(e.cost_usd, unpriced=not e.priced)}",
            style="cyan",
        )
    if e.rate_limited:
        out.append(" 429 (no attempt spent)", style="yellow")
    if e.rate_wait_s > 0:
        out.append(f" rate-limit wait {_secs(e.rate_wait_s)}", style="yellow")
    if e.input_summary:
        out.append(f" in {e.input_summary[:60]}", style="dim")
    if e.output_summary:
        out.append(f" out {e.output_summary[:60]}", style="dim")
    if e.error_class:
        out.append(f" {e.error_class}: {(e.error_message or '')[:80]}", style="red")
    return out


def _secs(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 120:
        return f"{s:.1f}s"
    return f"{s / 60:.1f}m"
