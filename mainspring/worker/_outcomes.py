"""The line a worker logs when a run leaves it.

One structured line per event (``key=value``): what an operator greps. A suspended run
says what it waits for and until when; a failed one, its error in one line.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from .._errors import StoreError, StoreUnavailable
from ..storage import Store

__all__ = ["outcome_fields"]


def outcome_fields(store: Store, worker_id: str, run_id: str, outcome: str) -> str:
    """The fields of the line that says how a run left this worker: done, failed
    (why), waiting or sleeping (for what, until when), given back, or lost to another
    worker. The run's row is read for the details; a store that cannot answer leaves
    them out."""
    fields = f"event={outcome} worker={worker_id} run={run_id}"
    try:
        record = store.get_run(run_id)
    except (StoreUnavailable, StoreError):
        record = None
    if record is not None and outcome == "suspended":
        fields = f"event={record.status} worker={worker_id} run={run_id}"
        fields += f" reason={record.wait_reason!r}"
        if record.wake_at:
            fields += f" wake_at={_iso(record.wake_at)}"
    elif record is not None and outcome == "failed" and record.error:
        error = _error_line(record.error)
        fields += f" error={error!r}"
    return fields


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _error_line(text: str) -> str:
    try:
        error = json.loads(text)
    except ValueError:
        return text[:300]
    if not isinstance(error, dict):
        return str(error)[:300]
    kind = str(error.get("type", "?")).rsplit(".", 1)[-1]
    return f"{kind}: {error.get('message', '')}"[:300]
