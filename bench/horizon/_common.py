"""What the three peer runners share: the runner CLI of HORIZON.md, the task's tools
as OpenAI function schemas, one tool call against the world, and the approval wait.

Imported by the runner scripts (run with the peer venv's python, where mainspring is
installed from this repository) and by bench/horizon.py.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mainspring.lab import (
    TASKS,
    KillRates,
    ProviderFaults,
    SuiteFaults,
    SuiteModelServer,
    SuiteWorld,
    TaskSpec,
    ToolDef,
)

__all__ = [
    "FINISH",
    "KillRates",
    "ProviderFaults",
    "RunnerArgs",
    "SuiteFaults",
    "SuiteModelServer",
    "Tools",
    "client_timeout_s",
    "parse_args",
]

MODEL = "gpt-4.1-mini"  # a name only: the suite's server plays the policy whatever it is
POLL_S = 0.05  # how often a runner asks whether the reviewer answered

FINISH = ToolDef(
    "finish",
    "Call when the task is done.",
    {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    },
)


@dataclass(frozen=True, slots=True)
class RunnerArgs:
    task: str
    label: str
    world: str
    state: str
    max_steps: int

    @property
    def spec(self) -> TaskSpec:
        return TASKS[self.task]

    @property
    def task_text(self) -> str:
        return f"{self.task} batch {self.label}"

    def state_file(self, suffix: str) -> str:
        """A file of this run in the state directory (made if missing)."""
        os.makedirs(self.state, exist_ok=True)
        return os.path.join(self.state, f"{self.label}{suffix}")


def parse_args(argv: Sequence[str] | None = None, description: str | None = None) -> RunnerArgs:
    """HORIZON.md's runner CLI: ``--task --label --world --state --max-steps``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--task", required=True, choices=sorted(TASKS))
    p.add_argument("--label", required=True, help="the run's batch label in the world")
    p.add_argument("--world", required=True, help="the cell's world SQLite file")
    p.add_argument("--state", required=True, help="a directory for the runner's own state")
    p.add_argument("--max-steps", type=int, required=True, help="model calls before giving up")
    a = p.parse_args(argv)
    if a.max_steps < 1:
        p.error(f"--max-steps must be >= 1, got {a.max_steps!r}")
    return RunnerArgs(a.task, a.label, a.world, a.state, a.max_steps)


def client_timeout_s() -> float:
    """The model client's timeout: the server's ``client_timeout_s`` (the harness passes
    it as ``MAINSPRING_SUITE_CLIENT_TIMEOUT_S``; else the server class's value)."""
    given = os.environ.get("MAINSPRING_SUITE_CLIENT_TIMEOUT_S")
    return float(given) if given else float(getattr(SuiteModelServer, "client_timeout_s", 30.0))


def openai_tools(spec: TaskSpec) -> list[dict[str, Any]]:
    """The task's tools plus ``finish`` in Chat Completions' ``tools`` shape."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in (*spec.tools, FINISH)
    ]


class Tools:
    """One run's handle on the world and the faults: tool calls, approvals, kill points."""

    def __init__(self, args: RunnerArgs) -> None:
        self.args = args
        self.label = args.label
        self.world = SuiteWorld(args.world)
        self.faults = SuiteFaults(args.world)

    def kill_point(self, phase: str) -> None:
        self.faults.kill_point(self.label, phase)

    def needs_approval(self, tool: str) -> bool:
        return any(t.name == tool and t.approval for t in self.args.spec.tools)

    def call(self, tool: str, arguments: dict[str, Any], key: str) -> dict[str, Any]:
        """Run one tool call on the world under the idempotency key ``key`` (the world
        has the "tool" kill point)."""
        return self.world.call(self.label, tool, arguments, key)

    def wait_for_approval(self, key: str, tool: str, arguments: str) -> bool:
        """Ask the reviewer once per ``key`` and poll until it answers."""
        while True:
            decision = self.faults.request_approval(self.label, key, tool, arguments)
            if decision is not None:
                return decision == "approved"
            time.sleep(POLL_S)


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
