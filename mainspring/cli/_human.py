"""``mainspring pending``, ``approve`` and ``answer``: humans in the loop from a shell."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from .. import App, ConfigError, MainspringError
from ..hitl import Request
from ._common import AppOption, DbOption, JsonOption, cli_errors, console, open_app, print_json
from ._runs import _parse_json

__all__ = ["answer", "approve", "pending"]


def _request_json(r: Request) -> dict[str, Any]:
    return r.to_json()


def pending(
    run_id: Annotated[
        str | None, typer.Argument(metavar="[RUN]", help="Only this run's requests.")
    ] = None,
    db: DbOption = None,
    app_spec: AppOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the requests waiting for a human: what, why, since when."""
    with cli_errors(), open_app(db, app_spec) as app:
        if run_id is not None:
            run_id = app.resolve_run_id(run_id)  # a unique prefix will do
        requests = app.requests(run_id)
    if as_json:
        print_json([_request_json(r) for r in requests])
        return
    if not requests:
        console().print("no pending requests")
        return
    table = Table("run", "request", "kind", "what", "waiting", "deadline")
    now = time.time()
    for r in requests:
        preview = "" if r.preview is None else f"\n{_short(r.preview)}"
        choices = f"\nchoices: {', '.join(r.choices)}" if r.choices else ""
        deadline = "-" if r.deadline is None else f"in {_ago(r.deadline - now)}"
        table.add_row(
            r.run_id, r.id, r.kind, r.title + preview + choices, _ago(now - r.created_at), deadline
        )
    console().print(table)


def approve(
    run_id: Annotated[
        str | None, typer.Argument(metavar="RUN", help="The run's id (not with --all-pending).")
    ] = None,
    request_id: Annotated[
        str | None,
        typer.Argument(metavar="REQUEST", help="The request's id (see `mainspring pending`)."),
    ] = None,
    edit: Annotated[
        str | None,
        typer.Option("--edit", metavar="JSON", help="Approve with these arguments instead."),
    ] = None,
    reject: Annotated[
        str | None,
        typer.Option("--reject", metavar="REASON", help="Reject, with a reason the run sees."),
    ] = None,
    all_pending: Annotated[
        bool,
        typer.Option(
            "--all-pending",
            help="Decide every pending approval:... request (not questions, budgets,"
            " checkpoints or resumes: each needs its own answer).",
        ),
    ] = False,
    workflow: Annotated[
        str | None,
        typer.Option(
            "--workflow", metavar="NAME", help="With --all-pending: only this workflow's."
        ),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="With --all-pending: do not ask to confirm.")
    ] = False,
    db: DbOption = None,
    app_spec: AppOption = None,
    as_json: JsonOption = False,
) -> None:
    """Approve a request (or --reject REASON, or approve with --edit JSON arguments).
    The decision is recorded as your user name's. --all-pending decides every
    pending approval at once (--workflow narrows it), after listing them."""
    with cli_errors():
        if edit is not None and reject is not None:
            raise ConfigError("choose one of --edit and --reject")
        arguments = None
        decision = "approve"
        if edit is not None:
            arguments = _parse_json(edit, "--edit", dict, "a JSON object of arguments")
            decision = "edit"
        if reject is not None:
            decision = "reject"
        if all_pending:
            if run_id is not None or request_id is not None:
                raise ConfigError("--all-pending decides every pending approval: give no RUN")
            if edit is not None:
                raise ConfigError("--edit applies to one request: name it, not --all-pending")
            _decide_all(decision, reject, workflow, yes, db, app_spec, as_json)
            return
        if workflow is not None or yes:
            raise ConfigError("--workflow and --yes go with --all-pending")
        if run_id is None or request_id is None:
            raise ConfigError(
                "name the run and the request (see `mainspring pending`), or pass --all-pending"
            )
        with open_app(db, app_spec) as app:
            run_id = app.resolve_run_id(run_id)  # a unique prefix will do
            request = app.answer(
                run_id,
                request_id,
                decision=decision,  # type: ignore[arg-type]
                reason=reject,
                arguments=arguments,
            )
    _done(request, decision, as_json)


def _decide_all(
    decision: str,
    reason: str | None,
    workflow: str | None,
    yes: bool,
    db: str | None,
    app_spec: str | None,
    as_json: bool,
) -> None:
    """Approve (or reject) every pending approval, one by one: one answered meanwhile
    (by someone else, or a run that ended) is reported and the others still decided."""
    out = console()
    with open_app(db, app_spec) as app:
        chosen = [
            r
            for r in app.requests()
            # Approvals only: a budget, checkpoint or resume request is a decision
            # about money or a broken key, each worth its own look.
            if r.id.startswith("approval:") and (workflow is None or r.workflow == workflow)
        ]
        if not chosen:
            if as_json:
                print_json({"decision": decision, "decided": [], "failed": []})
            else:
                out.print("no pending approvals" + (f" of {workflow!r}" if workflow else ""))
            return
        if not yes:
            for r in chosen:
                out.print(f"  {r.run_id}  {r.id}  {r.title}")
            if not typer.confirm(f"{decision} these {len(chosen)} request(s)?"):
                raise typer.Exit(1)
        decided, failed = _answer_each(app, chosen, decision, reason)
    if as_json:
        print_json({"decision": decision, "decided": decided, "failed": failed})
    else:
        _print_decided(out, decision, decided, failed)
    if failed:
        raise typer.Exit(2)


def _print_decided(
    out: Console, decision: str, decided: list[dict[str, Any]], failed: list[dict[str, Any]]
) -> None:
    for d in decided:
        out.print(f"{decision}: request {d['request']!r} of run {d['run_id']}")
    for f in failed:
        out.print(f"not decided: request {f['request']!r} of run {f['run_id']}: {f['error']}")
    out.print(f"{len(decided)} decided; the runs resume on the next free workers")


def _answer_each(
    app: App, chosen: list[Request], decision: str, reason: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(decided, failed)``: each request answered on its own, so that one answered
    meanwhile fails alone."""
    decided: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for r in chosen:
        try:
            app.answer(
                r.run_id,
                r.id,
                decision=decision,  # type: ignore[arg-type]
                reason=reason,
            )
        except MainspringError as exc:
            failed.append({"run_id": r.run_id, "request": r.id, "error": str(exc)})
            continue
        decided.append({"run_id": r.run_id, "request": r.id})
    return decided, failed


def answer(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run's id.")],
    request_id: Annotated[
        str, typer.Argument(metavar="REQUEST", help="The question's id (see `mainspring pending`).")
    ],
    text: Annotated[str, typer.Argument(metavar="TEXT", help="The answer.")],
    db: DbOption = None,
    app_spec: AppOption = None,
    as_json: JsonOption = False,
) -> None:
    """Answer a question a run asked."""
    with cli_errors(), open_app(db, app_spec) as app:
        run_id = app.resolve_run_id(run_id)  # a unique prefix will do
        request = app.answer(run_id, request_id, answer=text)
    _done(request, "answer", as_json)


def _done(request: Request, decision: str, as_json: bool) -> None:
    if as_json:
        print_json({"run_id": request.run_id, "request": request.id, "decision": decision})
        return
    console().print(
        f"{decision}: request {request.id!r} of run {request.run_id} ({request.title});"
        " the run resumes on the next free worker"
    )


def _short(value: Any, limit: int = 200) -> str:
    import json

    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"
