"""Regression suites made from shadows: the runs whose decisions a candidate changed,
saved to a file with their recorded journals and the decisions the candidate made, so
that CI can shadow them again against the code of the day (``mainspring lab run
MODULE:APP --regressions FILE``) and fail when a decision moves.

The file is JSON, self-contained (no database needed to replay it)::

    {"format": "mainspring.shadow-regressions", "version": 1,
     "options": {"from_step": 0, "reads": "journal"},
     "runs": [{"run": {...RunRecord...}, "steps": [{...StepRecord...}, ...],
               "expected": [{"position": "0:2", "calls": [["refund", {...}]],
                             "text": null}, ...]}]}

A replay answers every effect from the recorded journal (stubs given in Python are not
saved: pass them again), and its model runs live: a suite is only as repeatable as the
model (a scripted one in tests, temperature 0 and a pinned model in CI).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import App, ConfigError, RecordedRun, RunRecord, ShadowReport, StepRecord

__all__ = [
    "FORMAT",
    "Regression",
    "RegressionResult",
    "Regressions",
    "load_regressions",
    "run_regressions",
    "save_regressions",
]

FORMAT = "mainspring.shadow-regressions"
VERSION = 1


@dataclass(frozen=True, slots=True)
class Regression:
    """One saved run: its recording and the decisions the candidate made (each
    ``{"position", "calls": [[tool, arguments], ...], "text"}``)."""

    recording: RecordedRun
    expected: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Regressions:
    """A regression suite as loaded from its file."""

    runs: list[Regression]
    options: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RegressionResult:
    """A suite replayed: per run, whether the code made the saved decisions.

    ``failures``: ``(run id, the first reply that differs (1-based), expected, got)``."""

    checked: int
    failures: list[tuple[str, int, str, str]]
    report: ShadowReport

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "failures": [
                {"run_id": r, "reply": t, "expected": e, "got": g} for r, t, e, g in self.failures
            ],
        }


def _decision(d: Any) -> dict[str, Any]:
    return {"position": d.position, "calls": [[n, a] for n, a in d.calls], "text": d.text}


def _key(d: Mapping[str, Any]) -> str:
    calls = d.get("calls") or []
    value: Any = [list(c) for c in calls] if calls else (d.get("text") or "").strip()
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def save_regressions(report: ShadowReport, path: str | Path, *, every: bool = False) -> int:
    """Write the runs of ``report`` that diverged (``every``: all of them) as a
    regression suite at ``path``; returns how many were written."""
    chosen = [r for r in report.runs if r.verdict != "error" and (every or r.verdict != "same")]
    runs = []
    for r in chosen:
        rec = report.recordings[r.run_id]
        runs.append(
            {
                "run": dataclasses.asdict(rec.run),
                "steps": [dataclasses.asdict(s) for s in rec.steps],
                "expected": [_decision(d) for d in report.decisions.get(r.run_id, [])],
            }
        )
    options = {k: report.candidate.get(k) for k in ("from_step", "reads")}
    text = json.dumps(
        {"format": FORMAT, "version": VERSION, "options": options, "runs": runs},
        ensure_ascii=False,
        indent=1,
        default=str,
    )
    Path(path).write_text(text + "\n", encoding="utf-8")
    return len(runs)


def load_regressions(path: str | Path) -> Regressions:
    """Read a regression suite written by :func:`save_regressions`.

    Raises:
        ConfigError: the file is not one (or of a newer version).
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the regression suite {str(path)!r}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{str(path)!r} is not a mainspring shadow regression suite")
    if data.get("version") != VERSION:
        raise ConfigError(
            f"{str(path)!r} is a regression suite of version {data.get('version')!r}; this "
            f"mainspring reads version {VERSION}"
        )
    runs = [
        Regression(
            RecordedRun(RunRecord(**entry["run"]), tuple(StepRecord(**s) for s in entry["steps"])),
            list(entry["expected"]),
        )
        for entry in data["runs"]
    ]
    return Regressions(runs, dict(data.get("options") or {}))


async def run_regressions(
    app: App,
    path: str | Path,
    *,
    stubs: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
) -> RegressionResult:
    """Shadow every run of the suite at ``path`` against ``app`` (the code of the day)
    and compare its decisions with the saved ones, reply by reply."""
    suite = load_regressions(path)
    options = suite.options
    report = await app.shadow(
        [r.recording for r in suite.runs],
        from_step=options.get("from_step") or 0,
        reads=options.get("reads") or "journal",
        stubs=stubs,
    )
    failures = []
    for case in suite.runs:
        run_id = case.recording.run.id
        got = [_decision(d) for d in report.decisions.get(run_id, [])]
        for i in range(max(len(got), len(case.expected))):
            want = case.expected[i] if i < len(case.expected) else None
            have = got[i] if i < len(got) else None
            if want is None or have is None or _key(want) != _key(have):
                failures.append((run_id, i + 1, _shown(want), _shown(have)))
                break
    return RegressionResult(len(suite.runs), failures, report)


def _shown(d: Mapping[str, Any] | None) -> str:
    if d is None:
        return "(no reply)"
    calls = d.get("calls") or []
    if not calls:
        return f"text: {(d.get('text') or '').strip()!r}"[:300]
    return "; ".join(
        f"{n}({json.dumps(a, sort_keys=True, ensure_ascii=False, default=str)})" for n, a in calls
    )[:300]
