"""Token-aware rate limiting against a provider that enforces its limit.

Twenty concurrent agent runs on two worker processes share one OpenAI account whose
fake server (``FakeOpenAIServer(tpm=..., period_s=...)``: continuously refilled token
buckets, real 429s, limits announced in ``x-ratelimit-*`` headers) enforces the limit,
with a "minute" of a few seconds. Printed side by side: mainspring's shared limiter
(a) with the limits declared, (b) with nothing declared (a cold start: limits learned
from the headers), (c) with nothing declared on an account that an outside consumer
shares, taking 30 % of the refill at random moments; then the App as a new user writes
it, ``ms.App()`` with nothing about rate limits, (d) as it is now (limits learned from
the headers by default) and (e) with them off (``rate_limits=False``, the default before
2026-12-07), both against a server with a real 60-second minute (``--default-tpm``
tokens a minute: the default assumes a provider's minute); then the peers, (f) a naive loop
on the official SDK's default retries (``max_retries=2``, its back-off, honouring
``retry-after``) and (g) a fixed-window token counter shared by the processes, as
litellm's router keeps (tokens counted per window after each reply, no reservation
for calls in flight). For each: runs succeeded, the 429s the server sent, the share of
the refill used ((tokens served - limit) / (limit x elapsed periods): the bucket starts
full), the p95 lateness of a booked slot (arrival at the server minus the booked
start), and the calls that failed even after the SDK's retries. A report: nothing is
asserted. ``python bench/rate_limit.py [--runs 20] [--turns 8] [--tpm 40000]
[--period 3] [--default-tpm 120000] [--cases mainspring,cold,shared,default,off,naive,window]
[--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import re
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
    done = _done(body)
    seed = zlib.crc32(json.dumps(body["messages"][1]).encode()) + done
    text = " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(40 + seed % 120))
    if done < TURNS - 1:
        return FakeOpenAIServer.tool_call("note", {"n": done}, text=text)
    return FakeOpenAIServer.tool_call("finish", {"answer": f"{done} steps"}, text=text)


def _done(body: Any) -> int:
    """The latest "step N recorded" (the agent's context may drop older turns)."""
    done = 0
    for m in body["messages"]:
        if m["role"] == "tool" and str(m.get("content", "")).startswith("step "):
            done = max(done, int(str(m["content"]).split()[1]) + 1)
    return done


# -- (a) mainspring ---------------------------------------------------------------------


def run_mainspring(
    args: argparse.Namespace, base_url: str, tmp: Path, *, limits: str
) -> dict[str, Any]:
    env = {
        **os.environ,
        "MAINSPRING_DATABASE_URL": f"sqlite:///{tmp / 'ms.db'}",
        "RATE_BENCH_BASE_URL": base_url,
        "RATE_BENCH_TPM": str(args.tpm),
        "RATE_BENCH_RPM": str(args.rpm),
        "RATE_BENCH_PERIOD_S": str(args.period),
        "RATE_BENCH_LIMITS": limits,
        "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")]),
    }
    os.environ.update({k: env[k] for k in env if k.startswith(("MAINSPRING_", "RATE_BENCH_"))})
    import importlib

    import _rate_app

    module = importlib.reload(_rate_app)  # the environment of this case
    app = module.app
    handles = [app.submit(module.worker_agent, f"{TASK} #{i}") for i in range(args.runs)]
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
    succeeded = 0
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            runs = [store.get_run(h.run_id) for h in handles]
            if all(r is not None and r.status in ("succeeded", "failed") for r in runs):
                succeeded = sum(1 for r in runs if r is not None and r.status == "succeeded")
                break
            time.sleep(0.1)
        slots = _booked_slots(store, [h.run_id for h in handles])
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(30)
        store.close()
        app.close()
    return {"succeeded": succeeded, "failed_calls": 0, "slots": slots}


def _booked_slots(store: SQLiteStore, run_ids: list[str]) -> dict[tuple[int, int], float]:
    """``(run number, turn) -> the booked start`` (wall clock) of each answered call:
    the last slot booked before the model step that completed."""
    slots: dict[tuple[int, int], float] = {}
    for number, run_id in enumerate(run_ids):
        wake_at: float | None = None
        turn = 0
        for step in store.load_steps(run_id):
            if step.name.startswith("rate:openai") and step.output:
                booking = json.loads(step.output)
                if not booking.get("retry"):
                    wake_at = booking["wake_at"]
            elif step.name.startswith("model:") and step.status == "completed":
                if wake_at is not None:
                    slots[(number, turn)] = wake_at
                turn += 1
    return slots


def _lateness(server: FakeOpenAIServer, slots: dict[tuple[int, int], float]) -> list[float]:
    """Seconds between each answered call's booked start and its arrival at the server."""
    offset = time.time() - server.now()  # server's clock (monotonic) -> wall clock
    refused = {index for _, _, index in server.refusals}
    late: list[float] = []
    for index, request in enumerate(server.requests):
        if index in refused:
            continue
        body: Any = request.body
        text = json.dumps(body["messages"])
        found = re.search(r"records: [a-z ]*#(\d+)", text)
        if found is None:
            continue
        key = (int(found.group(1)), _done(body))
        if key in slots:
            late.append(request.at + offset - slots[key])
    return late


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
    # The peers' loops retry a refused call until it passes: every run ends.
    return {"failed_calls": failed, "succeeded": args.runs, "slots": {}}


# -- the measurement ------------------------------------------------------------------


CASES = {
    # kind: (contender, what the App is told (RATE_BENCH_LIMITS; None: a peer), outside
    # consumer's share, a real 60-second minute)
    "mainspring": ("mainspring, limits declared", "declared", 0.0, False),
    "cold": ("mainspring, undeclared (cold start)", "learned", 0.0, False),
    "shared": ("mainspring, undeclared, shared account", "learned", 0.3, False),
    "default": ("mainspring, default App (60 s minute)", "default", 0.0, True),
    "off": ("mainspring, rate_limits=False (60 s minute)", "off", 0.0, True),
    "naive": ("naive + SDK retries", None, 0.0, False),
    "window": ("fixed window (litellm)", None, 0.0, False),
}


def measure(kind: str, args: argparse.Namespace, log: Console) -> dict[str, Any]:
    name, limits, outside, minute = CASES[kind]
    tpm, period = (args.default_tpm, 60.0) if minute else (args.tpm, args.period)
    with (
        tempfile.TemporaryDirectory(prefix=f"rate-bench-{kind}-") as tmp,
        FakeOpenAIServer(
            fallback=reply,
            tpm=tpm,
            rpm=args.rpm,
            period_s=period,
            outside_share=outside,
            outside_seed=1,
        ) as server,
    ):
        log.print(
            f"[dim]{name}: {args.runs} runs x {args.turns} calls on {args.workers} processes..."
        )
        if limits is not None:
            extra = run_mainspring(args, server.base_url, Path(tmp), limits=limits)
        else:
            extra = run_peer(kind, args, server.base_url, Path(tmp))
        slots = extra.pop("slots")
        late = sorted(_lateness(server, slots)) if slots else []
        served = list(server.served_usage)
        tokens = sum(i + o for _, i, o in served)
        first = min(t for t, _, _ in served)
        last = max(t for t, _, _ in served)
        others = sum(e.get("tpm", 0.0) for t, e in server.outside_events if first <= t <= last)
        # The first call's own time: it was admitted just before it was recorded.
        periods = (last - first) / period
        # The bucket starts full: past its first TPM, only the refill is there (and the
        # outside consumer's share of it is used too, by someone).
        used = tokens + others
        return {
            "kind": kind,
            "name": name,
            "calls": len(served),
            "tokens": tokens,
            "outside_tokens": round(others),
            "elapsed_s": round(last - first, 2),
            "periods": round(periods, 2),
            "tpm": tpm,
            "period_s": period,
            "share": used / (tpm * periods) if periods > 0 else float("nan"),
            "physical": (periods + 1) / periods if periods > 0 else float("nan"),
            "refill_share": (used - tpm) / (tpm * periods) if periods > 0 else float("nan"),
            "too_many_requests": server.too_many_requests,
            "p95_late_s": late[min(len(late) - 1, math.ceil(0.95 * len(late)) - 1)]
            if late
            else None,
            **extra,
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
    p.add_argument(
        "--default-tpm",
        type=float,
        default=120_000,
        help="TPM of the server with a real 60 s minute (the default and off cases)",
    )
    p.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}"
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = p.parse_args()
    TURNS = args.turns
    log = Console(stderr=True, width=160)
    rows = [measure(kind, args, log) for kind in args.cases.split(",")]
    ours = rows[0]
    table = Table(
        title=f"{args.runs} runs x {args.turns} calls, {args.workers} worker processes, "
        f"TPM {args.tpm:g} per {args.period:g} s (fake OpenAI, enforcing; the 60 s minute "
        f"cases: TPM {args.default_tpm:g})"
    )
    columns = ["contender", "runs succeeded", "calls", "429s", "share of refill"]
    columns += ["p95 lateness", "failed calls", "periods", "refill share / first"]
    for col in columns:
        table.add_column(col, justify="left" if col == "contender" else "right")
    for r in rows:
        table.add_row(
            r["name"],
            f"{r['succeeded']} / {args.runs}",
            str(r["calls"]),
            str(r["too_many_requests"]),
            f"{r['refill_share']:.1%}",
            "-" if r["p95_late_s"] is None else f"{r['p95_late_s'] * 1000:.0f} ms",
            str(r["failed_calls"]),
            f"{r['periods']:.1f}",
            f"{r['refill_share'] / ours['refill_share']:.2f}",
        )
    log.print(table)
    log.print(
        "share of refill = (tokens served - TPM) / (TPM x periods, first to last reply): "
        "what was used of the capacity the refill added (physical maximum 100 %; the "
        "bucket starts full); in the shared case, the outside consumer's tokens count as "
        "used. p95 lateness = an answered call's arrival at the server minus the start "
        "its booking gave (negative: early). Target (DESIGN.md §10): >= 90 % of the "
        "refill, zero 429s with limits declared or announced only in headers."
    )
    if args.json:
        print(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
