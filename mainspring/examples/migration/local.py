"""Run the migration in this process: SQLite in a directory, a FakeClock, a scripted model
with injected faults, and a reviewer who answers the stage gate from code."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mainspring as ms
from mainspring.models import FaultProfile, FaultyModel, ScriptedModel
from mainspring.testing import LedgerReport

from .pipeline import MigrationConfig, build, segment_writer
from .target import TargetStore

__all__ = ["MAX_FAULTS_IN_A_ROW", "LocalRun", "run_local", "segment_model"]

#: The most faults the transform stage's model injects in a row: below its steps' attempts.
MAX_FAULTS_IN_A_ROW = 2


def segment_model(clock: ms.Clock | None = None, seed: int = 7) -> FaultyModel:
    """The transform stage's model: rules played by a ScriptedModel, with 20 % of
    requests failing (a 5xx) and 10 % answering malformed JSON, never more than
    :data:`MAX_FAULTS_IN_A_ROW` in a row (the stage retries more often than that, so the
    demo never fails by its own dice)."""
    return FaultyModel(
        ScriptedModel(segment_writer, model_id="segment-writer"),
        FaultProfile(transient_rate=0.2, malformed_rate=0.1, max_in_a_row=MAX_FAULTS_IN_A_ROW),
        seed=seed,
        clock=clock,
    )


@dataclass(frozen=True, kw_only=True)
class LocalRun:
    """What happened, read back from the store and the target."""

    run_id: str
    status: str
    result: Any
    error: Any
    gate_preview: Any
    steps: list[ms.StepRecord]
    target_rows: dict[str, dict[str, Any]]
    ledger: LedgerReport
    model_faults: dict[str, int]


async def _run(
    folder: Path, count: int, approve: bool, drops: tuple[str, ...], flaky_every: int
) -> LocalRun:
    clock = ms.FakeClock()
    app = ms.App(f"sqlite:///{folder / 'migration.db'}", clock=clock, inline_wait_s=0.0)
    target = TargetStore(folder / "target.db", drops=drops)
    model = segment_model(clock)
    migrate = build(app, target, model, MigrationConfig(flaky_every=flaky_every))
    try:
        run = app.submit(migrate, count)
        worker = app.worker()
        await worker.run(until_idle=True)  # runs up to the stage gate and leaves the worker
        [gate] = app.requests(run.run_id)
        if approve:
            app.answer(run.run_id, gate.id, decision="approve", by="example")
        else:
            app.answer(run.run_id, gate.id, decision="reject", reason="not today", by="example")
        await worker.run(until_idle=True)
        record = app.get_run(run.run_id)
        return LocalRun(
            run_id=run.run_id,
            status=record.status,
            result=json.loads(record.output) if record.output else None,
            error=json.loads(record.error) if record.error else None,
            gate_preview=gate.preview,
            steps=list(app.store.load_steps(run.run_id, 0)),
            target_rows=target.rows(),
            ledger=target.ledger.report(),
            model_faults={str(kind): n for kind, n in model.injected.items()},
        )
    finally:
        app.close()
        target.close()


def run_local(
    directory: str | os.PathLike[str],
    count: int = 60,
    *,
    approve: bool = True,
    drops: tuple[str, ...] = (),
    flaky_every: int = 7,
) -> LocalRun:
    """Migrate ``count`` customers into ``directory`` (a fresh one) and report."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "migration.db").exists() or (folder / "target.db").exists():
        raise ms.ConfigError(f"{folder} already holds a migration; use an empty directory")
    return asyncio.run(_run(folder, count, approve, drops, flaky_every))
