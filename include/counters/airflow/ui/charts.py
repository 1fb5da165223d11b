"""Small time-series charts as inline SVG: no JavaScript, no CDN, nothing to build.

Pure functions of the points; colours come from CSS classes (``chart-bar``, ``chart-line``,
``chart-limit``), so the page's light and dark themes apply. Every mark has a ``<title>``, which
browsers show as a tooltip.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape

from ...core import clock_label, to_text

WIDTH = 560
HEIGHT = 170
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 12, 24


@dataclass(frozen=True)
class Point:
    at: datetime
    value: float
    label: str = ""
    """the tooltip (defaults to the time and the value)"""


def nice_step(span: float, ticks: int = 4) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving about ``ticks`` intervals."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power


def format_number(value: float) -> str:
    """Axis labels: 1.2k, 3.4M; small values with at most two decimals."""
    magnitude = abs(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= limit:
            return f"{value / limit:.3g}{suffix}"
    if value == int(value):
        return str(int(value))
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _time_label(moment: datetime, span: timedelta) -> str:
    return clock_label(moment, with_day=span > timedelta(days=1))


def time_chart(
    points: Sequence[Point],
    *,
    title: str,
    unit: str = "",
    bars: bool = False,
    limit: float | None = None,
    limit_label: str = "",
) -> str:
    """An SVG chart of values over time: bars (per-run amounts) or a line (durations, lags),
    with an optional horizontal limit line (e.g. the freshness limit)."""
    head = (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(title)}</title>"
    )
    if not points:
        return (
            f'{head}<text class="chart-empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" '
            'text-anchor="middle">no runs to plot</text></svg>'
        )
    ordered = sorted(points, key=lambda p: p.at)
    start, end = ordered[0].at, ordered[-1].at
    if end <= start:  # one point (or all at once): a minute around it
        start, end = start - timedelta(seconds=30), end + timedelta(seconds=30)
    top_value = max([p.value for p in ordered] + ([limit] if limit is not None else []) + [0])
    step = nice_step(top_value or 1)
    y_max = step * math.ceil((top_value or 1) / step)
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    span = (end - start).total_seconds()

    def x(moment: datetime) -> float:
        return LEFT + plot_w * (moment - start).total_seconds() / span

    def y(value: float) -> float:
        return TOP + plot_h * (1 - max(value, 0) / y_max)

    parts = [head]
    tick = 0.0
    while tick <= y_max + step / 2:
        ty = y(tick)
        parts.append(
            f'<line class="chart-grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{ty:.1f}" '
            f'y2="{ty:.1f}"/><text class="chart-axis" x="{LEFT - 6}" y="{ty + 4:.1f}" '
            f'text-anchor="end">{escape(format_number(tick))}</text>'
        )
        tick += step
    for moment, anchor in ((start, "start"), (end, "end")):
        parts.append(
            f'<text class="chart-axis" x="{x(moment):.1f}" y="{HEIGHT - 6}" '
            f'text-anchor="{anchor}">{escape(_time_label(moment, end - start))}</text>'
        )
    if limit is not None:
        ly = y(limit)
        parts.append(
            f'<line class="chart-limit" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{ly:.1f}" '
            f'y2="{ly:.1f}"><title>{escape(limit_label or format_number(limit))}</title></line>'
        )

    def tooltip(point: Point) -> str:
        return escape(
            point.label or f"{to_text(point.at)}: {format_number(point.value)} {unit}".strip()
        )

    if bars:
        width = max(1.5, min(24.0, plot_w / max(len(ordered), 1) * 0.7))
        for point in ordered:
            top = y(point.value)
            parts.append(
                f'<rect class="chart-bar" x="{x(point.at) - width / 2:.1f}" y="{top:.1f}" '
                f'width="{width:.1f}" height="{max(TOP + plot_h - top, 0):.1f}">'
                f"<title>{tooltip(point)}</title></rect>"
            )
    else:
        path = " ".join(f"{x(p.at):.1f},{y(p.value):.1f}" for p in ordered)
        parts.append(f'<polyline class="chart-line" points="{path}"/>')
        for point in ordered:
            parts.append(
                f'<circle class="chart-dot" cx="{x(point.at):.1f}" cy="{y(point.value):.1f}" '
                f'r="2.5"><title>{tooltip(point)}</title></circle>'
            )
    parts.append("</svg>")
    return "".join(parts)
