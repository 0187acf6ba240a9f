"""A shadow's report as an HTML page, in the lab's style (see :mod:`._report`): one row
per run (verdict, the reply where the decisions part, tokens and cost before and after,
outcome), then each diverging run's changed arguments and how its effects were stubbed."""

from __future__ import annotations

import html
import json
from typing import Any

from .. import ShadowReport, ShadowRun, ShadowSide

__all__ = ["shadow_html", "shadow_lines"]

_HEADERS = (
    "run",
    "workflow",
    "verdict",
    "reply",
    "recorded",
    "shadow",
    "tokens before → after",
    "$ before → after",
    "outcome before → after",
    "effects stubbed",
)


def _outcome(side: ShadowSide | None) -> str:
    if side is None:
        return "–"
    shown = side.status + (f" ({side.result})" if side.result else "")
    return shown + (f": {side.error}" if side.error else "")


def _tokens(side: ShadowSide | None) -> str:
    return "–" if side is None else f"{side.input_tokens + side.output_tokens:,}"


def _cost(side: ShadowSide | None) -> str:
    return "–" if side is None else f"{side.cost_usd:.5f}"


def _row(r: ShadowRun) -> list[str]:
    return [
        r.run_id[:12],
        r.workflow,
        r.verdict,
        "–" if r.turn is None else f"{r.turn} (at {r.at or 'the end'})",
        r.before or "–",
        r.after or "–",
        f"{_tokens(r.recorded)} → {_tokens(r.shadow)}",
        f"{_cost(r.recorded)} → {_cost(r.shadow)}",
        f"{_outcome(r.recorded)} → {_outcome(r.shadow)}",
        str(r.effects_stubbed),
    ]


def shadow_lines(report: ShadowReport) -> list[str]:
    """The report in plain lines (the CLI prints them): per run, its verdict and where
    its decisions part, then every changed argument."""
    lines = []
    for r in report.runs:
        head = f"{r.run_id[:12]} {r.workflow}: {r.verdict}"
        if r.turn is not None:
            head += f" at reply {r.turn}"
        lines.append(head + (f" ({r.message})" if r.verdict == "error" else ""))
        if r.turn is not None:
            lines.append(f"  recorded: {r.before or '(no reply)'}")
            lines.append(f"  shadow:   {r.after or '(no reply)'}")
        for change in r.arguments:
            for line in change.changes:
                lines.append(f"  reply {change.turn} {change.tool}: {line}")
        if r.recorded is not None and r.shadow is not None:
            lines.append(
                f"  tokens {_tokens(r.recorded)} → {_tokens(r.shadow)}, "
                f"$ {_cost(r.recorded)} → {_cost(r.shadow)}, "
                f"outcome {_outcome(r.recorded)} → {_outcome(r.shadow)}"
            )
    lines.append(
        f"{len(report.diverged)} of {len(report.runs)} runs diverged ({report.seconds:.2f} s)"
    )
    return lines


def _details(r: ShadowRun) -> str:
    changes = "".join(
        f"<li>reply {c.turn} <code>{html.escape(c.tool)}</code>: "
        + "; ".join(html.escape(line) for line in c.changes)
        + "</li>"
        for c in r.arguments
    )
    stubbed = "".join(
        f"<tr><td>{html.escape(a.position)}</td><td>{html.escape(a.step)}</td>"
        f"<td>{html.escape(a.effect)}</td><td>{html.escape(a.source)}</td></tr>"
        for a in r.stubbed
    )
    return (
        f"<h3>{html.escape(r.run_id)} · {html.escape(r.workflow)} · {html.escape(r.verdict)}"
        f"</h3><p>{html.escape(r.message)}</p>"
        + (f"<ul>{changes}</ul>" if changes else "")
        + (
            "<table><thead><tr><th>position</th><th>step</th><th>effect</th>"
            f"<th>answered from</th></tr></thead><tbody>{stubbed}</tbody></table>"
            if stubbed
            else ""
        )
    )


def _candidate(candidate: dict[str, Any]) -> str:
    shown = {k: v for k, v in candidate.items() if v not in (None, [], "")}
    return json.dumps(shown, ensure_ascii=False, default=str)


def shadow_html(report: ShadowReport, title: str = "mainspring shadow") -> str:
    """The shadow's report: one self-contained HTML page."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in _HEADERS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in _row(r)) + "</tr>"
        for r in report.runs
    )
    details = "".join(_details(r) for r in report.runs if r.verdict != "same")
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;max-width:80em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f"<p>Candidate: <code>{html.escape(_candidate(report.candidate))}</code>. "
        f"{len(report.diverged)} of {len(report.runs)} runs diverged; no effect reached the "
        "world (every write and irreversible tool was answered from the recorded journal "
        "or a stub).</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        + (f"<h2>Diverging runs</h2>{details}" if details else "")
        + "</body></html>\n"
    )
