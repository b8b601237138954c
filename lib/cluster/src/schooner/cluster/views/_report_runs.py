"""Several runs on one page, as W&B and TensorBoard show them: every metric overlaid (one line per run, one
colour per run in every chart) and a table of the runs, one row each, with their hyperparameters (the config
fields on which they differ), results and final metrics, sortable by any column with a click (a few lines of
inline JavaScript: the page still opens offline, from disk or as an attachment).

The runs are step versions of any names (`schooner report A B ...`, `schooner compare A B --html OUT`).
"""

from __future__ import annotations

from typing import Any

from ._html import anchor, badge, esc, fmt
from ._metrics import numeric_series, read_metrics, summarize
from ._report_step import headline_result
from ._svg import Colours, line_chart
from ._versions import Version, config_rows, short_labels

MAX_RESULT_COLUMNS = 20

SORT_SCRIPT = """<script>
/* Sort a table.sortable by the clicked column: numbers as numbers, empty cells last; click again to reverse. */
document.querySelectorAll('table.sortable').forEach(function (table) {
  var heads = table.tHead.rows[0].cells;
  Array.prototype.forEach.call(heads, function (th, col) {
    th.addEventListener('click', function () {
      var ascending = th.getAttribute('aria-sort') !== 'ascending';
      Array.prototype.forEach.call(heads, function (h) { h.removeAttribute('aria-sort'); });
      th.setAttribute('aria-sort', ascending ? 'ascending' : 'descending');
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[col].getAttribute('data-sort'), y = b.cells[col].getAttribute('data-sort');
        if (x === '' || y === '') { return (x === '') - (y === ''); }
        var nx = Number(x), ny = Number(y);
        var order = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
        return ascending ? order : -order;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
</script>"""
"""The page's one script: inline, no network."""


def _sort_value(value: Any) -> str:
    if value is None or value == "—":
        return ""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int | float):
        return repr(float(value))
    text = str(value)
    try:
        return repr(float(text))
    except ValueError:
        return text.strip('"')


def _column_names(groups: list[list[str]]) -> list[list[str]]:
    """Headers of the hyperparameter, result and metric columns, a name taken twice marked by its group."""
    seen: set[str] = set()
    out = []
    for suffix, names in zip(("", " (result)", " (metric)"), groups, strict=True):
        heads = []
        for n in names:
            head = n if n not in seen else f"{n}{suffix}"
            seen.add(head)
            heads.append(head)
        out.append(heads)
    return out


def runs_table(versions: list[Version]) -> str:
    """One row per run: name, key, state, hyperparameters, results, each metric's final value; sortable."""
    diff = config_rows(versions)
    results = [dict(headline_result(v.record.get("result"))) for v in versions]
    result_fields = list(dict.fromkeys(k for r in results for k in r))[:MAX_RESULT_COLUMNS]
    series = [numeric_series(read_metrics(v.folder)) for v in versions]
    metric_names = list(dict.fromkeys(n for s in series for n in s))
    hp_heads, result_heads, metric_heads = _column_names(
        [[r.field for r in diff], result_fields, metric_names]
    )
    head = ["run", "key", "state", *hp_heads, *result_heads, *metric_heads]
    rows = []
    for i, v in enumerate(versions):
        cells = [
            (v.name, f'<a href="#{anchor(v.key)}">{esc(v.name)}</a>'),
            (v.key[:8], esc(v.key[:8])),
            (v.state, badge(v.state)),
            *((r.values[i], f"<code>{esc(r.values[i])}</code>") for r in diff),
            *((results[i].get(f), fmt(results[i][f]) if f in results[i] else "—") for f in result_fields),
        ]
        for m in metric_names:
            final = summarize(series[i][m]).final if m in series[i] else None
            cells.append((final, fmt(final) if final is not None else "—"))
        rows.append(
            "<tr>" + "".join(f'<td data-sort="{esc(_sort_value(s))}">{c}</td>' for s, c in cells) + "</tr>"
        )
    th = "".join(f'<th title="click to sort">{esc(h)}</th>' for h in head)
    return (
        f'<div class="wide"><table class="sortable runs"><thead><tr>{th}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def run_labels(versions: list[Version]) -> list[str]:
    """A legend label per run: its name (when the runs have several), key and differing field values."""
    labels = short_labels(versions, config_rows(versions))
    if len({v.name for v in versions}) > 1:
        labels = [f"{v.name} {label}" for v, label in zip(versions, labels, strict=True)]
    return labels


def render_runs(versions: list[Version], colours: Colours | None = None) -> str:
    """The card of several runs: the sortable table, then every metric overlaid (one chart per metric)."""
    colours = colours or Colours()
    labels = run_labels(versions)
    series = [numeric_series(read_metrics(v.folder)) for v in versions]
    names = list(dict.fromkeys(n for s in series for n in s))
    charts = "".join(
        line_chart([(labels[i], s[n]) for i, s in enumerate(series) if n in s], title=n, colours=colours)
        for n in names
    )
    none = '<p class="muted">None of these runs wrote a metrics.jsonl.</p>' if not names else ""
    return (
        f'<section class="card runs" id="runs"><h3>{len(versions)} runs compared</h3>'
        f'<p class="muted">Click a column header to sort by it.</p>{runs_table(versions)}'
        f'<h4>Metrics, overlaid</h4>{none}<div class="charts">{charts}</div></section>'
    )
