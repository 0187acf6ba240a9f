"""Execute one claimed run until it finishes, suspends, or the worker lets it go."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any, Literal

from .._errors import Cancelled, LeaseLost, StoreError, StoreUnavailable
from .._serde import dumps
from ..storage import RunRecord, RunTransition
from ._context import RunContext, _ContinueAsNew, _error_json, _Release, _Suspend
from ._engine import Engine, RunControl
from ._workflow import Workflow

__all__ = ["Outcome", "execute"]

log = logging.getLogger("mainspring.worker")

Outcome = Literal["succeeded", "failed", "cancelled", "suspended", "released", "lost", "abandoned"]


async def execute(
    engine: Engine, run: RunRecord, workflow: Workflow[Any, Any], control: RunControl
) -> Outcome:
    """Replay and continue ``run`` (already claimed at ``run.epoch``).

    Every way out is journaled first: a result, an error, a suspension, a new
    session, or a release on shutdown. If the epoch moved on (``lost``) nothing is
    written; if the store keeps failing (``abandoned``) the lease simply expires
    and another worker replays the run.
    """
    while True:
        try:
            journal = engine.store.load_steps(run.id, run.session)
        except (StoreUnavailable, StoreError) as exc:
            log.warning("run %s: cannot load its journal (%s); leaving it to recovery", run.id, exc)
            return "abandoned"
        ctx = RunContext(run=run, journal=journal, engine=engine, control=control)
        transition: RunTransition
        outcome: Outcome | None  # None: the session ended; the run goes on in the next
        try:
            args, kwargs = workflow.decode_input(run.input)
            result = await workflow.fn(ctx, *args, **kwargs)
            transition = RunTransition(
                kind="finish",
                status="succeeded",
                output=dumps(result, what=f"result of workflow {workflow.name!r}"),
            )
            outcome = "succeeded"
        except _Suspend as s:
            transition, outcome = s.transition, "suspended"
        except _ContinueAsNew as c:
            transition = RunTransition(kind="next_session", handoff=c.handoff, session=ctx.session)
            outcome = None
        except _Release:
            return await _release(engine, ctx, run)
        except LeaseLost:
            log.warning(
                "run %s: lease lost (epoch %s); stopping without writing", run.id, run.epoch
            )
            return "lost"
        except (Cancelled, asyncio.CancelledError):
            if control.reason == "lost":
                return "lost"
            if control.reason == "shutdown":
                return await _release(engine, ctx, run)
            transition = RunTransition(
                kind="finish",
                status="cancelled",
                error=dumps({"type": "Cancelled", "message": "cancelled"}),
            )
            outcome = "cancelled"
        except (StoreUnavailable, StoreError) as exc:
            log.warning("run %s: store failing (%s); leaving it to recovery", run.id, exc)
            return "abandoned"
        except Exception as exc:
            transition = RunTransition(kind="finish", status="failed", error=_error_json(exc))
            outcome = "failed"
        try:
            await ctx._flush(transition)
        except LeaseLost:
            return "lost"
        except (StoreUnavailable, StoreError) as exc:
            log.warning("run %s: cannot commit its %s (%s)", run.id, transition.kind, exc)
            return "abandoned"
        if outcome is not None:
            return outcome
        run = replace(run, session=run.session + 1, handoff=transition.handoff, recoveries=0)


async def _release(engine: Engine, ctx: RunContext, run: RunRecord) -> Outcome:
    try:
        await ctx._flush()
        engine.store.release(run.id, run.epoch, engine.clock.now())
    except LeaseLost:
        return "lost"
    except (StoreUnavailable, StoreError):
        return "abandoned"
    return "released"
