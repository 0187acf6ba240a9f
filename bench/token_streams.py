"""What live token streams cost a model step: the same agent step with and without
streaming, on SQLite and (with ``--db postgresql://...``) PostgreSQL.

A scripted model hands out a reply of ``--chars`` characters in ``--piece``-character
deltas, ``--delta-ms`` apart (a provider's pace: ~4 characters every 10-20 ms), once
streaming and once with the same pacing but its deltas dropped (no stream rows).
Printed: the step's wall time each way, the stream rows written (batches), the time
spent inside those writes, and the per-step overhead.

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

    def timed(*a: Any, **kw: Any) -> None:
        began = time.perf_counter()
        try:
            append(*a, **kw)
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=None)
    parser.add_argument("--chars", type=int, default=2000)
    parser.add_argument("--piece", type=int, default=4)
    parser.add_argument("--delta-ms", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'bench.db'}"
        plain = await _measure(url, stream=False, args=args)
        live = await _measure(url, stream=True, args=args)
    print(f"store: {url.split(':', 1)[0]}; {args.chars} chars in {args.piece}-char deltas")
    print(f"  no stream: step {plain['wall_s'] * 1000:.1f} ms")
    print(
        f"  streamed:  step {live['wall_s'] * 1000:.1f} ms, {live['rows_per_step']:.0f} rows, "
        f"{live['write_ms_per_step']:.1f} ms in the writes (off the event loop)"
    )
    print(f"  overhead:  {(live['wall_s'] - plain['wall_s']) * 1000:+.1f} ms per step")


if __name__ == "__main__":
    asyncio.run(main())
