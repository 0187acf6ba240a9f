"""The horizon suite's report as one self-contained HTML page: the table and two
hand-written SVG plots (no script, no external asset).

* success rate against steps, with each cell's 95 % Wilson interval as a bar;
* tokens per success against steps (log scale: the history is re-sent on every
  call, so tokens grow faster than steps).

Both have a log-scale x axis (10, 100, 1,000 steps) and one line per contender and
task. A cell's contender is ``cell.contender`` when the cell has one (the harness
branch adds it), else ``"mainspring"``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from ._suite import PRICE_PER_MTOK, SuiteCell

__all__ = ["suite_html"]

_W, _H = 560, 320
_LEFT, _RIGHT, _TOP, _BOTTOM, _PAD = 64, 150, 16, 40, 12
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2")

# One point: (steps, y, interval low, interval high); the interval is optional.
_Point = tuple[float, float, float | None, float | None]


def _contender(cell: SuiteCell) -> str:
    return str(getattr(cell, "contender", "mainspring"))


def _series(cells: Sequence[SuiteCell]) -> dict[str, list[SuiteCell]]:
    """The cells of each contender and task, by steps."""
    out: dict[str, list[SuiteCell]] = {}
    for cell in cells:
        out.setdefault(f"{_contender(cell)} · {cell.task}", []).append(cell)
    return {name: sorted(group, key=lambda c: c.steps) for name, group in out.items()}


def _log_scale(low: float, high: float) -> tuple[float, float, list[float]]:
    """A log axis over whole decades around [low, high]: (log10 start, log10 end, ticks)."""
    start = math.floor(math.log10(max(low, 1e-9)))
    end = max(start + 1, math.ceil(math.log10(max(high, 1e-9))))
    return start, end, [10.0**e for e in range(start, end + 1)]


def _compact(v: float) -> str:
    """A tick label: 1k, 10k, 1M."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= size:
            return f"{v / size:g}{suffix}"
    return f"{v:g}"


def _plot(
    title: str,
    y_label: str,
    series: dict[str, list[_Point]],
    steps: Sequence[int],
    *,
    y_log: bool,
    kind: str,
) -> str:
    """One SVG line plot with a log x axis over ``steps``; ``kind`` names it
    (``data-plot``). Series sit a few pixels apart so that equal values stay visible."""
    x0, x1, x_ticks = _log_scale(min(steps, default=10), max(steps, default=10))
    width, height = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    ys = [v for points in series.values() for p in points for v in (p[1], p[2], p[3]) if v]
    if y_log:
        y0, y1, y_ticks = _log_scale(min(ys or [1.0]), max(ys or [10.0]))
    else:
        y0, y1, y_ticks = 0.0, 1.0, [0.0, 0.25, 0.5, 0.75, 1.0]

    def x(v: float, shift: float = 0.0) -> float:
        return _LEFT + _PAD + (math.log10(v) - x0) / (x1 - x0) * (width - 2 * _PAD) + shift

    def y(v: float) -> float:
        share = (math.log10(v) - y0) / (y1 - y0) if y_log else (v - y0) / (y1 - y0)
        return _TOP + _PAD + (1 - share) * (height - 2 * _PAD)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" role="img" data-plot="{kind}">',
        f"<title>{html.escape(title)}</title>",
        f'<rect x="{_LEFT}" y="{_TOP}" width="{width}" height="{height}" '
        'fill="none" stroke="#999"/>',
    ]
    for t in x_ticks:
        parts.append(
            f'<line x1="{x(t):.1f}" y1="{_TOP}" x2="{x(t):.1f}" y2="{_TOP + height}" '
            f'stroke="#eee"/><text x="{x(t):.1f}" y="{_H - _BOTTOM + 16}" '
            f'text-anchor="middle" font-size="11">{t:,.0f}</text>'
        )
    for t in y_ticks:
        text = _compact(t) if y_log else f"{t:.0%}"
        parts.append(
            f'<line x1="{_LEFT}" y1="{y(t):.1f}" x2="{_LEFT + width}" y2="{y(t):.1f}" '
            f'stroke="#eee"/><text x="{_LEFT - 4}" y="{y(t) + 4:.1f}" '
            f'text-anchor="end" font-size="11">{text}</text>'
        )
    parts.append(
        f'<text x="{_LEFT + width / 2}" y="{_H - 6}" text-anchor="middle" '
        'font-size="12">steps (log scale)</text>'
        f'<text x="12" y="{_TOP + height / 2}" text-anchor="middle" font-size="12" '
        f'transform="rotate(-90 12 {_TOP + height / 2})">{html.escape(y_label)}</text>'
    )
    for i, (name, points) in enumerate(series.items()):
        colour = _COLOURS[i % len(_COLOURS)]
        shift = (i - (len(series) - 1) / 2) * 5
        if len(points) > 1:
            line = " ".join(f"{x(p[0], shift):.1f},{y(p[1]):.1f}" for p in points)
            parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}"/>')
        for at, value, low, high in points:
            if low is not None and high is not None:
                parts.append(
                    f'<line x1="{x(at, shift):.1f}" y1="{y(low):.1f}" x2="{x(at, shift):.1f}" '
                    f'y2="{y(high):.1f}" stroke="{colour}" stroke-width="2"/>'
                )
            parts.append(
                f'<circle cx="{x(at, shift):.1f}" cy="{y(value):.1f}" r="3.5" fill="{colour}">'
                f"<title>{html.escape(name)}: {at:,.0f} steps, {value:,.3g}</title></circle>"
            )
        legend_y = _TOP + 14 + 16 * i
        parts.append(
            f'<rect x="{_W - _RIGHT + 10}" y="{legend_y - 9}" width="10" height="10" '
            f'fill="{colour}"/><text x="{_W - _RIGHT + 24}" y="{legend_y}" '
            f'font-size="11">{html.escape(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _row(c: SuiteCell) -> list[str]:
    low, high = c.interval
    calls, tokens, cost = c.per_success(c.model_calls), c.per_success(c.tokens), c.cost_per_success
    return [
        _contender(c),
        c.task,
        f"{c.steps:,}",
        str(c.runs),
        f"{c.success_rate:.1%}",
        f"{low:.1%} – {high:.1%}",
        "n/a" if c.pass_k is None else f"{c.pass_k:.2f}",
        str(c.duplicate_effects),
        str(c.asked_again),
        "—" if calls is None else f"{calls:.1f}",
        "—" if tokens is None else f"{tokens:,.0f}",
        "—" if cost is None else f"{cost:.4f}",
        str(c.kills),
        str(sum(c.injected.values())),
        f"{c.wall_s:.1f}",
    ]


_HEADERS = (
    "contender",
    "task",
    "steps",
    "runs",
    "success",
    "Wilson 95 %",
    "pass^k",
    "duplicate effects",
    "effects asked again",
    "model calls / success",
    "tokens / success",
    "$ / success",
    "kills",
    "policy errors",
    "wall s",
)


def suite_html(cells: Sequence[SuiteCell], title: str = "mainspring horizon suite") -> str:
    """The suite's report: one self-contained HTML page (table, two inline SVG plots,
    the first failures of each cell)."""
    groups = _series(cells)
    steps = sorted({c.steps for c in cells})
    success: dict[str, list[_Point]] = {
        name: [(c.steps, c.success_rate, *c.interval) for c in group]
        for name, group in groups.items()
    }
    tokens: dict[str, list[_Point]] = {
        name: [(c.steps, t, None, None) for c in group if (t := c.per_success(c.tokens))]
        for name, group in groups.items()
    }
    head = "".join(f"<th>{html.escape(h)}</th>" for h in _HEADERS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in _row(c)) + "</tr>" for c in cells
    )
    failures = "".join(
        f"<li>{html.escape(_contender(c))} · {html.escape(c.task)} at {c.steps} steps: "
        f"{html.escape(f)}</li>"
        for c in cells
        for f in c.failures[:5]
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;max-width:64em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
        "td:nth-child(-n+2){text-align:left}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        "<p>A success is a run that ended succeeded with the world's end state exact and "
        "no effect twice; the bars are 95 % Wilson intervals; pass^k has k = runs. Model "
        "calls and tokens count every reply paid for, calls re-paid after a kill included; "
        f"cost prices every token at ${PRICE_PER_MTOK:.2f} per million.</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        "<h2>Success against steps</h2>"
        + _plot(
            "success rate against steps", "success", success, steps, y_log=False, kind="success"
        )
        + "<h2>Tokens per success against steps</h2>"
        + _plot(
            "tokens per success against steps",
            "tokens / success (log)",
            tokens,
            steps,
            y_log=True,
            kind="tokens",
        )
        + (f"<h2>Failures</h2><ul>{failures}</ul>" if failures else "")
        + "</body></html>\n"
    )
