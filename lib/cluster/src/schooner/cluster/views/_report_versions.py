"""The report's side-by-side view of the versions of a step (every output folder of one step name).

One column per version, oldest first: key (linked to its card), state, start, duration, the result's
headline numbers and each metric's final value; then the config fields that differ (from `diff_configs`,
against the newest version); then every metric overlaid, one line per version, labelled by key and the
version's values of the differing fields.
"""

from __future__ import annotations

from ._html import anchor, badge, duration, esc, fmt, table, when
from ._metrics import numeric_series, read_metrics, summarize
from ._report_step import headline_result
from ._svg import Colours, line_chart
from ._versions import Version, config_rows, short_labels

CHARTS_SHOWN = 4
"""Overlaid metric charts shown open; the rest are collapsed under "more metrics"."""
MAX_RESULT_ROWS = 20
MAX_VERSIONS = 8
"""Versions compared side by side at most: the newest ones (each still has its own card)."""


def _metric_cell(points: list[tuple[float, float]] | None) -> str:
    if not points:
        return '<span class="muted">—</span>'
    s = summarize(points)
    return f'{fmt(s.final)} <span class="muted">(min {fmt(s.minimum)} @ {fmt(s.min_step)})</span>'


def _overview(versions: list[Version], series: list[dict[str, list[tuple[float, float]]]]) -> str:
    """Rows of facts, one column per version."""
    head = ["", *(v.key[:8] for v in versions)]
    rows = [
        ["key", *(f'<a href="#{anchor(v.key)}">{esc(v.key[:8])}</a>' for v in versions)],
        ["state", *(badge(v.state) for v in versions)],
        ["started", *(esc(when(v.record.get("started"))) for v in versions)],
        ["duration", *(esc(duration(v.record.get("duration_s"))) for v in versions)],
    ]
    results = [dict(headline_result(v.record.get("result"))) for v in versions]
    fields = list(dict.fromkeys(k for r in results for k in r))[:MAX_RESULT_ROWS]
    rows += [[f"result: {esc(f)}", *(fmt(r[f]) if f in r else "—" for r in results)] for f in fields]
    metrics = list(dict.fromkeys(name for s in series for name in s))
    rows += [[f"metric: {esc(m)}", *(_metric_cell(s.get(m)) for s in series)] for m in metrics]
    return table(head, rows, cls="versions")


def render_versions(name: str, versions: list[Version], colours: Colours | None = None) -> str:
    """The comparison card of the versions (oldest first) of the step `name` (the newest `MAX_VERSIONS`);
    `colours`: the page's series colours (a version keeps its colour in every chart)."""
    colours = colours or Colours()
    older = versions[:-MAX_VERSIONS]
    versions = versions[-MAX_VERSIONS:]
    series = [numeric_series(read_metrics(v.folder)) for v in versions]
    diff = config_rows(versions)
    labels = short_labels(versions, diff)
    parts = [
        f'<section class="card versions" id="versions-{esc(name)}">',
        f'<h3>{esc(name)} <span class="muted">{len(versions) + len(older)} versions</span></h3>',
        _overview(versions, series),
    ]
    if older:
        parts.insert(
            2, f'<p class="muted">{len(older)} older versions are not compared here (see their cards).</p>'
        )
    if diff:
        head = ["field", *(v.key[:8] for v in versions)]
        rows = [[esc(r.field), *(f"<code>{esc(x)}</code>" for x in r.values)] for r in diff]
        parts.append(f"<h4>Config differences</h4>{table(head, rows, cls='config-diff')}")
    else:
        parts.append('<p class="muted">No recorded config field or code version differs.</p>')
    names = list(dict.fromkeys(n for s in series for n in s))
    charts = [
        line_chart([(labels[i], s[n]) for i, s in enumerate(series) if n in s], title=n, colours=colours)
        for n in names
    ]
    if charts:
        parts.append(f'<h4>Metrics, overlaid</h4><div class="charts">{"".join(charts[:CHARTS_SHOWN])}</div>')
    if len(charts) > CHARTS_SHOWN:
        parts.append(
            f"<details><summary>More metrics ({len(charts) - CHARTS_SHOWN})</summary>"
            f'<div class="charts">{"".join(charts[CHARTS_SHOWN:])}</div></details>'
        )
    parts.append("</section>")
    return "\n".join(parts)
