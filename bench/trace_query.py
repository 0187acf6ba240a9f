"""Trace query time of a 1,000-step agent run, and a metrics scrape over it.

Journals a scripted agent run of 501 model turns and 500 tool calls (1,001 steps,
tokens on every model step) on SQLite, then times ``app.observe.trace(run_id)`` (load the
journal and build the entries), ``app.observe.diagnose(run_id)`` and a ``/metrics`` render,
median of ``--repeat`` timings. A report: nothing is asserted.
``python bench/trace_query.py [--turns 501] [--repeat 7]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import mainspring as ms
from mainspring.models import ModelResponse, Usage
from mainspring.observability import MetricsCollector
from mainspring.testing import ScriptedModel


def _median_ms(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--turns", type=int, default=501, help="model turns (all but the last with a tool call)"
    )
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        app = ms.App(f"sqlite:///{Path(tmp) / 'trace.db'}", inline_wait_s=0.0)

        @app.tool
        def lookup(ticket: int) -> dict[str, object]:
            """Read a ticket."""
            return {"ticket": ticket, "text": "printer on fire " * 8}

        turns = [
            ModelResponse(
                tool_calls=ScriptedModel.call("lookup", {"ticket": n}).tool_calls,
                usage=Usage(input_tokens=1000 + n, output_tokens=50),
            )
            for n in range(args.turns - 1)
        ]
        turns.append(ScriptedModel.call("finish", {"answer": "done"}))
        agent = app.agent(
            "bench",
            model=ScriptedModel(turns),
            instructions="x",
            tools=[lookup],
            limits=ms.Limits(max_steps=args.turns + 1),
        )
        t0 = time.perf_counter()
        await app.run(agent, "read every ticket")
        run_s = time.perf_counter() - t0
        run_id = app.list_runs()[0].id
        steps = len(app.observe.steps(run_id))
        load_ms = _median_ms(lambda: app.store.load_steps(run_id), args.repeat)
        trace_ms = _median_ms(lambda: app.observe.trace(run_id), args.repeat)
        doctor_ms = _median_ms(lambda: app.observe.diagnose(run_id), args.repeat)
        collector = MetricsCollector(app.store)
        first_scrape_ms = _median_ms(lambda: MetricsCollector(app.store).render(), args.repeat)
        collector.render()
        cached_scrape_ms = _median_ms(collector.render, args.repeat)
        app.close()
    print(f"journaled run: {steps} steps in {run_s:.2f}s (SQLite, FULL)")
    print(f"load_steps (the raw journal):          {load_ms:7.2f} ms")
    print(f"app.observe.trace(run_id):                     {trace_ms:7.2f} ms")
    print(f"app.observe.diagnose(run_id) (trace + doctor): {doctor_ms:7.2f} ms")
    print(f"/metrics render, cold collector:       {first_scrape_ms:7.2f} ms")
    print(f"/metrics render, finished run cached:  {cached_scrape_ms:7.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
