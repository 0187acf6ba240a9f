"""The horizon benchmark: the suite's long agent tasks under faults, mainspring beside
the peers (a plain ``openai`` loop, LangGraph with ``SqliteSaver``, the OpenAI Agents
SDK with ``SQLiteSession``), one table.

mainspring runs through ``mainspring.lab.run_suite`` (its worker pool); each peer runs
one runner process per run (bench/horizon/*.py) with the peer venv's python
(bench/.venv-horizon, built on first use), driven by bench/horizon/_harness.py: same
tasks, same seeds, same policy. See bench/README.md, "horizon.py", for how to read it.

    python bench/horizon.py --quick
    python bench/horizon.py --task migrate,support --steps 10,100 --runs 5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "horizon"))

from _common import STANDINS, KillRates, ProviderFaults  # noqa: E402
from _harness import RunnerContender, run_cell  # noqa: E402
from _venv import ensure_horizon_venv  # noqa: E402

from mainspring import lab  # noqa: E402
from mainspring.lab import SuiteProfile, pass_hat_k, run_suite, wilson  # noqa: E402

# The horizon branch's harness drives runner processes itself (run_suite's contender=):
# the peers go through it once it is there, through bench/horizon/_harness.py until then.
SUITE_RUNNER: Any = getattr(lab, "RunnerContender", None)

PEERS = {
    "plain_loop": "plain_loop.py",
    "langgraph": "langgraph_agent.py",
    "agents_sdk": "agents_sdk.py",
}
CONTENDERS = ("mainspring", *PEERS)


def _profile(faults: bool) -> Any:
    """mainspring's fault profile: the kill points and provider faults the peers meet
    (the horizon branch's ``SuiteProfile``), or, before it, the first slice's own
    (10 % transient model errors, a worker SIGKILLed about every 50 model calls)."""
    if SUITE_RUNNER is not None:
        none = {"kills": KillRates(0, 0, 0), "provider": ProviderFaults(0, 0, 0)}
        return SuiteProfile() if faults else SuiteProfile(**none)  # type: ignore[arg-type]
    return SuiteProfile() if faults else SuiteProfile(transient=0.0, kill_every=0)


def _mainspring_rows(
    tasks: Sequence[str], steps: Sequence[int], runs: int, seed: int, faults: bool, workers: int
) -> list[dict[str, Any]]:
    profile = _profile(faults)
    rows = []
    for cell in run_suite(
        tasks=tasks, steps=steps, runs=runs, seed=seed, profile=profile, workers=workers
    ):
        rows.append(_suite_row(cell))
    return rows


def _suite_row(cell: Any) -> dict[str, Any]:
    """A ``run_suite`` cell as a row of the table."""
    row = cell.to_dict()
    row.setdefault("contender", "mainspring")
    row["gave_up"] = None  # SuiteCell does not count them apart: see its failures
    if not row.get("kills_by_phase"):
        row["kills_by_phase"] = {"worker": cell.kills}
    return row


def _row(cell: dict[str, Any]) -> str:
    succeeded, runs = cell["succeeded"], cell["runs"]
    low, high = wilson(succeeded, runs)
    pk = pass_hat_k([(succeeded, runs)], runs)

    def per(total: int, digits: int) -> str:
        return "—" if succeeded == 0 else f"{total / succeeded:,.{digits}f}"

    by = cell["kills_by_phase"]
    kills = (
        f"{by['worker']} workers"
        if "worker" in by
        else "/".join(str(by.get(phase, 0)) for phase in ("model", "tool", "commit"))
    )
    again = (
        f"{cell['repeated_same_key']}/{cell['repeated_new_key']}"
        if "repeated_same_key" in cell
        else "—"
    )
    return (
        f"| {cell['contender']} | {cell['task']} | {cell['steps']} | {runs} "
        f"| {succeeded / runs:.0%} | {low:.0%} – {high:.0%} "
        f"| {'n/a' if pk is None else f'{pk:.2f}'} | {cell['duplicate_effects']} "
        f"| {'—' if cell['gave_up'] is None else cell['gave_up']} | {kills} | {again} "
        f"| {per(cell['model_calls'], 1)} | {per(cell['tokens'], 0)} "
        f"| {cell['wall_s']:.1f} |"
    )


def markdown(cells: Sequence[dict[str, Any]]) -> str:
    """The benchmark's table."""
    head = (
        "| contender | task | steps | runs | success | Wilson 95 % | pass^k | duplicate effects "
        "| gave up | kills (model/tool/commit) | effects asked again (same key/new key) "
        "| model calls / success | tokens / success | wall s |\n"
        "|---|---|---:|---:|---:|---|---:|---:|---:|---|---|---:|---:|---:|"
    )
    return "\n".join([head, *(_row(c) for c in cells)])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated")
    p.add_argument("--task", default="migrate,support")
    p.add_argument("--steps", default="10,100")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="runs in flight at once")
    p.add_argument("--no-faults", action="store_true", help="no kills, no provider faults")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per cell")
    p.add_argument("--quick", action="store_true", help="both tasks, 10 steps, 2 runs")
    p.add_argument("--json", action="store_true", help="every figure and failure as JSON")
    args = p.parse_args(argv)
    contenders = [c for c in args.contenders.split(",") if c]
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        p.error(f"unknown contender(s) {unknown}; choose from {list(CONTENDERS)}")
    tasks = args.task.split(",")
    steps = [10] if args.quick else [int(s) for s in args.steps.split(",")]
    runs = 2 if args.quick else args.runs
    kills = KillRates(0, 0, 0) if args.no_faults else KillRates()
    provider = ProviderFaults(0, 0, 0) if args.no_faults else ProviderFaults()
    print(
        f"horizon: seed {args.seed}, {runs} runs a cell, faults "
        f"{'off' if args.no_faults else 'on'}; peer faults and model server: "
        f"{'bench/horizon/_standins.py' if STANDINS else 'mainspring.lab'}",
        file=sys.stderr,
    )
    cells: list[dict[str, Any]] = []
    python = ensure_horizon_venv() if set(contenders) & set(PEERS) else None
    for name in contenders:
        started = time.monotonic()
        if name == "mainspring":
            cells += _mainspring_rows(
                tasks, steps, runs, args.seed, not args.no_faults, args.workers
            )
        else:
            argv = (str(python), str(HERE / "horizon" / PEERS[name]))
            if SUITE_RUNNER is not None:
                suite = run_suite(
                    tasks=tasks, steps=steps, runs=runs, seed=args.seed, workers=args.workers,
                    timeout_s=args.timeout, contender=SUITE_RUNNER(name, argv),
                    profile=_profile(not args.no_faults),
                )  # fmt: skip
                cells += [_suite_row(c) for c in suite]
            else:
                contender = RunnerContender(name, argv)
                for task in tasks:
                    for n in steps:
                        cell = run_cell(
                            contender, task=task, steps=n, runs=runs, seed=args.seed,
                            kills=kills, provider=provider, workers=args.workers,
                            timeout_s=args.timeout,
                        )  # fmt: skip
                        cells.append(cell.to_dict())
        print(f"horizon: {name} done in {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.json:
        print(json.dumps(cells, indent=2))
    else:
        print(markdown(cells))
        for cell in cells:
            for failure in cell["failures"][:5]:
                print(f"  {cell['contender']}: {failure[:240]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
