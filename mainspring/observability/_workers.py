"""Store-side liveness of workers, for ``/metrics``: read from the worker registry
(``ms_workers``, see ``storage/_workers.py``), so a dead worker shows as such on the
server's scrape even though its own ``/metrics`` endpoint died with it.

The label set is bounded: only registered workers, and a dead one only for
:data:`DEAD_SHOWN_S` after its last beat (the registry itself forgets it after a
day). A worker that stopped gracefully is not reported at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..storage import Store

__all__ = ["DEAD_SHOWN_S", "worker_families"]

DEAD_SHOWN_S = 3600.0
"""How long after its last heartbeat a dead worker still appears in the gauges."""


def worker_families(core: Any, store: Store, now: float) -> Iterator[Any]:
    """``mainspring_workers{state}`` (alive and dead, 0 when none) and
    ``mainspring_store_worker_heartbeat_age_seconds{worker}``, as
    ``prometheus_client.core`` gauge families (``core``)."""
    counts = {"alive": 0, "dead": 0}
    age = core.GaugeMetricFamily(
        "mainspring_store_worker_heartbeat_age_seconds",
        "Seconds since each registered worker's last heartbeat, read from the store: grows"
        " without bound for a worker that died (shown for an hour after its last beat;"
        " store-wide gauge).",
        labels=["worker"],
    )
    for w in store.list_workers():
        state = w.state(now)
        if state == "stopped" or (state == "dead" and w.age_s(now) > DEAD_SHOWN_S):
            continue
        counts[state] += 1
        age.add_metric([w.id], round(w.age_s(now), 3))
    workers = core.GaugeMetricFamily(
        "mainspring_workers",
        "Registered workers by state: alive (beat within its lease) or dead (silent for"
        " longer than its lease, within the last hour), from the store (store-wide gauge).",
        labels=["state"],
    )
    for name, n in counts.items():
        workers.add_metric([name], n)
    yield workers
    yield age
