"""The lab's results as a terminal table, a markdown report and an HTML page."""

from __future__ import annotations

import html
from collections.abc import Sequence

from rich.table import Table

from ._profile import POLICY_TITLES
from ._run import PASS_K, Cell, LabResult

__all__ = ["HEADERS", "failure_lines", "html_report", "markdown_report", "rich_table", "row"]

HEADERS: tuple[str, ...] = (
    "policy",
    "steps",
    "success (95% CI)",
    "theory",
    *(f"pass^{k}" for k in PASS_K),
    "steps to failure",
    "recoveries",
    "dup. effects",
    "tokens/success",
    "$/success",
    "failure causes",
)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def row(c: Cell) -> list[str]:
    causes = ", ".join(f"{k} {v}" for k, v in sorted(c.causes.items(), key=lambda kv: -kv[1]))
    return [
        c.policy,
        str(c.steps),
        f"{_pct(c.success_rate)} [{_pct(c.ci_low)}, {_pct(c.ci_high)}]",
        _pct(c.theory),
        *(_pct(c.pass_k[k]) for k in PASS_K),
        "–" if c.steps_to_failure is None else f"{c.steps_to_failure:.1f}",
        str(c.recoveries),
        str(c.duplicate_effects),
        "–" if c.tokens_per_success is None else f"{c.tokens_per_success:,.0f}",
        "–" if c.cost_per_success is None else f"{c.cost_per_success:.5f}",
        causes or "–",
    ]


def _profile_line(result: LabResult) -> str:
    p = result.profile
    rates = {
        "model error": p.model_error_rate,
        "tool failure": p.tool_failure_rate,
        "timeout": p.timeout_rate,
        "malformed": p.malformed_rate,
        "worker crash": p.crash_rate,
        "correlated": p.correlated_rate,
    }
    faults = ", ".join(f"{k} {v:g}" for k, v in rates.items() if v) or "no faults"
    target = f"{result.target}: " if result.target else ""
    return (
        f"{target}faults per step attempt: {faults}; retries {p.retries}; "
        f"{result.tasks} tasks × {result.repeats} trials; seed {result.seed}"
    )


def rich_table(result: LabResult) -> Table:
    """The terminal table (one row per policy and chain length)."""
    table = Table(title="mainspring lab", caption=_profile_line(result))
    for h in HEADERS:
        table.add_column(h, justify="left" if h in ("policy", "failure causes") else "right")
    for c in result.cells:
        table.add_row(*row(c))
    return table


def _md_table(cells: Sequence[Cell]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row(c)) + " |" for c in cells]
    return "\n".join(lines)


def markdown_report(result: LabResult, plots: Sequence[str] = ()) -> str:
    """A markdown report: the profile, the policies, the table and the plots."""
    parts = [
        "# mainspring lab report",
        "",
        _profile_line(result) + ".",
        "",
        "Policies: " + "; ".join(f"`{p}`: {POLICY_TITLES[p]}" for p in result.policies) + ".",
        "",
        "Success is the share of trials that finished with the right result, with its 95 % "
        "Wilson interval. *theory* is the independent-fault prediction (p^n, or "
        "(1-(1-p)^(r+1))^n with r retries per step). pass^k is tau-bench's estimator: the "
        "chance that k trials of one task all succeed. *steps to failure* is the mean number "
        "of steps completed before the first unrecovered failure, over failed trials.",
        "",
        _md_table(result.cells),
        "",
    ]
    parts += _effects_lines(result)
    parts += [f"![{name}]({name})\n" for name in plots]
    if result.failures:
        parts += ["## Failed trials", "", *failure_lines(result), ""]
    return "\n".join(parts)


def _effects_lines(result: LabResult) -> list[str]:
    if result.target is None:
        return []
    if result.live:
        return ["**Live**: the target's write and irreversible tools really ran.", ""]
    stubbed = ", ".join(f"`{n}`" for n in result.stubbed) or "none"
    return [f"No real effects: these tools ran as stubs: {stubbed}.", ""]


def failure_lines(result: LabResult, limit: int | None = None) -> list[str]:
    """One line per failed trial: policy, trial, cause, error, and how to inspect it."""
    lines = []
    for f in result.failures[:limit]:
        where = f" (`mainspring show {f.run_id} --db {f.database}`)" if f.database else ""
        lines.append(
            f"- {f.policy}, task {f.task} trial {f.repeat}: **{f.cause}**: {f.error or '-'}; "
            f"run {f.run_id}{where}"
        )
    if limit is not None and len(result.failures) > limit:
        lines.append(f"- ... and {len(result.failures) - limit} more (--json lists them all)")
    return lines


def html_report(result: LabResult, plots: Sequence[str] = ()) -> str:
    """A standalone HTML page with the same content as :func:`markdown_report`."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row(c)) + "</tr>"
        for c in result.cells
    )
    images = "".join(f'<p><img src="{html.escape(p)}" alt="{html.escape(p)}"></p>' for p in plots)
    effects = "".join(f"<p>{html.escape(line)}</p>" for line in _effects_lines(result) if line)
    failed = "".join(f"<li>{html.escape(line[2:])}</li>" for line in failure_lines(result))
    if failed:
        images += f"<h2>Failed trials</h2><ul>{failed}</ul>"
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>mainspring lab</title>"
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style></head><body>"
        f"<h1>mainspring lab report</h1><p>{html.escape(_profile_line(result))}</p>"
        f"{effects}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{images}"
        "</body></html>\n"
    )
