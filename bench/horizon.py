"""The horizon benchmark: the suite's long agent tasks under faults, mainspring beside
the peers (a plain ``openai`` loop, LangGraph with ``SqliteSaver``, the OpenAI Agents
SDK with ``SQLiteSession``) and the frameworks' agents made durable by mainspring's
integrations (a Pydantic AI agent and the Agents SDK's agent through ``durable()``; the
LangGraph peer's own graph through ``durable(app, graph)``), one table.

Every contender goes through ``mainspring.lab.run_suite``: mainspring as its worker
pool, each peer as ``RunnerContender(name, [venv python, runner])``, one runner process
per run (bench/horizon/*.py) with the peer venv's python (bench/.venv-horizon, built on
first use), each peer's agent on mainspring as ``AppContender`` (mainspring's worker
pool running that App, with the peer venv's python). Same tasks, same seeds, same
policy, same kill points and provider faults.
See bench/README.md, "horizon.py", for how to read it.

    python bench/horizon.py --quick
    python bench/horizon.py --task reconcile,support --steps 100 --runs 3 --html h.html
    python bench/horizon.py --steps 10,100,1000 --runs 3 --client-timeout 5 --parallel

``--parallel`` runs each contender in a child process of its own (this script with
``--json``), side by side, and prints the one table of all their cells: the cells are
the same as one after another, only the wall times share the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "horizon"))

from _venv import ensure_horizon_venv  # noqa: E402

from mainspring.lab import (  # noqa: E402
    TASKS,
    AppContender,
    Contender,
    KillRates,
    ProviderFaults,
    RunnerContender,
    SuiteCell,
    SuiteProfile,
    run_suite,
    suite_html,
    suite_markdown,
)

PEERS = {
    "plain_loop": "plain_loop.py",
    "langgraph": "langgraph_agent.py",
    "agents_sdk": "agents_sdk.py",
    "pydantic_ai": "pydantic_ai_bare.py",
    "agents_sdk_mainspring": "agents_sdk_mainspring.py",  # the same agent, durable()
}
# Frameworks' agents made durable by mainspring's integrations: their runner scripts run
# with this interpreter (where the extras are installed), not the peer venv's.
ON_MAINSPRING = {
    "pydantic_ai_mainspring": "pydantic_ai_mainspring.py",
}
# A peer's agent made durable on mainspring: MODULE:APP of bench/horizon, and its name
# (mainspring's worker pool runs that App under the peer venv's python).
APP_ON_MAINSPRING = {
    "langgraph_mainspring": ("langgraph_mainspring:app", "LangGraph on mainspring")
}
CONTENDERS = ("mainspring", *ON_MAINSPRING, *PEERS, *APP_ON_MAINSPRING)


def profile(faults: bool, client_timeout_s: float | None = None) -> SuiteProfile:
    """The suite's default faults (kill points, provider faults), or none of them; the
    clients' timeout (what a timeout fault costs) when given."""
    provider = ProviderFaults() if faults else ProviderFaults(0, 0, 0)
    if client_timeout_s is not None:
        provider = dataclasses.replace(provider, timeout_s=client_timeout_s)
    kills = KillRates() if faults else KillRates(0, 0, 0)
    return SuiteProfile(kills=kills, provider=provider)


def side_by_side(names: Sequence[str], argv: Sequence[str]) -> list[SuiteCell]:
    """Each contender in a child process of its own (this script, ``--json``), at once;
    their cells in the order of ``names``.

    Raises:
        SystemExit: a child failed (its cells so far are lost with it).
    """
    # A SIGTERM (an operator, `timeout`) ends the children too: it raises SystemExit
    # here, and the finally below kills them (their workers and runners then exit).
    before = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    children = []
    try:
        for name in names:
            children.append((name, subprocess.Popen(
                [sys.executable, __file__, *argv, "--contenders", name, "--json"],
                stdout=subprocess.PIPE, text=True,
            )))  # fmt: skip
        cells: list[SuiteCell] = []
        for name, child in children:
            out, _ = child.communicate()
            if child.returncode != 0:
                raise SystemExit(f"horizon: the {name} child exited {child.returncode}")
            cells += [SuiteCell.from_dict(json.loads(line)) for line in out.splitlines() if line]
        return cells
    finally:
        for _, child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        signal.signal(signal.SIGTERM, before)


def contender(name: str, python: Path | None) -> Contender:
    """``"mainspring"``, a peer's runner script under the peer venv's python, or a
    peer's agent on mainspring (workers under the peer venv's python)."""
    if name == "mainspring":
        return "mainspring"
    if name in ON_MAINSPRING:
        return RunnerContender(name, (sys.executable, str(HERE / "horizon" / ON_MAINSPRING[name])))
    assert python is not None
    if name in APP_ON_MAINSPRING:
        app, shown = APP_ON_MAINSPRING[name]
        return AppContender(shown, app, str(python), (str(HERE / "horizon"),))
    return RunnerContender(name, (str(python), str(HERE / "horizon" / PEERS[name])))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated")
    p.add_argument("--task", default=",".join(TASKS), help="comma-separated")
    p.add_argument("--steps", default="10,100", help="comma-separated")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="runs in flight at once")
    p.add_argument("--no-faults", action="store_true", help="no kills, no provider faults")
    p.add_argument("--timeout", type=float, default=None, help="seconds per cell")
    p.add_argument(
        "--client-timeout", type=float, default=None, metavar="S",
        help="every client's timeout, what a timeout fault holds (default 30 s)",
    )  # fmt: skip
    p.add_argument("--parallel", action="store_true", help="the contenders side by side")
    p.add_argument("--quick", action="store_true", help="10 steps, 2 runs")
    p.add_argument("--json", action="store_true", help="each cell, failures too, as a JSON line")
    p.add_argument("--html", metavar="PATH", help="also write the suite's HTML report")
    args = p.parse_args(argv)
    names = [c for c in args.contenders.split(",") if c]
    unknown = sorted(set(names) - set(CONTENDERS))
    if unknown:
        p.error(f"unknown contender(s) {unknown}; choose from {list(CONTENDERS)}")
    tasks = [t for t in args.task.split(",") if t]
    steps = [10] if args.quick else [int(s) for s in args.steps.split(",")]
    runs = 2 if args.quick else args.runs
    print(
        f"horizon: seed {args.seed}, {runs} runs a cell, faults "
        f"{'off' if args.no_faults else 'on'}",
        file=sys.stderr,
    )

    def progress(cell: SuiteCell) -> None:
        if args.json:  # a line a cell as it ends: a long run's cells survive a stop
            print(json.dumps(cell.to_dict()), flush=True)
        print(
            f"horizon: {cell.contender} {cell.task} {cell.steps}: "
            f"{cell.succeeded}/{cell.runs} in {cell.wall_s:.0f} s",
            file=sys.stderr,
            flush=True,
        )

    python = ensure_horizon_venv() if set(names) & {*PEERS, *APP_ON_MAINSPRING} else None
    cells: list[SuiteCell] = []
    if args.parallel and len(names) > 1:
        child_argv = _without(list(argv if argv is not None else sys.argv[1:]))
        cells = side_by_side(names, child_argv)
        for cell in cells if args.json else ():
            print(json.dumps(cell.to_dict()), flush=True)
        names = []  # the children ran them
    for name in names:
        started = time.monotonic()
        cells += run_suite(
            tasks=tasks, steps=steps, runs=runs, seed=args.seed, workers=args.workers,
            timeout_s=args.timeout, contender=contender(name, python),
            profile=profile(not args.no_faults, args.client_timeout), progress=progress,
        )  # fmt: skip
        print(f"horizon: {name} done in {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.html:
        Path(args.html).write_text(suite_html(cells, title="mainspring horizon benchmark"))
    if not args.json:
        print(suite_markdown(cells))
        for cell in cells:
            for failure in cell.failures[:5]:
                print(f"  {cell.contender}: {failure[:240]}", file=sys.stderr)
    return 0


def _without(argv: list[str]) -> list[str]:
    """The parent's arguments a child gets: all but the contenders, the output and
    the side-by-side flags (``--quick`` stays)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--contenders", "--html"):
            skip = "=" not in arg
            continue
        if name not in ("--parallel", "--json"):
            out.append(arg)
    return out


if __name__ == "__main__":
    sys.exit(main())
