"""What a run that waits for a person or a signal waits for, and how to answer it, as
``app.run`` and ``app.result`` say it; and what ``app.run`` says when its code could not
replay the run."""

from __future__ import annotations

from .._errors import NondeterminismError, RunWaiting
from ..storage import RunRecord, Store
from ..worker import Worker

__all__ = ["raise_if_refused", "waiting"]


def waiting(store: Store, record: RunRecord) -> RunWaiting:
    """What a waiting run waits for, and how to answer, as a :class:`RunWaiting`."""
    run_id = record.id
    requests = store.pending_requests(run_id)
    ways: list[str] = []
    for r in requests:
        if r.kind == "approval":
            ways.append(
                f"{r.id!r} ({r.title}): `mainspring approve {run_id} {r.id}` (or --reject "
                f"REASON), or app.answer({run_id!r}, {r.id!r}, decision='approve')"
            )
        else:
            ways.append(
                f"{r.id!r} ({r.title}): `mainspring answer {run_id} {r.id} TEXT`, or "
                f"app.answer({run_id!r}, {r.id!r}, answer=...)"
            )
    reason = record.wait_reason
    if not ways and reason and reason.startswith("signal:"):
        name = reason.removeprefix("signal:")
        ways.append(
            f"the signal {name!r}: `mainspring signal {run_id} {name} PAYLOAD-JSON`, or "
            f"app.signal({run_id!r}, {name!r}, payload)"
        )
    if not ways and reason and reason.startswith("child:"):
        child = store.get_run(reason.removeprefix("child:"))
        if child is not None and child.status == "waiting":
            ways.append(f"its child run, which waits: {waiting(store, child).message}")
    what = "; ".join(ways) or f"{reason or 'a signal'}"
    return RunWaiting(
        f"run {run_id} of {record.workflow!r} is waiting for {what}. It is kept, holding "
        f"no worker: once answered, app.run(..., key=...) or any worker finishes it "
        f"(await app.result({run_id!r}) returns its result); app.run(..., "
        "on_wait='wait') waits for the answer instead",
        run_id=run_id,
        wait_reason=reason,
        requests=tuple(r.id for r in requests),
    )


def raise_if_refused(worker: Worker, run_id: str) -> None:
    """``app.run``'s code could not replay its run (a journal of another deployment's
    code): the run was left, unfinished, for a worker whose code can; say so."""
    error = worker.refusals.errors.get(run_id)
    if error is not None:
        raise NondeterminismError(
            f"this code cannot replay run {run_id!r} ({error.message}); the run was left "
            "unfinished for a worker whose code can (`mainspring show` says what it "
            "waits for)",
            run_id=run_id,
            step=error.step,
        )
