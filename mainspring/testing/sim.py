"""A deterministic simulator of the whole system (``mainspring lab sim``).

N real workers (claims, leases, heartbeats, the journal, step execution) run on one
simulated event loop over one real SQLite file: time is virtual, nothing really
sleeps or runs on a thread, and a seeded ``random.Random`` picks which process runs
at every await point, which faults strike (a process dying, a frozen process, a
busy store, a commit whose answer is lost, a clock jump) and which outside actions
come when (signals, cancels, duplicate submits). At the end the engine's invariants
and the workload's own effect-ledger check are the oracles. A seed replays its run
byte for byte (:attr:`SimResult.trace`); see docs/testing.md.

Example::

    from mainspring.testing.sim import OrdersWorkload, simulate

    result = simulate(OrdersWorkload(), seed=7)
    assert result.ok, result.violations  # a failure says: result.command replays it
"""

from ._sim_faults import FaultMix
from ._sim_loop import OWNER, SimLoop, SimStalled
from ._sim_run import SimClock, SimResult, replay_command, simulate
from ._sim_workloads import WORKLOADS, AgentWorkload, OrdersWorkload, Workload

__all__ = [
    "OWNER",
    "WORKLOADS",
    "AgentWorkload",
    "FaultMix",
    "OrdersWorkload",
    "SimClock",
    "SimLoop",
    "SimResult",
    "SimStalled",
    "Workload",
    "replay_command",
    "simulate",
]
