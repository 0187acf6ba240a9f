"""``python -m examples.mailer [--count N] [--reject]``: mail customers in-process."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import mainspring as ms
from mainspring.models import ScriptedModel
from mainspring.testing import EffectLedger

from .pipeline import build, writer_turn


async def mail(folder: Path, count: int, approve: bool) -> tuple[ms.RunRecord, EffectLedger]:
    app = ms.App(f"sqlite:///{folder / 'mailer.db'}", clock=ms.FakeClock())
    ledger = EffectLedger(folder / "mail-api.db")
    flow = build(app, ledger, ScriptedModel(writer_turn, model_id="email-writer"))
    try:
        run = app.submit(flow, count)
        worker = app.worker()
        await worker.run(until_idle=True)  # tiers and emails written; waits for approval
        [request] = app.requests(run.run_id)
        print(f"approval requested: {json.dumps(request.preview)}")
        if approve:
            app.answer(run.run_id, request.id, decision="approve", by="you")
        else:
            app.answer(run.run_id, request.id, decision="reject", reason="wrong tone", by="you")
        await worker.run(until_idle=True)
        return app.get_run(run.run_id), ledger
    finally:
        app.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.mailer", description=__doc__)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--reject", action="store_true", help="reject at the approval")
    args = parser.parse_args(argv)
    if not 1 <= args.count <= 9999:
        parser.error(f"--count must be between 1 and 9999, got {args.count}")
    folder = Path(tempfile.mkdtemp(prefix="mainspring-mailer-"))
    record, ledger = asyncio.run(mail(folder, args.count, not args.reject))
    report = ledger.report()
    ledger.close()
    print(f"run {record.id}: {record.status} (files in {folder})")
    print(f"result: {record.output}")
    print(
        f"mail API: {report.calls} calls, {report.keys} emails, "
        f"{len(report.duplicate_effects)} duplicates"
    )
    return 0 if record.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
