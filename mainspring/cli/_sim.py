"""``mainspring lab sim``: the deterministic simulator, over a range of seeds."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from ..testing.sim import WORKLOADS, FaultMix, SimResult, simulate
from ._common import JsonOption, cli_errors, console, print_json

__all__ = ["sim"]


def sim(
    seed: Annotated[int, typer.Option(help="The first seed (runs use seed, seed+1, ...).")] = 0,
    runs: Annotated[int, typer.Option(help="Simulated runs, one seed each.")] = 10,
    workload: Annotated[
        str, typer.Option(help=f"What to simulate: {', '.join(sorted(WORKLOADS))}.")
    ] = "orders",
    workers: Annotated[int, typer.Option(help="Simulated worker processes.")] = 3,
    no_faults: Annotated[
        bool, typer.Option("--no-faults", help="Only the interleaving varies with the seed.")
    ] = False,
    trace: Annotated[bool, typer.Option(help="Print each run's trace.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Run the whole system (real workers, journal and SQLite store) on a simulated,
    seeded event loop with faults drawn from the seed, and check its promises.

    A failing seed is printed with the one-line command that replays it; exits 1 if
    any run broke a promise.
    """
    with cli_errors():
        if workload not in WORKLOADS:
            raise typer.BadParameter(
                f"unknown workload {workload!r}; known: {', '.join(sorted(WORKLOADS))}"
            )
        mix = FaultMix.none() if no_faults else FaultMix()
        results: list[SimResult] = []
        started = time.process_time()
        out = console()
        for s in range(seed, seed + runs):
            result = simulate(WORKLOADS[workload](), seed=s, workers=workers, faults=mix)
            results.append(result)
            if trace:
                out.print(result.text(), markup=False, highlight=False)
            if not result.ok and not json_out:
                out.print(f"seed {s}: FAILED", markup=False)
                for v in result.violations:
                    out.print(f"  {v}", markup=False, highlight=False)
                out.print(f"  replay: {result.command}", markup=False, highlight=False)
        cpu = time.process_time() - started
    failed = [r for r in results if not r.ok]
    steps = sum(r.steps for r in results)
    summary = {
        "workload": workload,
        "runs": len(results),
        "failed": [
            {"seed": r.seed, "violations": list(r.violations), "replay": r.command} for r in failed
        ],
        "steps": steps,
        "turns": sum(r.turns for r in results),
        "virtual_s": round(sum(r.virtual_s for r in results), 3),
        "cpu_s": round(cpu, 3),
        "steps_per_cpu_s": round(steps / cpu, 1) if cpu > 0 else None,
    }
    if json_out:
        print_json(summary)
    else:
        console().print(
            f"{len(results) - len(failed)}/{len(results)} runs kept every promise; "
            f"{steps} steps in {cpu:.2f} CPU s ({summary['steps_per_cpu_s']} steps per "
            f"CPU second), {summary['virtual_s']} virtual s",
            markup=False,
        )
    if failed:
        raise typer.Exit(1)
