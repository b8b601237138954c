"""Inline SVG line charts for the report: several series against one x axis, no JavaScript.

Each series is a `<g class="series">` holding a `<title>` (its label, shown as a tooltip), a polyline and,
for sparse series, a marker per measured point (with its own tooltip `label @ step: value`). Ticks sit on
round values, each a `<g class="xtick">`/`<g class="ytick">` holding its grid line and label, so the
chart's scale can be read back from the page. The legend is HTML below the chart.
"""

from __future__ import annotations

import html
import math

from ._metrics import Point, thin

PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
)
"""Series colours, in the order `Colours` hands them out (they repeat after ten series)."""
MAX_CHART_POINTS = 600
"""Points drawn per series at most (longer series are thinned, keeping the last point)."""
MARK_POINTS_UNDER = 30
"""Series with at most this many points get a marker on each measured point."""


CHAR_WIDTH = 0.62
"""A tick label's width per character, in ems (digits of the page's sans-serif are about 0.55 em): the
chart's margins are made wide enough for its widest label."""
FONT = 11


class Colours:
    """One colour per series label for a whole page: a label keeps its colour in every chart it is in
    (a series missing from one chart does not shift the others' colours); new labels take the next colour."""

    def __init__(self) -> None:
        self._given: dict[str, str] = {}

    def __call__(self, label: str) -> str:
        if label not in self._given:
            self._given[label] = PALETTE[len(self._given) % len(PALETTE)]
        return self._given[label]


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def nice_ticks(lo: float, hi: float) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten apart), about 3 to 8 of them, whose first and
    last enclose `[lo, hi]` as tightly as such ticks can (on a tie, the finer ticks)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
        raise ValueError(f"nice_ticks needs finite lo <= hi; got {lo=}, {hi=}")
    if hi == lo:
        pad = abs(lo) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    best: list[float] = []
    for count in range(4, 8):
        raw = (hi - lo) / (count - 1)
        power = 10 ** math.floor(math.log10(raw))
        step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
        first, last = math.floor(lo / step), math.ceil(hi / step)
        ticks = [round(k * step, 12) for k in range(first, last + 1)]
        if not best or ticks[-1] - ticks[0] <= best[-1] - best[0]:
            best = ticks
    return best


def _label(value: float) -> str:
    return f"{value:.6g}"


def tick_labels(ticks: list[float]) -> list[str]:
    """Labels for round `ticks`, with as many digits as it takes to tell neighbours apart (6 significant
    digits can print 1765000000 and 1765000005 alike), in plain notation where it is shorter."""
    for digits in range(3, 16):
        labels = [f"{v:.{digits}g}" for v in ticks]
        if len(set(labels)) == len(labels):
            break
    plain = [f"{v:.0f}" if float(v).is_integer() and abs(v) < 1e15 else lb for v, lb in zip(ticks, labels)]
    return plain if max(map(len, plain)) <= max(map(len, labels)) + 2 else labels


def _text_width(text: str) -> float:
    return CHAR_WIDTH * FONT * len(text)


def line_chart(
    series: list[tuple[str, list[Point]]],
    *,
    title: str,
    width: int = 540,
    height: int = 250,
    colours: Colours | None = None,
    x_label: str = "step",
) -> str:
    """An SVG chart of `series` (`(label, points sorted by x)`) with an HTML legend; '' when nothing to draw.

    `colours` gives each label its colour (pass one `Colours` for every chart of a page, so a series has
    one colour throughout); the margins fit the widest tick label, so no label is cut at the chart's edge.
    """
    colours = colours or Colours()
    drawn = [(label, thin(points, MAX_CHART_POINTS)) for label, points in series if points]
    if not drawn:
        return ""
    xs = [x for _, pts in drawn for x, _ in pts]
    ys = [y for _, pts in drawn for _, y in pts]
    xticks, yticks = nice_ticks(min(xs), max(xs)), nice_ticks(min(ys), max(ys))
    xlabels, ylabels = tick_labels(xticks), tick_labels(yticks)
    x0, x1, y0, y1 = xticks[0], xticks[-1], yticks[0], yticks[-1]
    left = max(40, round(_text_width(max(ylabels, key=len)) + 12))
    right = max(14, round(_text_width(xlabels[-1]) / 2 + 4))
    top, bottom = 12, 30

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def sy(y: float) -> float:
        return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)

    names = ", ".join(label for label, _ in drawn)
    parts = [
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{_esc(f"{title}: {names}")}">'
    ]
    for v, text in zip(yticks, ylabels, strict=True):
        y = sy(v)
        parts.append(
            f'<g class="ytick"><line x1="{left}" y1="{y:.2f}" x2="{width - right}" y2="{y:.2f}" stroke="#eceff3"/>'
            f'<text x="{left - 6}" y="{y + 4:.2f}" font-size="{FONT}" text-anchor="end">{text}</text></g>'
        )
    for v, text in zip(xticks, xlabels, strict=True):
        x = sx(v)
        parts.append(
            f'<g class="xtick"><line x1="{x:.2f}" y1="{top}" x2="{x:.2f}" y2="{height - bottom}" stroke="#f3f4f6"/>'
            f'<text x="{x:.2f}" y="{height - bottom + 15}" font-size="{FONT}" text-anchor="middle">{text}</text>'
            "</g>"
        )
    parts.append(
        f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
        'fill="none" stroke="#9aa1ac"/>'
        f'<text x="{(width + left - right) / 2:.0f}" y="{height - 5}" font-size="{FONT}" '
        f'text-anchor="middle">{_esc(x_label)}</text>'
    )
    legend = []
    for label, pts in drawn:
        color = colours(label)
        coords = " ".join(f"{sx(x):.2f},{sy(y):.2f}" for x, y in pts)
        parts.append(
            f'<g class="series"><title>{_esc(label)}</title>'
            f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{coords}"/>'
        )
        if len(pts) <= MARK_POINTS_UNDER:
            parts.extend(
                f'<circle cx="{sx(x):.2f}" cy="{sy(y):.2f}" r="2.6" fill="{color}">'
                f"<title>{_esc(label)} @ {_label(x)}: {_label(y)}</title></circle>"
                for x, y in pts
            )
        parts.append("</g>")
        legend.append(f'<li><span class="swatch" style="background:{color}"></span>{_esc(label)}</li>')
    parts.append("</svg>")
    return (
        f'<figure class="chart"><figcaption>{_esc(title)}</figcaption>{"".join(parts)}'
        f'<ul class="legend">{"".join(legend)}</ul></figure>'
    )
