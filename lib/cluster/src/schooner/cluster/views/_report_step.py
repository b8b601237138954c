"""The report's card for one step output folder: what ran, how it ended, what it wrote.

Generic for any step. Results first: its error, result, the tables its result names under `"tables"`, every
numeric series of its `metrics.jsonl` (one chart per family; a wall-clock column is a stat), the samples it
wrote (`samples.json` / `samples.jsonl`, as evaluation writes its generations) and every PNG at the top of its
folder (embedded). Then the bookkeeping: its record (function, version, times, inputs, resources), every attempt
from its history (tracebacks collapsed), a listing of its files, its output, config and result as JSON.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from schooner.cluster.records import META_DIR
from schooner.cluster.storage import is_plain_path

from ._html import (
    anchor,
    badge,
    duration,
    error_block,
    esc,
    flatten_scalars,
    fmt,
    href,
    kv_table,
    pre_json,
    table,
    when,
)
from ._metrics import families, numeric_series, read_metrics, summarize, wall_clock
from ._samples import samples_section
from ._svg import Colours, line_chart
from ._versions import Version

MAX_EMBED_BYTES = 3 * 1024 * 1024
"""PNGs larger than this are linked, not embedded."""
MAX_FILES_LISTED = 40
MAX_RESULT_ROWS = 40
MAX_TABLE_ROWS = 200
NOT_HEADLINE = ("config", "versions", "env", "packages")
"""Result keys left out of the result tables (still in the JSON view): copies of config and environment."""


def headline_result(result: Any) -> list[tuple[str, Any]]:
    """The result's numbers and short strings as `(dotted.path, value)`, without copies of config/env."""
    if isinstance(result, dict):
        result = {k: v for k, v in result.items() if k not in NOT_HEADLINE}
    return flatten_scalars(result) if result is not None else []


def _cell(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f'<span class="num">{fmt(value)}</span>'
    return esc("—" if value is None else value)


def _table_problem(t: Any) -> str | None:
    """What keeps `t` from being a table, or None."""
    if not isinstance(t, dict):
        return f"a {type(t).__name__}, not a dict with title, columns and rows"
    for key in ("columns", "rows"):
        if not isinstance(t.get(key), list):
            return f'"{key}" is {"missing" if key not in t else "a " + type(t[key]).__name__}, not a list'
    for j, r in enumerate(t["rows"]):
        if not isinstance(r, list):
            return f"row {j} is a {type(r).__name__}, not a list"
        if len(r) != len(t["columns"]):
            return f"row {j} has {len(r)} values for {len(t['columns'])} columns"
    return None


def tables_section(result: Any) -> str:
    """The tables a step's result names: `result["tables"]`, a list of `{"title": str, "columns": [str, ...],
    "rows": [[value, ...], ...]}` (values are numbers, strings or None). An entry of another shape is named in
    a line of its own, never dropped silently; rows past MAX_TABLE_ROWS are counted."""
    if not isinstance(result, dict) or "tables" not in result:
        return ""
    tables = result["tables"]
    if not isinstance(tables, list):
        return (
            f'<p class="muted">result.tables is not a list of tables (got {esc(type(tables).__name__)}): '
            'a step names its tables as [{"title": ..., "columns": [...], "rows": [[...], ...]}, ...]</p>'
        )
    parts = []
    for i, t in enumerate(tables):
        problem = _table_problem(t)
        if problem:
            parts.append(
                f'<p class="muted">result.tables[{i}] is not a table: {esc(problem)}; see the JSON below</p>'
            )
            continue
        rows = t["rows"]
        body = table(
            [str(c) for c in t["columns"]],
            ([_cell(v) for v in r] for r in rows[:MAX_TABLE_ROWS]),
            cls="named",
        )
        more = len(rows) - MAX_TABLE_ROWS
        tail = f'<p class="muted">… {more} more rows in the JSON below</p>' if more > 0 else ""
        parts.append(f"<h4>{esc(t.get('title') or f'Table {i + 1}')}</h4>{body}{tail}")
    return "".join(parts)


def list_outputs(folder: str) -> list[tuple[str, int | None, bool]]:
    """(name, size or None, is_dir) of the top-level entries of an output folder, without runner files."""
    try:
        if is_plain_path(folder):
            entries = []
            for name in sorted(os.listdir(folder)):
                full = os.path.join(folder, name)
                is_dir = os.path.isdir(full)
                entries.append((name, None if is_dir else os.path.getsize(full), is_dir))
        else:
            import fsspec

            fs, root = fsspec.core.url_to_fs(folder)
            entries = [
                (e["name"].rstrip("/").rsplit("/", 1)[-1], e.get("size"), e.get("type") == "directory")
                for e in fs.ls(root, detail=True)
            ]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [e for e in sorted(entries) if e[0] != META_DIR and not e[0].startswith(".tmp")]


def _read_bytes(path: str) -> bytes | None:
    try:
        if is_plain_path(path):
            with open(path, "rb") as f:
                return f.read()
        import fsspec

        with fsspec.open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _summary_row(name: str, points: list[tuple[float, float]]) -> list[str]:
    s = summarize(points)
    return [esc(name), f'<span class="num">{fmt(s.final)}</span>', f"{fmt(s.final_step)}",
            f'<span class="num">{fmt(s.minimum)}</span>', f"{fmt(s.min_step)}", str(s.count)]  # fmt: skip


def _wall_clock_line(rows: list[dict[str, Any]]) -> str:
    span = wall_clock(rows)
    if span is None:
        return ""
    steps = [
        r["step"] for r in rows if isinstance(r.get("step"), int | float) and not isinstance(r["step"], bool)
    ]
    rate = ""
    if steps and span.seconds > 0 and max(steps) > min(steps):
        rate = f", {(max(steps) - min(steps)) / span.seconds:.3g} steps/s"
    return (
        f'<p class="wall-clock">Wall clock ({esc(span.column)}): {span.seconds:.1f} s from the first to the '
        f"last of {span.rows} rows, {esc(when(span.first))} to {esc(when(span.last))}{rate}</p>"
    )


def metrics_section(folder: str, colours: Colours | None = None) -> str:
    """One chart per family of the numeric series of `metrics.jsonl`, a table of each series' final and
    minimum, and the wall-clock span (a stat, not a curve)."""
    rows = read_metrics(folder)
    series = numeric_series(rows)
    if not series:
        return _wall_clock_line(rows)
    summary = table(
        ["series", "final", "at step", "min", "at step", "points"],
        (_summary_row(name, pts) for name, pts in series.items()),
        cls="metrics",
    )
    colours = colours or Colours()
    charts = "".join(
        line_chart([(n, series[n]) for n in names], title=family, colours=colours)
        for family, names in families(list(series))
    )
    return (
        f'<h4>Metrics <span class="muted">({len(rows)} rows of metrics.jsonl)</span></h4>'
        f'<div class="charts">{charts}</div>{_wall_clock_line(rows)}{summary}'
    )


def plots_section(folder: str, outputs: list[tuple[str, int | None, bool]], out_dir: str | None) -> str:
    """Every PNG at the top of the folder, embedded as a data URI (linked when too large)."""
    parts = []
    for fname, size, is_dir in outputs:
        if is_dir or not fname.lower().endswith(".png"):
            continue
        link = href(f"{folder}/{fname}", out_dir)
        data = _read_bytes(f"{folder}/{fname}") if size is not None and size <= MAX_EMBED_BYTES else None
        if data is not None and data.startswith(b"\x89PNG"):
            src = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
            parts.append(
                f'<a href="{link}"><img class="plot" alt="{esc(fname)}" title="{esc(fname)}" src="{src}"></a>'
            )
        else:
            parts.append(f'<p><a href="{link}">{esc(fname)}</a> (not embedded)</p>')
    return "".join(parts)


def files_section(folder: str, outputs: list[tuple[str, int | None, bool]], out_dir: str | None) -> str:
    """The folder's top-level files, linked, collapsed."""
    if not outputs:
        return ""
    items = "".join(
        f'<li><a href="{href(f"{folder}/{n}", out_dir)}">{esc(n)}{"/" if d else ""}</a>'
        f"{'' if s is None else f' <span class=muted>({s:,} bytes)</span>'}</li>"
        for n, s, d in outputs[:MAX_FILES_LISTED]
    )
    more = f"<li>… {len(outputs) - MAX_FILES_LISTED} more</li>" if len(outputs) > MAX_FILES_LISTED else ""
    return f"<details><summary>Files ({len(outputs)})</summary><ul>{items}{more}</ul></details>"


def history_section(version: Version) -> str:
    """Every attempt at this folder (run, outcome, times, host), each error's traceback collapsed."""
    attempts = version.history()
    if not attempts:
        return ""
    rows = [
        [esc(a.get("run_id") or "—"), badge(a.get("state") or "UNKNOWN"), esc(when(a.get("started"))),
         esc(duration(a.get("duration_s"))), esc(a.get("host") or "—"), error_block(a.get("error") or "")]
        for a in attempts
    ]  # fmt: skip
    return f"<h4>Attempts ({len(attempts)})</h4>{table(['run', 'outcome', 'started', 'took', 'host', 'error'], rows, cls='history')}"


def _record_rows(version: Version, names: dict[str, str], out_dir: str | None) -> list[tuple[str, str]]:
    record, folder = version.record, version.folder
    inputs = [
        f'<a href="#{anchor(i.get("key", ""))}">{esc(names.get(i.get("key", ""), i.get("key", "")[:8]))}</a> '
        f'<span class="muted">({esc(i.get("field"))})</span>'
        for i in record.get("inputs") or []
    ]
    env = record.get("env") or {}
    rows = [
        ("output", f'<a href="{href(folder, out_dir)}">{esc(folder)}</a>'),
        ("function", esc(record.get("fn", "—"))),
        ("version", esc(record.get("version") or "—")),
        ("started", esc(when(record.get("started")))),
        ("ended", esc(when(record.get("ended")))),
        ("duration", esc(duration(record.get("duration_s")))),
        ("inputs", ", ".join(inputs) or "—"),
        ("run", esc(f"{record.get('run_id', '—')} on {env.get('host', '?')}")),
    ]
    git = env.get("git") or {}
    if git:
        rows.append(("code", esc(f"{git.get('commit', '')[:12]}{' (dirty)' if git.get('dirty') else ''}")))
    if record.get("resources"):
        res = {k: v for k, v in record["resources"].items() if v not in (None, {}, [], 0)}
        rows.append(("resources", esc(json.dumps(res, sort_keys=True))))
    return rows


def render_step(
    version: Version, names: dict[str, str], out_dir: str | None, colours: Colours | None = None
) -> str:
    """The card of one step output folder, results first; `names` maps step keys to names (for its inputs),
    `colours` the page's series colours."""
    record, folder = version.record, version.folder
    parts = [
        f'<section class="card step" id="{anchor(version.key)}">',
        f'<h3>{esc(version.name)} {badge(version.state)} <span class="muted key">{esc(version.key[:8])}</span></h3>',
    ]
    if record.get("description"):
        parts.append(f"<p>{esc(record['description'])}</p>")
    error = record.get("error") or (version.status.error if version.status else "")
    if error and version.state != "SUCCESS":
        parts.append(error_block(error))
    scalars = headline_result(record.get("result"))
    if scalars:
        body = "".join(
            f'<tr><td>{esc(k)}</td><td class="num">{fmt(v)}</td></tr>' for k, v in scalars[:MAX_RESULT_ROWS]
        )
        more = len(scalars) - MAX_RESULT_ROWS
        tail = f'<p class="muted">… {more} more in the JSON below</p>' if more > 0 else ""
        parts.append(f'<h4>Result</h4><table class="result">{body}</table>{tail}')
    outputs = list_outputs(folder)
    parts += [
        tables_section(record.get("result")),
        metrics_section(folder, colours),
        samples_section(folder, outputs),
        plots_section(folder, outputs, out_dir),
        "<h4>Record</h4>" + kv_table(_record_rows(version, names, out_dir)),
        history_section(version),
        files_section(folder, outputs, out_dir),
    ]
    if record.get("logs_tail"):
        parts.append(
            f"<details><summary>Output (tail)</summary><pre>{esc(record['logs_tail'])}</pre></details>"
        )
    if record.get("config") is not None:
        parts.append(f"<details><summary>Config</summary>{pre_json(record['config'])}</details>")
    if record.get("result") is not None:
        parts.append(f"<details><summary>Result (JSON)</summary>{pre_json(record['result'])}</details>")
    parts.append("</section>")
    return "\n".join(p for p in parts if p)
