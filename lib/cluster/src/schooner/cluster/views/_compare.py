"""`schooner compare A B`: versions of steps side by side in the terminal, and their metrics overlaid in a PNG.

A and B are step output folders, `name@key-prefix` (e.g. `checkpoints/nano@3fa2`), or a step name (its
latest version; a name given alone means its two latest versions). The config differences come from
`diff_configs` (the one `schooner explain` uses), the metrics from each folder's `metrics.jsonl`.

    schooner compare checkpoints/nano                    # its two latest versions
    schooner compare checkpoints/nano@3fa2 checkpoints/nano@9b1c --plot curves.png
    schooner compare runs/lr-1e-3 runs/lr-3e-3 runs/lr-1e-2 --html runs.html   # overlaid, sortable table
"""

from __future__ import annotations

import io
import os
import re
from typing import Any

from schooner.cluster.runner._progress import fmt_duration, make_console
from schooner.cluster.runner._version import ConfigError
from schooner.cluster.storage import atomic_write

from ._html import when
from ._metrics import numeric_series, read_metrics, summarize
from ._refs import resolve_versions as resolve_versions
from ._report_step import headline_result
from ._versions import Version, config_rows, short_labels

PLOT_INSTALL = "pip install 'schooner-cluster[plot]'  (in the workspace: uv sync --all-extras)"
"""How to get matplotlib for `--plot`."""


def _table(title: str, head: list[str]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, col in enumerate(head):
        table.add_column(col, justify="left" if i == 0 else "right", overflow="fold")
    return table


def _num(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def print_comparison(versions: list[Version], console: Any) -> None:
    """Print the versions, their config differences, results and metrics (final, minimum) side by side."""
    from rich.markup import escape

    keys = [v.key[:8] for v in versions]
    overview = _table("versions", ["", *keys])
    overview.add_row("step", *(escape(v.name) for v in versions))
    overview.add_row("state", *(v.state for v in versions))
    overview.add_row("started", *(when(v.record.get("started")) for v in versions))
    overview.add_row("took", *(fmt_duration(v.record.get("duration_s")) or "—" for v in versions))
    overview.add_row("folder", *(escape(v.folder) for v in versions))
    console.print(overview)
    rows = config_rows(versions)
    if rows:
        diff = _table(f"config differences (against {keys[-1]})", ["field", *keys])
        for row in rows:
            diff.add_row(escape(row.field), *(escape(x) for x in row.values))
        console.print(diff)
    else:
        console.print("no recorded config field or code version differs")
    results = [dict(headline_result(v.record.get("result"))) for v in versions]
    fields = list(dict.fromkeys(k for r in results for k in r))
    if fields:
        result = _table("result", ["field", *keys])
        for f in fields:
            result.add_row(escape(f), *(escape(_num(r[f])) if f in r else "—" for r in results))
        console.print(result)
    series = [numeric_series(read_metrics(v.folder)) for v in versions]
    names = list(dict.fromkeys(n for s in series for n in s))
    if not names:
        console.print("no metrics.jsonl in these folders")
        return
    head = ["metric", *(f"final {k}" for k in keys), *(f"min {k}" for k in keys)]
    metrics = _table("metrics.jsonl (final, and minimum @ step)", head)
    for m in names:
        sums = [summarize(s[m]) if m in s else None for s in series]
        finals = [_num(x.final) if x else "—" for x in sums]
        minima = [f"{_num(x.minimum)} @ {_num(x.min_step)}" if x else "—" for x in sums]
        metrics.add_row(escape(m), *finals, *minima)
    console.print(metrics)


def plot_comparison(versions: list[Version], out: str, metric: str | None = None) -> str:
    """Write a PNG of every metric (matching the regex `metric`), one panel each, one line per version.

    Raises:
        ConfigError: matplotlib is missing (with how to install it), or no metric matches.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(f"--plot draws with matplotlib, which is not installed: {PLOT_INSTALL}") from None
    series = [numeric_series(read_metrics(v.folder)) for v in versions]
    names = [n for n in dict.fromkeys(n for s in series for n in s) if metric is None or re.search(metric, n)]
    if not names:
        have = ", ".join(dict.fromkeys(n for s in series for n in s)) or "none (no metrics.jsonl)"
        raise ConfigError(f"no metric to plot (--metric {metric!r}); the versions' metrics: {have}")
    labels = short_labels(versions, config_rows(versions))
    cols = min(2, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 3.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for label, s in zip(labels, series, strict=True):
            if name in s:
                xs, ys = zip(*s[name], strict=True)
                ax.plot(xs, ys, label=label, marker="o" if len(xs) <= 30 else None, markersize=3)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    out = out if "://" in out else os.path.abspath(out)
    atomic_write(out, buffer.getvalue())
    return out


def compare(
    prefix: str,
    refs: list[str],
    plot: str | None = None,
    metric: str | None = None,
    *,
    html: str | None = None,
) -> None:
    """`schooner compare`: print the comparison of `refs` under `prefix`; with `plot`, write the PNG too; with
    `html`, a page of the runs overlaid with a sortable table of their hyperparameters and results.

    Raises:
        ConfigError: a ref names no step or folder (the message lists the steps under `prefix`).
    """
    console = make_console()
    versions = resolve_versions(prefix, refs)
    print_comparison(versions, console)
    if plot:
        console.print(f"plot written to {plot_comparison(versions, plot, metric)}")
    if html:
        from ._report import write_runs_page

        console.print(f"page written to {write_runs_page(prefix, refs, html)}")
