"""The run page's chart: cumulative tokens and cost, turn by turn, as inline SVG
(no JavaScript, no library; numbers only, so nothing in it needs escaping)."""

from __future__ import annotations

from collections.abc import Sequence

from ._timeline import Turn, money

__all__ = ["usage_chart"]

_W, _H = 640, 170
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 64, 10, 26
_TOKENS = "#2563eb"
_COST = "#b45309"  # amber 700: 5:1 on white (WCAG AA text)
_DOTS = 80  # up to this many turns, each gets a dot with its numbers on hover


def _compact(n: int) -> str:
    """An axis label that fits its margin: ``950``, ``204.6k``, ``3.65M``."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.2f}M"
    return f"{n / 1000:.1f}k" if n >= 10_000 else f"{n:,}"


def usage_chart(turns: Sequence[Turn]) -> str:
    """Two lines over the turns of a run: tokens (input + output, left scale) and
    cost (right scale), each cumulative from 0 before the first turn. Empty for a
    run without model calls."""
    calls = [t for t in turns if t.model is not None]
    if not calls:
        return ""
    points: list[tuple[int, int, float]] = [(calls[0].number - 1, 0, 0.0)]
    tokens, cost = 0, 0.0
    for t in calls:
        tokens += t.tokens_in + t.tokens_out
        cost += t.cost_usd
        points.append((t.number, tokens, cost))
    x0, x1 = points[0][0], points[-1][0]
    top_tokens = max(tokens, 1)
    top_cost = cost if cost > 0 else 1.0
    plot_w = _W - _LEFT - _RIGHT
    plot_h = _H - _TOP - _BOTTOM

    def x(n: int) -> float:
        return _LEFT + plot_w * (n - x0) / max(x1 - x0, 1)

    def y(fraction: float) -> float:
        return _TOP + plot_h * (1.0 - fraction)

    tok_line = " ".join(f"{x(n):.1f},{y(k / top_tokens):.1f}" for n, k, _ in points)
    cost_line = " ".join(f"{x(n):.1f},{y(c / top_cost):.1f}" for n, _, c in points)
    parts = [
        f'<svg class="chart" id="usage-chart" viewBox="0 0 {_W} {_H}" width="100%"'
        ' preserveAspectRatio="xMinYMin meet" role="img"'
        ' aria-label="cumulative tokens and cost by turn">',
        *(
            f'<line x1="{_LEFT}" y1="{y(at):.1f}" x2="{_W - _RIGHT}" y2="{y(at):.1f}"'
            f' class="{cls}"/>'
            for at, cls in ((0.0, "axis"), (1.0, "gridline"), (0.5, "gridline"))
        ),
        f'<text x="{_LEFT - 6}" y="{y(1) + 4:.1f}" text-anchor="end" fill="{_TOKENS}">'
        f"{_compact(tokens)}</text>",
        f'<text x="{_LEFT - 6}" y="{y(0) + 4:.1f}" text-anchor="end" fill="{_TOKENS}">0</text>',
        f'<text x="{_W - _RIGHT + 6}" y="{y(1) + 4:.1f}" fill="{_COST}">{money(cost)}</text>',
        f'<text x="{_W - _RIGHT + 6}" y="{y(0) + 4:.1f}" fill="{_COST}">$0</text>',
        f'<text x="{_LEFT}" y="{_H - 6}" class="tick">turn {x0 + 1}</text>',
        f'<text x="{_W - _RIGHT}" y="{_H - 6}" text-anchor="end" class="tick">turn {x1}</text>',
        f'<polyline class="tokens" fill="none" stroke="{_TOKENS}" stroke-width="2"'
        f' points="{tok_line}"/>',
    ]
    if cost > 0:
        parts.append(
            f'<polyline class="cost" fill="none" stroke="{_COST}" stroke-width="2"'
            f' stroke-dasharray="5 3" points="{cost_line}"/>'
        )
    if len(points) - 1 <= _DOTS:
        for n, k, c in points[1:]:
            parts.append(
                f'<circle cx="{x(n):.1f}" cy="{y(k / top_tokens):.1f}" r="2.5" fill="{_TOKENS}">'
                f"<title>turn {n}: {k:,} tokens, {money(c)}</title></circle>"
            )
    parts.append("</svg>")
    return "".join(parts)
