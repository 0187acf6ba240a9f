"""``mainspring submit / runs / show / signal / cancel``: operating runs from a shell.

Tables go to stdout through rich; ``--json`` prints one JSON document to stdout and
nothing else (payload columns decoded, times as ISO-8601 UTC strings). Errors are one
``error: ...`` line on stderr with exit code 2, whether the command runs under
``main()`` or is invoked on :data:`cli` directly.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any, get_args

import typer
from rich.console import Console, Group, JustifyMethod
from rich.table import Table
from rich.text import Text

from .. import ConfigError
from ..observability import Family, RunTrace, Usage, build_trace
from ..storage import WAKE_NOW, RunRecord, RunStatus, StepRecord, Store
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
from ._load import load_app

__all__ = ["cancel", "runs", "show", "signal", "submit"]

_STATUSES: tuple[str, ...] = get_args(RunStatus)
_SUSPENDED = frozenset({"sleeping", "waiting"})
_STATUS_STYLE = {
    "queued": "yellow",
    "running": "blue",
    "sleeping": "cyan",
    "waiting": "magenta",
    "succeeded": "green",
    "failed": "bold red",
    "cancelled": "dim",
}
_STEP_STYLE = {"started": "blue", "retrying": "yellow", "completed": "green", "failed": "red"}
_OUTPUT_WIDTH = 80
_VALUE_WIDTH = 200


# -- commands ---------------------------------------------------------------------------


def submit(
    app_spec: Annotated[str, typer.Argument(metavar="MODULE:APP", help="Where the App lives.")],
    workflow: Annotated[str, typer.Argument(help="Name of a workflow registered in the App.")],
    args: Annotated[
        str | None,
        typer.Option("--args", metavar="JSON-ARRAY", help="Positional arguments: '[\"a\", 1]'."),
    ] = None,
    kwargs: Annotated[
        str | None,
        typer.Option("--kwargs", metavar="JSON-OBJECT", help="Keyword arguments: '{\"n\": 3}'."),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(help="Idempotency key: submitting the same key again returns that run."),
    ] = None,
    queue: Annotated[
        str | None, typer.Option(help="A queue the App declares: the run starts within its limits.")
    ] = None,
    queue_key: Annotated[
        str | None, typer.Option(help="The run's key in its queue (the per-key limit).")
    ] = None,
    priority: Annotated[int, typer.Option(help="Priority in the queue: higher starts first.")] = 0,
    as_json: JsonOption = False,
) -> None:
    """Submit a run for the workers and print its id."""
    with cli_errors():
        arg_list = [] if args is None else _parse_json(args, "--args", list, "a JSON array")
        kwarg_map = {} if kwargs is None else _parse_json(kwargs, "--kwargs", dict, "a JSON object")
        app = load_app(app_spec)
        try:
            # App.submit checks the arguments' types and a reused key's input.
            handle = app.enqueue(
                workflow,
                arg_list,
                kwarg_map,
                key=key,
                queue=queue,
                queue_key=queue_key,
                priority=priority,
            )
            record = app.get_run(handle.run_id)
            current = _current_step(app.store, record)
        finally:
            app.close()
    if as_json:
        print_json({**_run_json(record, current), "created": handle.created})
        return
    out = console()
    if handle.created:
        out.print(
            f"submitted run {record.id} (workflow {record.workflow!r}, {record.status}); "
            f"a worker executes it: mainspring worker {app_spec}"
        )
    else:
        out.print(
            f"run {record.id} already exists with key {key!r} "
            f"(workflow {record.workflow!r}, {record.status}); nothing new was submitted"
        )


def runs(
    db: DbOption = None,
    app_spec: AppOption = None,
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            help=f"Only runs in this status (repeatable): {', '.join(_STATUSES)}.",
        ),
    ] = None,
    workflow: Annotated[str | None, typer.Option(help="Only runs of this workflow.")] = None,
    since: Annotated[
        str | None,
        typer.Option(
            metavar="WHEN",
            help="Only runs created since: a duration ago (90s, 30m, 2h, 7d) or an "
            "ISO-8601 time (2026-05-01T12:00, UTC when no zone is given).",
        ),
    ] = None,
    search: Annotated[
        str | None,
        typer.Option(
            metavar="TEXT", help="Only runs with TEXT in id, key, input, output or error."
        ),
    ] = None,
    version: Annotated[
        list[str] | None,
        typer.Option(
            "--version",
            metavar="VERSION",
            help="Only runs submitted by this code version (App(version=...); repeatable;"
            " 'none': runs with no version).",
        ),
    ] = None,
    queue: Annotated[str | None, typer.Option(help="Only runs submitted to this queue.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="How many runs to list.")] = 50,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many (newest first).")] = 0,
    as_json: JsonOption = False,
) -> None:
    """List runs, newest first, with their current step and a count by status."""
    with cli_errors():
        statuses = _parse_statuses(status or [])
        since_ts = None if since is None else _parse_since(since, time.time())
        with open_app(db, app_spec) as app:
            records = app.list_runs(
                status=statuses or None,
                workflow=workflow,
                limit=limit,
                offset=offset,
                since=since_ts,
                search=search,
                queue=queue,
                versions=None
                if not version
                else [None if v.strip().lower() == "none" else v.strip() for v in version],
            )
            currents = [_current_step(app.store, r) for r in records]
            counts = app.store.count_runs()
    counts = {s: counts[s] for s in _STATUSES if counts.get(s)}
    if as_json:
        print_json(
            {
                "runs": [_run_json(r, c) for r, c in zip(records, currents, strict=True)],
                "counts": counts,
                "limit": limit,
                "offset": offset,
            }
        )
        return
    out = console()
    now = time.time()
    if records:
        table = Table(box=None, pad_edge=False, header_style="bold")
        table.add_column("run", no_wrap=True)
        table.add_column("workflow")
        table.add_column("status", no_wrap=True)
        table.add_column("session", justify="right")
        table.add_column("current step")
        table.add_column("created (UTC)", no_wrap=True)
        table.add_column("active (UTC)", no_wrap=True)
        table.add_column("waiting on")
        versioned = any(r.version is not None for r in records)
        if versioned:  # a column only for those who version their code
            table.add_column("version", no_wrap=True)
        queued = any(r.queue is not None for r in records)
        if queued:  # and one for those who use queues
            table.add_column("queue", no_wrap=True)
        for r, c in zip(records, currents, strict=True):
            table.add_row(
                r.id,
                r.workflow,
                _status_text(r),
                str(r.session),
                _step_summary(c),
                _clock(r.created_at, now),
                _clock(_active_at(r, c), now),
                _wait_text(r, now),
                *([r.version or "-"] if versioned else []),
                *([_queue_text(r)] if queued else []),
            )
        out.print(table)
    else:
        filtered = statuses or workflow or offset or since or search or version or queue
        out.print("no runs match" if filtered else "no runs yet")
    total = sum(counts.values())
    by_status = ", ".join(f"{n} {s}" for s, n in counts.items()) or "none"
    more = f"; more with --offset {offset + limit}" if len(records) == limit else ""
    out.print(f"{len(records)} shown{more} · {total} runs in all: {by_status}")


def show(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run's id.")],
    db: DbOption = None,
    app_spec: AppOption = None,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="Full values and the tracebacks of errors."),
    ] = False,
    as_json: JsonOption = False,
    last: LastOption = None,
    errors: ErrorsOption = False,
    step: StepOption = None,
) -> None:
    """Show one run: its state, input, result or error, and its journal of steps."""
    with cli_errors(), open_app(db, app_spec) as app:
        run_id = app.resolve_run_id(run_id)  # a unique prefix will do
        record = app.get_run(run_id)
        steps = app.observe.steps(run_id)
        current = max(
            (s for s in steps if s.session == record.session), key=lambda s: s.seq, default=None
        )
        # The whole run's, whatever --last/--errors/--step pick: 429s and rate waits.
        rate = build_trace(record, steps)
        family = app.observe.family(run_id)
        steps = pick_steps(
            steps,
            where=lambda s: (s.session, s.seq),
            troubled=lambda s: s.status in ("failed", "retrying") or s.error is not None,
            session=record.session,
            last=last,
            errors=errors,
            step=step,
        )
    if as_json:
        print_json(_show_json(record, current, rate, family, steps))
        return
    out = console()
    now = time.time()
    width = None if verbose else _VALUE_WIDTH
    error = _decode(record.error)
    facts = [
        *_identity_facts(record, now),
        *_usage_facts(record, family, rate, now),
        *_outcome_facts(record, error, width, now),
    ]
    label_width = max(len(label) for label, _ in facts)
    for label, value in facts:
        # A value of several lines (the children) keeps every line in the value column.
        first, *more = (value if isinstance(value, Text) else Text(value)).split("\n")
        out.print(Text.assemble((label.ljust(label_width), "bold"), "  ", first))
        for line in more:
            out.print(Text.assemble(" " * (label_width + 2), line))
    if verbose and isinstance(error, dict) and error.get("traceback"):
        out.print(Text("\nrun error traceback:", style="bold"))
        out.print(str(error["traceback"]).rstrip())
    if not steps and (errors or step is not None or last is not None):
        out.print("\nno step of the run matches --errors")  # --step and --last always match
        return
    _print_steps(out, steps, now, verbose=verbose)


def _show_json(
    record: RunRecord,
    current: StepRecord | None,
    rate: RunTrace,
    family: Family,
    steps: list[StepRecord],
) -> dict[str, Any]:
    """``show --json``: the run, its rate-limit figures, children and usage, the steps."""
    run_json = _run_json(record, current)
    run_json["rate_limit"] = {
        "refused": rate.rate_limited,
        "waits": rate.rate_waits,
        "waited_s": round(rate.rate_wait_s, 3),
    }
    run_json["children"] = [
        {
            "run": c.run.id,
            "workflow": c.run.workflow,
            "status": c.run.status,
            "step": c.run.parent_step,
            "close": c.run.parent_close,
            "duration_s": round(c.duration_s, 3),
            **c.total.to_json(),
        }
        for c in family.children
    ]
    usage = family.to_json()
    del usage["child_runs"]  # the children above carry theirs
    run_json["usage"] = usage
    return {"run": run_json, "steps": [_step_json(s) for s in steps]}


_Fact = tuple[str, "str | Text"]


def _identity_facts(record: RunRecord, now: float) -> list[_Fact]:
    """Which run this is: ids, where it came from, who holds it."""
    facts: list[_Fact] = [
        ("run", record.id),
        ("status", _status_text(record)),
        ("workflow", record.workflow),
        ("key", record.key if record.key is not None else "-"),
        ("session", str(record.session)),
    ]
    if record.version is not None:
        facts.append(("version", record.version))
    if record.schedule is not None:
        facts.append(("schedule", record.schedule))
    if record.queue is not None:
        facts.append(("queue", _queue_text(record)))
    holder = "no owner"
    if record.owner is not None:
        holder = f"owner {record.owner}"
    if record.lease_until is not None:
        expired = " (expired)" if record.lease_until < now else ""
        holder += f", lease until {_clock(record.lease_until, now)} UTC{expired}"
    facts.append(("epoch", f"{record.epoch}, {holder}"))
    if record.recoveries:
        facts.append(("recoveries", str(record.recoveries)))
    if record.parent is not None:
        how = "child of" if record.parent_kind == "child" else "forked from"
        where = f"run {record.parent}, step {record.parent_step}"
        close = _close_text(record)
        facts.append((how, f"{where} ({close})" if close else where))
    return facts


def _usage_facts(record: RunRecord, family: Family, rate: RunTrace, now: float) -> list[_Fact]:
    """What the run (and its children) spent, and when."""
    facts: list[_Fact] = []
    if family.children:
        lines = [
            f"{_child_line(c.run)}: {c.total.tokens:,} tokens, ${c.total.cost_usd:.4f},"
            f" {_seconds(c.duration_s)}"
            for c in family.children
        ]
        facts.append((f"children ({len(family.children)})", "\n".join(lines)))
    facts.append(("usage", _usage_text(family.own, family.duration_s)))
    if family.children:
        facts.append(("with children", _usage_text(family.with_children, None)))
    times = f"created {_clock(record.created_at, now)}, updated {_clock(record.updated_at, now)}"
    if record.finished_at is not None:
        times += f", finished {_clock(record.finished_at, now)}"
    facts.append(("times (UTC)", times))
    if rate.rate_limited or rate.rate_waits:
        facts.append(
            (
                "rate limit",
                f"{rate.rate_limited} refused (429), {rate.rate_waits} wait(s),"
                f" {rate.rate_wait_s:.1f}s waited",
            )
        )
    return facts


def _outcome_facts(record: RunRecord, error: Any, width: int | None, now: float) -> list[_Fact]:
    """What went in, what came out or went wrong, what it waits on."""
    facts: list[_Fact] = [("input", _clip(record.input, width))]
    if record.handoff is not None:
        facts.append(("hand-off", _clip(record.handoff, width)))
    if record.status == "succeeded":
        facts.append(("result", _clip(record.output or "null", width)))
    if record.finished and record.status != "succeeded" and error is not None:
        facts.append(("error", Text(_error_line(error, width), style="red")))
    elif record.cancel_requested:
        facts.append(("cancel", "requested; its worker stops it at the next step"))
    if record.status in _SUSPENDED:
        facts.append(("waiting on", _wait_text(record, now)))
    refused = _refusal_text(record, error, now)
    if refused:
        facts.append(("replay", Text(refused, style="yellow")))
    return facts


def signal(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run's id.")],
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="Signal name (what the run's ctx.wait_for takes).")
    ],
    payload: Annotated[
        str | None, typer.Argument(metavar="PAYLOAD-JSON", help="The signal's value as JSON.")
    ] = None,
    db: DbOption = None,
    app_spec: AppOption = None,
    as_json: JsonOption = False,
) -> None:
    """Send a signal to a run; it is kept until the run waits for that name."""
    with cli_errors():
        value = _parse_json(payload, "PAYLOAD-JSON") if payload is not None else None
        with open_app(db, app_spec) as app:
            run_id = app.resolve_run_id(run_id)  # a unique prefix will do
            app.get_run(run_id)  # names the database when the run is not there
            signal_id = app.signal(run_id, name, value)
            record = app.get_run(run_id)
    if as_json:
        print_json(
            {"run_id": run_id, "signal": name, "signal_id": signal_id, "status": record.status}
        )
        return
    waits_for = (record.wait_reason or "").split(" | ")  # several waits at once: " | "
    if f"signal:{name}" in waits_for and record.status == "waiting":
        then = "the run was waiting for it and is runnable again"
    else:
        then = f"the run is {record.status}; it takes the signal when it waits for {name!r}"
    console().print(f"sent signal {name!r} to run {run_id} (signal #{signal_id}): {then}")


def cancel(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run's id.")],
    reason: Annotated[str | None, typer.Option(help="Recorded as the run's error.")] = None,
    db: DbOption = None,
    app_spec: AppOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a run. A running run stops at its next step boundary."""
    with cli_errors(), open_app(db, app_spec) as app:
        run_id = app.resolve_run_id(run_id)  # a unique prefix will do
        before = app.get_run(run_id).status
        after = app.cancel(run_id, reason)
    if as_json:
        print_json({"run_id": run_id, "previous_status": before, "status": after})
        return
    if before in ("succeeded", "failed", "cancelled"):
        message = f"run {run_id} is already {before}: nothing to cancel"
    elif after in ("succeeded", "failed"):  # it finished while the cancel was on its way
        message = f"run {run_id} finished {after} before the cancel reached it: nothing to cancel"
    elif after == "running":
        message = f"run {run_id}: cancelling (its worker will stop it at the next step)"
    else:
        message = f"run {run_id}: {after} (was {before})"
    console().print(message)


# -- parsing ------------------------------------------------------------------------------


def _parse_json(text: str, what: str, kind: type[Any] | None = None, noun: str = "") -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} {text!r} is not valid JSON: {exc}") from None
    if kind is not None and not isinstance(value, kind):
        raise ConfigError(f"{what} {text!r} must be {noun}, not a {type(value).__name__}")
    return value


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def _parse_since(text: str, now: float) -> float:
    """``90s``/``30m``/``2h``/``7d``/``1w`` ago, or an ISO-8601 time (UTC if naive)."""
    raw = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", raw)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise ConfigError(
            f"--since {text!r} is neither a duration (90s, 30m, 2h, 7d, 1w) nor an "
            "ISO-8601 time (2026-05-01T12:00)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _parse_statuses(values: list[str]) -> list[str]:
    statuses = [s.strip() for v in values for s in v.split(",") if s.strip()]
    for s in statuses:
        if s not in _STATUSES:
            raise ConfigError(
                f"unknown status {s!r} for --status; expected one of: {', '.join(_STATUSES)}"
            )
    return statuses


# -- reading the journal ------------------------------------------------------------------


def _active_at(record: RunRecord, current: StepRecord | None) -> float:
    """When the run last did something: its row's last change (status moves) or its
    newest journal row's, whichever is later (step commits leave the row as it is)."""
    if current is None:
        return record.updated_at
    return max(record.updated_at, current.finished_at or current.started_at or 0.0)


def _current_step(store: Store, record: RunRecord) -> StepRecord | None:
    """The newest journal row of the run."""
    return store.last_steps([record.id]).get(record.id)


def _decode(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON: show it as it is rather than fail the listing


def _queue_text(r: RunRecord) -> str:
    """A run's queue, its key there and its priority: ``emails (key c-1, priority 4)``."""
    if r.queue is None:
        return "-"
    more = [f"key {r.queue_key}"] if r.queue_key is not None else []
    more += [f"priority {r.priority}"] if r.priority else []
    return r.queue + (f" ({', '.join(more)})" if more else "")


def _close_text(r: RunRecord) -> str:
    """A child's parent-close policy, ``on parent close: cancel``; empty for a fork, or
    a child started before the policy existed (its row has none)."""
    return "" if r.parent_close is None else f"on parent close: {r.parent_close}"


def _usage_text(u: Usage, duration_s: float | None) -> str:
    """``12,400 tokens (9,000 in, 3,400 out), $0.0780, over 2m05s``."""
    text = f"{u.tokens:,} tokens ({u.tokens_in:,} in, {u.tokens_out:,} out), ${u.cost_usd:.4f}"
    return text if duration_s is None else f"{text}, over {_seconds(duration_s)}"


def _seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _child_line(c: RunRecord) -> str:
    """One of a parent's children: ``<id> kid running (step 0:3, on parent close: cancel)``."""
    close = _close_text(c)
    return f"{c.id} {c.workflow} {c.status} (step {c.parent_step}{', ' + close if close else ''})"


def _run_json(r: RunRecord, current: StepRecord | None) -> dict[str, Any]:
    suspended = r.status in _SUSPENDED
    return {
        "id": r.id,
        "workflow": r.workflow,
        "key": r.key,
        "status": r.status,
        "session": r.session,
        "epoch": r.epoch,
        "owner": r.owner,
        "lease_until": iso_time(r.lease_until),
        "input": _decode(r.input),
        "output": _decode(r.output),
        "error": _decode(r.error),
        "handoff": _decode(r.handoff),
        # A cancelled run keeps its last wait reason in the store: only show live ones.
        "wait_reason": r.wait_reason if suspended else None,
        "wake_at": iso_time(r.wake_at) if suspended else None,
        "recoveries": r.recoveries,
        "cancel_requested": r.cancel_requested,
        "version": r.version,  # of the code that submitted it (App(version=...))
        "schedule": r.schedule,  # the schedule that started it, if one did
        "queue": None
        if r.queue is None
        else {"name": r.queue, "key": r.queue_key, "priority": r.priority},
        # Lineage: the run and step it was forked from, or that started it as a child.
        "parent": None
        if r.parent is None
        else {
            "run": r.parent,
            "step": r.parent_step,
            "kind": r.parent_kind,
            "close": r.parent_close,  # a child's parent-close policy (null: a fork's)
        },
        "created_at": iso_time(r.created_at),
        "updated_at": iso_time(r.updated_at),
        "active_at": iso_time(_active_at(r, current)),
        "finished_at": iso_time(r.finished_at),
        "current_step": None
        if current is None
        else {
            "session": current.session,
            "seq": current.seq,
            "kind": current.kind,
            "name": current.name,
            "status": current.status,
            "attempts": current.attempt,
        },
    }


def _step_json(s: StepRecord) -> dict[str, Any]:
    return {
        "session": s.session,
        "seq": s.seq,
        "kind": s.kind,
        "name": s.name,
        "status": s.status,
        "attempts": s.attempt,
        "epoch": s.epoch,
        "output": _decode(s.output),
        "error": _decode(s.error),
        "started_at": iso_time(s.started_at),
        "finished_at": iso_time(s.finished_at),
        "wake_at": iso_time(s.wake_at),
        "duration_s": None if s.finished_at is None else s.finished_at - s.started_at,
    }


# -- rendering ----------------------------------------------------------------------------


def _clock(ts: float | None, now: float) -> str:
    """``HH:MM:SS`` in UTC, with the date when it is not today's."""
    if ts is None:
        return "-"
    dt = datetime.fromtimestamp(ts, UTC)
    if dt.date() == datetime.fromtimestamp(now, UTC).date():
        return dt.strftime("%H:%M:%S")
    return dt.strftime("%Y-%m-%d %H:%M:%S")


def _duration(seconds: float) -> str:
    if seconds <= 0:
        return "0ms"
    if seconds < 0.001:
        return "<1ms"
    if seconds < 0.9995:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 59.95:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _clip(text: str, width: int | None) -> str:
    text = " ".join(text.split())
    if width is None or len(text) <= width:
        return text
    return text[: width - 1] + "…"


def _status_text(r: RunRecord) -> Text:
    label = "running (cancel requested)" if r.cancel_requested and r.status == "running" else None
    return Text(label or r.status, style=_STATUS_STYLE.get(r.status, ""))


def _step_summary(step: StepRecord | None) -> Text:
    if step is None:
        return Text("-")
    if step.kind == "step":
        text = Text(f"{step.seq} {step.name}")
    elif step.kind == step.name:  # sleep, now, uuid, random
        text = Text(f"{step.seq} {step.kind}")
    else:
        text = Text(f"{step.seq} {step.kind} {step.name}")
    # An unfinished wait is explained by the run's wait column; an unfinished step is not.
    if step.status != "completed" and (step.kind == "step" or step.status == "failed"):
        text.append(f" ({step.status})", style=_STEP_STYLE.get(step.status, ""))
    return text


def _wait_text(r: RunRecord, now: float) -> str:
    if r.status not in _SUSPENDED:
        return ""
    reason = r.wait_reason or r.status
    if r.wake_at is None:
        return reason
    if r.wake_at == WAKE_NOW:  # a signal made it due: the next worker's poll claims it
        return f"{reason}, due now"
    return f"{reason}, wakes {_clock(r.wake_at, now)}"


def _refusal_text(r: RunRecord, error: Any, now: float) -> str:
    """Why a run waits for a worker whose code can replay it (``wait_reason``
    ``replay``): the workers that refused it, how often, since when, and why."""
    refused = error.get("refused") if isinstance(error, dict) else None
    if r.wait_reason != "replay" or not isinstance(refused, dict):
        return ""
    since = float(refused.get("since") or now)
    parked = "; parked: no worker could replay it" if refused.get("parked") else ""
    return (
        f"left for a worker whose code can replay it: refused {refused.get('count')} time(s)"
        f" since {_clock(since, now)} UTC, last by {refused.get('worker') or '?'}{parked};"
        f" {error.get('step') or '?'}: {error.get('message', '')}"
    )


def _error_line(error: Any, width: int | None) -> str:
    if isinstance(error, dict):
        kind = str(error.get("type", "Error")).rsplit(".", 1)[-1]
        return _clip(f"{kind}: {error.get('message', '')}", width)
    return _clip(str(error), width)


def _print_steps(out: Console, steps: list[StepRecord], now: float, *, verbose: bool) -> None:
    if not steps:
        out.print("\nno steps journaled yet")
        return
    sessions = sorted({s.session for s in steps})
    width = None if verbose else _OUTPUT_WIDTH
    for session in sessions:
        title = f"session {session}" if len(sessions) > 1 else "steps"
        table = Table(box=None, pad_edge=False, header_style="bold")
        columns: tuple[tuple[str, JustifyMethod], ...] = (
            ("seq", "right"),
            ("kind", "left"),
            ("name", "left"),
            ("status", "left"),
            ("attempts", "right"),
            ("last error", "left"),
            ("output", "left"),
            ("started (UTC)", "left"),
            ("finished (UTC)", "left"),
            ("took", "right"),
        )
        for column, justify in columns:
            # -v: values wrap onto more lines, never cut to the terminal's width.
            wrap = verbose and column in ("last error", "output")
            table.add_column(column, justify=justify, overflow="fold" if wrap else "ellipsis")
        rows = [s for s in steps if s.session == session]
        for s in rows:
            error = _decode(s.error)
            table.add_row(
                str(s.seq),
                s.kind,
                s.name,
                Text(s.status, style=_STEP_STYLE.get(s.status, "")),
                str(s.attempt),
                Text(_error_line(error, width), style="red") if error is not None else "",
                _clip(s.output, width) if s.output is not None else "",
                _clock(s.started_at, now),
                _clock(s.finished_at, now),
                _duration(s.finished_at - s.started_at) if s.finished_at is not None else "",
            )
        out.print(Group(Text(f"\n{title}", style="bold"), table))
        if verbose:
            for s in rows:
                error = _decode(s.error)
                if isinstance(error, dict) and error.get("traceback"):
                    out.print(Text(f"\nstep {s.session}:{s.seq} {s.name} traceback:", style="bold"))
                    out.print(str(error["traceback"]).rstrip())
