"""Prompt tokens under mainspring's context policy vs full-history resend; loop overhead.

Table 1: total and largest prompt tokens of an agent reading a ~1 KB page per turn, as the
model received them (``ScriptedModel.requests``), beside the same turns resent in full.
Table 2: µs per agent turn of ``await app.run(agent, ...)`` with an instant model and tool,
beside a bare Python loop making the same calls. A report: nothing is asserted.
``python bench/context_tokens.py [--quick] [--json]`` (``--json``: tables on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

import mainspring as ms
from mainspring.context import ContextPolicy, History, Turn
from mainspring.models import (
    AssistantMessage,
    Message,
    ModelResponse,
    SystemMessage,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from mainspring.models._common import estimate_input_tokens
from mainspring.storage import SQLiteStore
from mainspring.testing import ScriptedModel

Sync = Literal["NORMAL", "FULL"]
Policy = ContextPolicy | None
POLICIES = {"default": ContextPolicy(), "budget 2000": ContextPolicy(max_input_tokens=2000)}
TASK, INSTRUCTIONS = "Read the book, one page per turn.", "You read books."
WARMUP = 20


def read_page(page: int) -> str:
    """Read one page of the book (about 1 KB of text)."""
    return f"page {page}: " + "lorem ipsum dolor sit amet " * 38


async def ping(i: int) -> str:
    """An instant tool."""
    return f"pong {i}"


def fresh_app(tmp: str, sync: Sync) -> ms.App:
    return ms.App(SQLiteStore(Path(tmp) / "bench.db", synchronous=sync))


def make_agent(
    app: ms.App, name: str, model: ScriptedModel, tool: ms.Tool[Any, Any], p: Policy = None
) -> ms.Workflow[[str], ms.AgentResult]:
    """An agent with no step cap (the default is 50 turns)."""
    limits, text = ms.Limits(max_steps=None), INSTRUCTIONS
    return app.agent(name, model=model, instructions=text, tools=[tool], limits=limits, context=p)


def script(tool: str, arg: str, n: int, usage: Usage | None = None) -> list[ModelResponse]:
    """n calls of ``tool`` then ``finish``; a fixed ``usage`` spares the token estimate."""
    turns = [ScriptedModel.call(tool, {arg: i}) for i in range(n)]
    turns.append(ScriptedModel.call("finish", {"answer": "done"}))
    return [dataclasses.replace(t, usage=usage) for t in turns] if usage else turns


async def tokens(n: int) -> dict[str, Any]:
    """One n-turn run per policy; the naive resend rebuilt from the default run's turns."""
    out: dict[str, Any] = {"turns": n}
    for key, policy in POLICIES.items():
        with tempfile.TemporaryDirectory(prefix="ms-ctx-") as tmp:
            app = fresh_app(tmp, "NORMAL")
            model = ScriptedModel(script("read_page", "page", n))
            agent = make_agent(app, "reader", model, app.tool(read_page), policy)
            result = await app.run(agent, TASK)
            specs = app.agents["reader"].tool_specs()
            app.close()
        sizes = [estimate_input_tokens(r.messages, specs) for r in model.requests]
        out[key] = {"total": sum(sizes), "max": max(sizes), "requests": len(sizes)}
        out[key] |= {"reported": result.input_tokens, "status": result.status}
        if key == "default":
            received = [r.messages for r in model.requests]
    # The run's turns in order (each is in the next request: 4 are kept verbatim), then
    # resent whole: request k carries turns 0..k-1, as a naive loop would send them.
    turns: dict[str, Turn] = {}
    for m in (m for messages in received for m in messages):
        if isinstance(m, AssistantMessage) and m.tool_calls:
            turns.setdefault(m.tool_calls[0].id, Turn(assistant=m))
        elif isinstance(m, ToolResultMessage) and m.tool_call_id in turns:
            turns[m.tool_call_id].results[:] = [m]
    system = received[0][0]
    instructions = system.content if isinstance(system, SystemMessage) else INSTRUCTIONS
    history, sizes = History(), []
    for turn in [*turns.values(), None]:  # len(received) == len(turns) + 1 requests
        full = history.full_messages(instructions=instructions, task=TASK)
        sizes.append(estimate_input_tokens(full, specs))
        if turn is not None:
            history.add(turn)
    out["naive"] = {"total": sum(sizes), "max": max(sizes), "requests": len(sizes)}
    out["naive"]["turns_rebuilt"] = len(turns)
    return out


async def mainspring_loop(sync: Sync, n: int) -> float:
    """Seconds of ``await app.run(agent, ...)``: n ping turns + finish, after a warm-up."""
    with tempfile.TemporaryDirectory(prefix="ms-ctx-") as tmp:
        app = fresh_app(tmp, sync)
        tool = app.tool(ping)
        usage = Usage(input_tokens=1, output_tokens=1)
        agents = {
            name: make_agent(app, name, ScriptedModel(script("ping", "i", turns, usage)), tool)
            for name, turns in (("warmup", WARMUP), ("timed", n))
        }
        await app.run(agents["warmup"], TASK)
        t0 = time.perf_counter()
        await app.run(agents["timed"], TASK)
        seconds = time.perf_counter() - t0
        app.close()
    return seconds


async def bare_loop(n: int) -> float:
    """The same calls without mainspring: a list of messages, resent whole each turn."""
    agent = ms.Agent("bare", model=ScriptedModel([]), instructions="", tools=[ms.tool(ping)])
    tool_specs = agent.tool_specs()  # the same tools as mainspring's agent is told of
    model = ScriptedModel(script("ping", "i", n, Usage(input_tokens=1, output_tokens=1)))
    t0 = time.perf_counter()
    messages: list[Message] = [SystemMessage(content=INSTRUCTIONS), UserMessage(content=TASK)]
    done = False
    while not done:
        response = await model.request(messages, tools=tool_specs)
        messages.append(AssistantMessage(text=response.text, tool_calls=response.tool_calls))
        for call in response.tool_calls:
            args = json.loads(call.arguments)
            done = call.name == "finish"
            content = "accepted" if done else await ping(**args)
            result = ToolResultMessage(tool_call_id=call.id, name=call.name, content=content)
            messages.append(result)
    return time.perf_counter() - t0


async def overhead(n: int, repeat: int) -> dict[str, Any]:
    """Median seconds per loop over ``repeat`` fresh databases."""
    out: dict[str, Any] = {"turns": n, "steps": 2 * n + 1}
    await bare_loop(WARMUP)
    out["bare"] = statistics.median([await bare_loop(n) for _ in range(repeat)])
    for sync in ("NORMAL", "FULL"):
        out[sync] = statistics.median([await mainspring_loop(sync, n) for _ in range(repeat)])
    return out


def table(title: str, columns: str, caption: str, rows: list[list[str]]) -> Table:
    t = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    t.min_width = len(title)
    for i, col in enumerate(columns.split("|")):
        t.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*row)
    return t


def render(r: dict[str, Any], con: Console) -> None:
    m = r["machine"]
    con.print(
        f"[bold]mainspring {ms.__version__}[/] · {m['cores']} cores · Python {m['python']}"
        f" · SQLite {m['sqlite']} · {m['platform']}"
    )
    rows = []
    for x in r["tokens"]:
        naive, d, b = x["naive"], x["default"], x["budget 2000"]
        ok = "[green]met[/]" if naive["total"] / d["total"] >= 10 else "[red]missed[/]"
        ok = ok if x["turns"] == 200 else ""
        totals = [f"{naive['total']:,}", f"{d['total']:,}", f"{naive['total'] / d['total']:.1f}×"]
        totals += [f"{b['total']:,}", f"{naive['total'] / b['total']:.1f}×"]
        rows.append([f"{x['turns']:,}", *totals, *(f"{y['max']:,}" for y in (naive, d, b)), ok])
    con.print(
        table(
            "1. Prompt tokens, agent reading a ~1 KB page per turn, then finish",
            "turns|full resend|default policy|× fewer|budget 2000|× fewer|largest: full"
            "|largest: default|largest: budget|≥ 10× at 200",
            "estimate_input_tokens(messages, tool specs) of every request the ScriptedModel "
            "received (turns + 1 requests);\nfull resend: the same turns in a History, "
            "full_messages() before each request",
            rows,
        )
    )
    o, rows = r["overhead"], []
    bare = o["bare"] / (o["turns"] + 1) * 1e6
    rows.append(["bare Python loop (no journal, full resend)", "—", f"{bare:,.1f}", "", "1.00×"])
    for sync in ("NORMAL", "FULL"):
        turn, step = o[sync] / (o["turns"] + 1) * 1e6, o[sync] / o["steps"] * 1e6
        name = "mainspring await app.run(...)"
        rows.append([name, sync, f"{turn:,.1f}", f"{step:,.1f}", f"{turn / bare:,.1f}×"])
    con.print(
        table(
            f"2. Loop overhead, {o['turns']:,} turns + finish, instant ScriptedModel and tool",
            "loop|sync|µs/turn|µs/journaled step|× bare",
            f"each tool turn journals 2 steps (model + tool): {o['steps']:,} steps; "
            f"median of {r['args']['repeat']} fresh SQLite WAL files; includes app.run's submit, "
            "claim and finish",
            rows,
        )
    )


async def measure(args: argparse.Namespace, log: Console) -> dict[str, Any]:
    r: dict[str, Any] = {"tokens": []}
    for n in args.turns:
        log.print(f"[dim]· tokens, {n} turns…")
        r["tokens"].append(await tokens(n))
    log.print(f"[dim]· loop overhead, {args.overhead_turns} turns…")
    r["overhead"] = await overhead(args.overhead_turns, args.repeat)
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, nargs="+", default=[50, 100, 200, 500], help="table 1")
    p.add_argument("--overhead-turns", type=int, default=500, help="table 2")
    p.add_argument("--repeat", type=int, default=3, help="fresh files per timing (median)")
    p.add_argument("--quick", action="store_true", help="small sizes: a few seconds")
    p.add_argument("--json", action="store_true", help="JSON on stdout, tables on stderr")
    args = p.parse_args()
    if args.quick:
        args.turns, args.overhead_turns, args.repeat = [50, 200], 100, 1
    log = Console(stderr=True)
    result = asyncio.run(measure(args, log))
    result["args"] = {k: getattr(args, k) for k in ("turns", "overhead_turns", "repeat")}
    result["machine"] = dict(cores=os.cpu_count(), python=platform.python_version())
    result["machine"] |= dict(sqlite=sqlite3.sqlite_version, platform=platform.platform(terse=True))
    con = Console(stderr=args.json)
    if not con.is_terminal:
        con.width = 150
    render(result, con)
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
