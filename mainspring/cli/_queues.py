"""``mainspring queues``: each queue's limits and how many of its runs are running,
queued and waiting."""

from __future__ import annotations

import dataclasses

from rich.table import Table

from ._common import AppOption, DbOption, JsonOption, cli_errors, console, open_app, print_json

__all__ = ["queues"]


def queues(db: DbOption = None, app_spec: AppOption = None, as_json: JsonOption = False) -> None:
    """List queues: their limits, and their runs running, retrying (sleeping on a
    retry back-off: each keeps its slot), queued and waiting (sleeping or waiting)."""
    with cli_errors(), open_app(db, app_spec) as app:
        found = app.queues.list()
    if as_json:
        print_json({"queues": [dataclasses.asdict(q) for q in found]})  # the records as they are
        return
    out = console()
    if not found:
        out.print("no queues yet (declare one with app.queues.add(...) and submit to it)")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    columns = ("queue", "running", "retrying", "queued", "waiting", "concurrency", "per key")
    for column in (*columns, "rate/s"):
        table.add_column(column, no_wrap=True, justify="left" if column == "queue" else "right")
    for q in found:
        table.add_row(
            q.name,
            str(q.running),
            str(q.retrying),
            str(q.queued),
            str(q.waiting),
            "-" if q.concurrency is None else str(q.concurrency),
            "-" if q.per_key is None else str(q.per_key),
            "-"
            if q.rate is None
            else f"{q.rate:g}" + (f" (burst {q.burst})" if q.burst > 1 else ""),
        )
    out.print(table)
