"""Token-aware rate limiting against a provider that enforces its limit.

Twenty concurrent agent runs on two worker processes share one OpenAI account whose
fake server (``FakeOpenAIServer(tpm=..., period_s=...)``: continuously refilled token
buckets, real 429s) enforces the limit, with a "minute" of a few seconds. Printed side
by side: (a) mainspring's shared limiter, (b) a naive loop on the official SDK's
default retries (``max_retries=2``, its back-off, honouring ``retry-after``), (c) a
fixed-window token counter shared by the processes, as litellm's router keeps (tokens
counted per window after each reply, no reservation for calls in flight). For each:
the share of the token limit used (tokens served / (limit x elapsed periods), where the
bucket starts full, so the physical maximum is (periods + 1) / periods), the 429s the
server sent, and the calls that failed even after the SDK's retries. A report: nothing
is asserted. ``python bench/rate_limit.py [--runs 20] [--turns 8] [--tpm 40000]
[--period 3] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from mainspring.storage import SQLiteStore
from mainspring.testing import FakeOpenAIServer, FakeReply, RecordedRequest

BENCH = Path(__file__).resolve().parent
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
]
TASK = "Process the batch of records: " + " ".join(WORDS * 30)
PAD = " ".join(WORDS * 25)
MODEL = "gpt-4.1-mini"
MAX_TOKENS = 400
TURNS = 8  # set by main() before any server starts


def reply(request: RecordedRequest) -> FakeReply:
    """Call note until the run has made TURNS - 1 calls, then finish; replies of 40 to
    160 words, so that output reservations matter."""
    body: Any = request.body
    # The latest "step N recorded" (the agent's context may drop older turns).
    done = 0
    for m in body["messages"]:
        if m["role"] == "tool" and str(m.get("content", "")).startswith("step "):
            done = max(done, int(str(m["content"]).split()[1]) + 1)
    seed = zlib.crc32(json.dumps(body["messages"][1]).encode()) + done
    text = " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(40 + seed % 120))
    if done < TURNS - 1:
        return FakeOpenAIServer.tool_call("note", {"n": done}, text=text)
    return FakeOpenAIServer.tool_call("finish", {"answer": f"{done} steps"}, text=text)


# -- (a) mainspring ---------------------------------------------------------------------


def run_mainspring(args: argparse.Namespace, base_url: str, tmp: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "MAINSPRING_DATABASE_URL": f"sqlite:///{tmp / 'ms.db'}",
        "RATE_BENCH_BASE_URL": base_url,
        "RATE_BENCH_TPM": str(args.tpm),
        "RATE_BENCH_RPM": str(args.rpm),
        "RATE_BENCH_PERIOD_S": str(args.period),
        "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")]),
    }
    os.environ.update({k: env[k] for k in env if k.startswith(("MAINSPRING_", "RATE_BENCH_"))})
    import _rate_app

    app = _rate_app.app
    handles = [app.submit(_rate_app.worker_agent, f"{TASK} #{i}") for i in range(args.runs)]
    store = SQLiteStore(tmp / "ms.db")
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "mainspring", "worker", "_rate_app:app"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(args.workers)
    ]
    failed = 0
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            runs = [store.get_run(h.run_id) for h in handles]
            if all(r is not None and r.status in ("succeeded", "failed") for r in runs):
                failed = sum(1 for r in runs if r is None or r.status != "succeeded")
                break
            time.sleep(0.1)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(30)
        store.close()
    return {"failed_calls": 0, "failed_runs": failed}


# -- the peers: one asyncio loop per process, runs // workers runs in each ------------


def _messages(i: int, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        # As long as the agent's prompt (instructions, tool schemas): the same calls.
        {"role": "system", "content": "Work through the batch, one step a call. " + PAD},
        {"role": "user", "content": f"{TASK} #{i}"},
        *history,
    ]


def _tokens(messages: list[dict[str, Any]]) -> int:
    return math.ceil(len(json.dumps(messages)) / 4)  # the fake server's own count


class FixedWindow:
    """Tokens counted per window in a file every process shares (litellm's router keeps
    them in Redis): a call goes when the window's count plus its prompt fits the limit,
    and adds its reported usage after the reply; nothing is reserved for calls in flight."""

    def __init__(self, path: Path, tpm: float, period: float) -> None:
        self.db = sqlite3.connect(path, timeout=30, isolation_level=None)
        self.db.execute("CREATE TABLE IF NOT EXISTS w (window INTEGER PRIMARY KEY, used REAL)")
        self.tpm, self.period = tpm, period

    async def wait(self, prompt: int) -> None:
        while True:
            window = int(time.time() // self.period)
            row = self.db.execute("SELECT used FROM w WHERE window = ?", (window,)).fetchone()
            if (row[0] if row else 0.0) + prompt <= self.tpm:
                return
            await asyncio.sleep((window + 1) * self.period - time.time() + 0.001)

    def add(self, tokens: int) -> None:
        window = int(time.time() // self.period)
        self.db.execute(
            "INSERT INTO w VALUES (?, ?) ON CONFLICT (window) DO UPDATE SET used = used + ?",
            (window, tokens, tokens),
        )


async def _peer_runs(kind: str, first: int, count: int, args: dict[str, Any]) -> int:
    import openai

    client = openai.AsyncOpenAI(api_key="sk-test", base_url=args["base_url"], max_retries=2)
    window = FixedWindow(Path(args["window_db"]), args["tpm"], args["period"])
    failed = 0

    async def one(i: int) -> None:
        nonlocal failed
        history: list[dict[str, Any]] = []
        for turn in range(args["turns"]):
            messages = _messages(i, history)
            while True:
                if kind == "window":
                    await window.wait(_tokens(messages))
                try:
                    out = await client.chat.completions.create(
                        model=MODEL, messages=messages, max_tokens=MAX_TOKENS
                    )
                    break
                except openai.RateLimitError:
                    failed += 1  # the SDK gave up after its retries: the app tries again
            if kind == "window" and out.usage is not None:
                window.add(out.usage.prompt_tokens + out.usage.completion_tokens)
            text = out.choices[0].message.content or ""
            history += [
                {"role": "assistant", "content": text},
                {"role": "tool", "tool_call_id": f"c{turn}", "content": f"step {turn} recorded"},
            ]

    await asyncio.gather(*(one(i) for i in range(first, first + count)))
    await client.close()
    return failed


def _peer_process(kind: str, first: int, count: int, args: dict[str, Any], out: Any) -> None:
    out.put(asyncio.run(_peer_runs(kind, first, count, args)))


def run_peer(kind: str, args: argparse.Namespace, base_url: str, tmp: Path) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    shared = {
        "base_url": base_url,
        "turns": args.turns,
        "tpm": args.tpm,
        "period": args.period,
        "window_db": str(tmp / f"{kind}-window.db"),
    }
    per = args.runs // args.workers
    procs = [
        ctx.Process(target=_peer_process, args=(kind, w * per, per, shared, results))
        for w in range(args.workers)
    ]
    for p in procs:
        p.start()
    failed = sum(results.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(30)
    return {"failed_calls": failed, "failed_runs": 0}


# -- the measurement ------------------------------------------------------------------


def measure(kind: str, args: argparse.Namespace, log: Console) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix=f"rate-bench-{kind}-") as tmp,
        FakeOpenAIServer(
            fallback=reply, tpm=args.tpm, rpm=args.rpm, period_s=args.period
        ) as server,
    ):
        log.print(
            f"[dim]{kind}: {args.runs} runs x {args.turns} calls on {args.workers} processes..."
        )
        if kind == "mainspring":
            extra = run_mainspring(args, server.base_url, Path(tmp))
        else:
            extra = run_peer(kind, args, server.base_url, Path(tmp))
        served = list(server.served_usage)
        tokens = sum(i + o for _, i, o in served)
        first = min(t for t, _, _ in served)
        last = max(t for t, _, _ in served)
        # The first call's own time: it was admitted just before it was recorded.
        periods = (last - first) / args.period
        return {
            "kind": kind,
            "calls": len(served),
            "tokens": tokens,
            "elapsed_s": round(last - first, 2),
            "periods": round(periods, 2),
            "share": tokens / (args.tpm * periods) if periods > 0 else float("nan"),
            "physical": (periods + 1) / periods if periods > 0 else float("nan"),
            # The bucket starts full: past its first TPM, only the refill is there.
            "refill_share": (tokens - args.tpm) / (args.tpm * periods)
            if periods > 0
            else float("nan"),
            "too_many_requests": server.too_many_requests,
            **extra,
        }


NAMES = {
    "mainspring": "mainspring",
    "naive": "naive + SDK retries",
    "window": "fixed window (litellm)",
}


def main() -> None:
    global TURNS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--tpm", type=float, default=40_000)
    p.add_argument("--rpm", type=float, default=600)
    p.add_argument("--period", type=float, default=3.0, help="seconds per 'minute'")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = p.parse_args()
    TURNS = args.turns
    log = Console(stderr=True, width=160)
    rows = [measure(kind, args, log) for kind in ("mainspring", "naive", "window")]
    ours = rows[0]
    table = Table(
        title=f"{args.runs} runs x {args.turns} calls, {args.workers} worker processes, "
        f"TPM {args.tpm:g} per {args.period:g} s (fake OpenAI, enforcing)"
    )
    columns = ["contender", "calls", "tokens", "periods", "share of limit", "physical max"]
    columns += ["share of refill", "429s", "failed", "refill share / mainspring"]
    for col in columns:
        table.add_column(col, justify="left" if col == "contender" else "right")
    for r in rows:
        table.add_row(
            NAMES[r["kind"]],
            str(r["calls"]),
            f"{r['tokens']:,}",
            f"{r['periods']:.1f}",
            f"{r['share']:.1%}",
            f"{r['physical']:.1%}",
            f"{r['refill_share']:.1%}",
            str(r["too_many_requests"]),
            str(r["failed_calls"] + r["failed_runs"]),
            f"{r['refill_share'] / ours['refill_share']:.2f}",
        )
    log.print(table)
    log.print(
        "share of limit = tokens served / (TPM x elapsed periods, first to last reply); "
        "the bucket starts full, so the physical maximum is (periods + 1) / periods. "
        "share of refill = (tokens served - TPM) / (TPM x periods): what was used of the "
        "capacity the refill added (physical maximum 100 %). "
        "Target (DESIGN.md §10): >= 95 % used, zero 429s."
    )
    if args.json:
        print(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
