"""What live token streams cost a model step: the same agent step with and without
streaming, on SQLite and (with ``--db postgresql://...``) PostgreSQL.

A scripted model hands out a reply of ``--chars`` characters in ``--piece``-character
deltas, ``--delta-ms`` apart (a provider's pace: ~4 characters every 10-20 ms), once
streaming and once with the same pacing but its deltas dropped (no stream rows).
Printed: the step's wall time each way, the stream rows written (batches), the time
spent inside those writes, and the per-step overhead. Then the cost of one append
alone (a 64-character row, fenced by the run's epoch and placed in commit order),
beside the physical limit: a plain INSERT of the same row, committed on its own, on the
same store (``--appends`` of each, interleaved so that a loaded machine slows both
alike).

    python bench/token_streams.py                       # SQLite in a temp dir
    python bench/token_streams.py --db postgresql://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import mainspring as ms
from mainspring.models import ScriptedModel, UserMessage
from mainspring.storage import TokenPiece, open_store


class _Unstreamed(ms.models.Model):
    """The same paced model, its deltas dropped: the runtime sees no stream."""

    provider = "scripted"

    def __init__(self, inner: ScriptedModel) -> None:
        self.inner, self.model_id, self.name = inner, inner.model_id, inner.name

    async def request(
        self, messages: Any, *, tools: Any = (), settings: Any = None
    ) -> ms.models.ModelResponse:
        return await self.inner.stream(messages, tools=tools, on_text=lambda text: None)


def _app(url: str, model: ms.models.Model) -> tuple[ms.App, Any]:
    app = ms.App(url, poll_interval_s=0.005)

    @app.workflow(name="answer")
    async def answer(ctx: ms.RunContext) -> str:
        reply = await app.call_model(ctx, model, [UserMessage(content="go")])
        return reply.text or ""

    return app, answer


async def _measure(url: str, *, stream: bool, args: argparse.Namespace) -> dict[str, float]:
    text = ("lorem ipsum " * (args.chars // 12 + 1))[: args.chars]

    async def pace(index: int, piece: str) -> None:
        await asyncio.sleep(args.delta_ms / 1000)

    paced = ScriptedModel(lambda m, t: text, chunk_size=args.piece, on_chunk=pace)
    model: ms.models.Model = paced if stream else _Unstreamed(paced)
    app, answer = _app(url, model)
    store = app.store
    spent = [0.0]
    append = store.append_tokens

    def timed(*a: Any, **kw: Any) -> bool:
        began = time.perf_counter()
        try:
            return append(*a, **kw)  # False: refused at the fence
        finally:
            spent[0] += time.perf_counter() - began

    store.append_tokens = timed  # type: ignore[method-assign]
    walls = []
    rows = 0
    for _ in range(args.runs):
        handle = app.submit(answer)
        began = time.perf_counter()
        await app.worker().run(until_idle=True)
        walls.append(time.perf_counter() - began)
        assert await handle.result() == text
        rows += len(store.tokens_after(handle.run_id, limit=100_000))
    app.close()
    return {
        "wall_s": statistics.median(walls),
        "rows_per_step": rows / args.runs,
        "write_ms_per_step": spent[0] * 1000 / args.runs,
    }


def _appends(url: str, n: int) -> tuple[float, float]:
    """Median seconds of one fenced append, and of a plain INSERT+COMMIT of the row."""
    store = open_store(url)
    run_id = f"bench-{time.time_ns()}"
    store.create_run(run_id=run_id, workflow="wf", input="{}", key=None, now=1.0)
    [run] = store.claim(
        worker="bench", now=1.0, lease_s=3600, limit=1, workflows=["wf"], max_recoveries=0
    )
    text = "x" * 64
    with store._write() as cur:  # the physical limit's table: the same columns' worth
        cur.execute("CREATE TABLE ms_bench_raw (run_id TEXT, idx INTEGER, text TEXT)")
    fenced, raw = [], []
    try:
        for i in range(n):
            began = time.perf_counter()
            assert store.append_tokens(
                run_id,
                epoch=run.epoch,
                session=0,
                seq=0,
                attempt=1,
                idx=i,
                pieces=[TokenPiece(text=text)],
                now=1.0,
            )
            fenced.append(time.perf_counter() - began)
            began = time.perf_counter()
            with store._autocommit() as cur:
                cur.execute("INSERT INTO ms_bench_raw VALUES (?, ?, ?)", (run_id, i, text))
            raw.append(time.perf_counter() - began)
    finally:
        with store._write() as cur:
            cur.execute("DROP TABLE ms_bench_raw")
        store.close()
    return statistics.median(fenced), statistics.median(raw)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=None)
    parser.add_argument("--chars", type=int, default=2000)
    parser.add_argument("--piece", type=int, default=4)
    parser.add_argument("--delta-ms", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--appends", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'bench.db'}"
        plain = await _measure(url, stream=False, args=args)
        live = await _measure(url, stream=True, args=args)
        fenced, raw = _appends(url, args.appends)
    print(f"store: {url.split(':', 1)[0]}; {args.chars} chars in {args.piece}-char deltas")
    print(f"  no stream: step {plain['wall_s'] * 1000:.1f} ms")
    print(
        f"  streamed:  step {live['wall_s'] * 1000:.1f} ms, {live['rows_per_step']:.0f} rows, "
        f"{live['write_ms_per_step']:.1f} ms in the writes (off the event loop)"
    )
    print(f"  overhead:  {(live['wall_s'] - plain['wall_s']) * 1000:+.1f} ms per step")
    print(
        f"  one append: {fenced * 1e6:.0f} us fenced and placed; a plain INSERT+COMMIT of the"
        f" row: {raw * 1e6:.0f} us ({fenced / raw:.2f} x), medians of {args.appends}"
    )


if __name__ == "__main__":
    asyncio.run(main())
