"""`schooner report`: one static, self-contained HTML page describing everything under a prefix.

It reads only what the step runner writes — experiment records (`{prefix}/experiments/*.json`), each step's
record and status (`{output}/.schooner/step.json`, `status.json`) — plus, from each step's output folder, its
top-level file listing, PNG plots (embedded as data URIs, so the page is one file) and `metrics.jsonl` when
present (drawn as an inline SVG chart of its loss-like columns). No JavaScript, no network: inline CSS only,
so the page opens from disk, from an object store, or as an e-mail attachment.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import time
from collections.abc import Iterable
from typing import Any

from schooner.cluster._storage import is_local, normalize_prefix, storage_for
from schooner.cluster.runner._status import META_DIR, read_status, scan_prefix

MAX_EMBED_BYTES = 3 * 1024 * 1024
"""PNGs larger than this are linked, not embedded."""
MAX_FILES_LISTED = 40
MAX_CHART_POINTS = 600
_NOT_HEADLINE = ("config", "versions", "env", "packages")
"""Result keys left out of the result table (still in the JSON view): copies of config and environment."""

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#1d2433;background:#f6f7f9}
header{background:#12324a;color:#fff;padding:18px 28px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;opacity:.85}main{padding:18px 28px;max-width:1200px}
section.card{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:14px 18px;margin:14px 0}
h2{font-size:18px;margin:22px 0 6px}h3{font-size:16px;margin:0 0 6px}
table{border-collapse:collapse;width:100%;margin:6px 0}th,td{border-bottom:1px solid #eceff3;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f0f2f5;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f4f6f8;border-radius:6px;padding:8px 10px;overflow:auto;max-height:420px;font-size:12px;margin:4px 0}
pre.error{background:#fdecec;color:#8a1f1f}
.badge{display:inline-block;border-radius:10px;padding:1px 9px;font-size:12px;font-weight:600;color:#fff}
.SUCCESS,.succeeded,.cached,.ok{background:#2e7d32}.FAILED,.failed,.bad{background:#c62828}
.RUNNING,.running{background:#1565c0}.skipped,.UNKNOWN,.will_run{background:#757575}.INTERRUPTED{background:#ef6c00}
.muted{color:#6b7280}.kv td:first-child{width:190px;color:#4b5563}
img.plot{max-width:100%;border:1px solid #eceff3;border-radius:4px;margin:4px 8px 4px 0}
details summary{cursor:pointer;color:#12324a;margin:4px 0}svg.chart{background:#fff;margin:6px 0}
a{color:#1a5e9a}
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _when(t: Any) -> str:
    if not isinstance(t, int | float) or not t:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float) or seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {seconds % 60:.0f} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def _read_json(storage: Any, path: str) -> Any:
    text = storage.read_text(path)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------------------
# Collecting records
# --------------------------------------------------------------------------------------------------------
def collect(prefix: str) -> dict[str, Any]:
    """Everything the report shows: `{"prefix", "experiments": [...], "steps": [...]}` (records as written)."""
    prefix = normalize_prefix(prefix)
    storage = storage_for(prefix)
    experiments = []
    for path in storage.glob(f"{prefix}/experiments/**/*.json"):
        record = _read_json(storage, path)
        if isinstance(record, dict):
            experiments.append({**record, "_path": path})
    experiments.sort(key=lambda e: e.get("started") or 0, reverse=True)
    folders = [f.output_path for f in scan_prefix(prefix)] if storage.exists(prefix) else []
    # steps written outside the prefix (override_output_path) are known from the experiment records
    for exp in experiments:
        for s in exp.get("steps") or []:
            out = s.get("output_path")
            if isinstance(out, str) and out not in folders:
                folders.append(out)
    steps = []
    for folder in dict.fromkeys(folders):
        st_storage = storage_for(folder)
        record = _read_json(st_storage, f"{folder}/{META_DIR}/step.json")
        status = read_status(st_storage, folder)
        if record is None and status is None:
            continue
        entry = {"folder": folder, "record": record or {}, "status": status}
        entry["state"] = _state_of(entry)
        steps.append(entry)
    steps.sort(key=lambda s: (s["record"].get("started") or 0, s["folder"]))
    return {"prefix": prefix, "experiments": experiments, "steps": steps}


# --------------------------------------------------------------------------------------------------------
# Rendering helpers
# --------------------------------------------------------------------------------------------------------
def _href(target: str, out_dir: str | None) -> str:
    """A link to `target` that works from the report's folder (relative when both are local)."""
    if is_local(target) and out_dir is not None:
        return _esc(os.path.relpath(target, out_dir).replace(os.sep, "/"))
    if is_local(target):
        return _esc("file://" + os.path.abspath(target))
    return _esc(target)


def _flatten_scalars(
    value: Any, prefix: str = "", out: list[tuple[str, Any]] | None = None
) -> list[tuple[str, Any]]:
    out = [] if out is None else out
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten_scalars(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, bool | int | float) or (isinstance(value, str) and len(value) <= 120):
        out.append((prefix or "value", value))
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return _esc(v)


def _state_of(step: dict[str, Any]) -> str:
    """SUCCESS / FAILED / RUNNING from the status file; INTERRUPTED for a RUNNING step whose lease is stale."""
    status = step["status"]
    if status is None:
        return str(step["record"].get("state") or "UNKNOWN")
    if status.state.value == "RUNNING":
        from schooner.cluster.runner._lease import parse_lease

        lease = parse_lease(storage_for(step["folder"]).read_text(f"{step['folder']}/{META_DIR}/lease.json"))
        if lease is None or lease.is_stale():
            return "INTERRUPTED"
    return status.state.value


def _loss_keys(rows: list[dict[str, Any]]) -> list[str]:
    """Up to 4 loss columns to draw: the headline train and eval losses first, auxiliary terms (z-loss) never."""
    found = {k for r in rows for k, v in r.items() if "loss" in k.lower() and isinstance(v, int | float)}
    found = {k for k in found if "z_loss" not in k and not k.endswith("ce_loss")}

    def rank(k: str) -> tuple[int, str]:
        order = ("train/loss", "loss", "eval/loss", "validation/loss")
        return (order.index(k) if k in order else len(order), k)

    return sorted(found, key=rank)[:4]


def _chart(rows: list[dict[str, Any]]) -> str:
    """An inline SVG line chart of the loss-like numeric columns of metrics rows against `step`."""
    keys = _loss_keys(rows)
    series = []
    for k in keys:
        pts = [(r.get("step", i), r[k]) for i, r in enumerate(rows) if isinstance(r.get(k), int | float)]
        pts = [(float(x), float(y)) for x, y in pts if math.isfinite(float(x)) and math.isfinite(float(y))]
        if len(pts) > MAX_CHART_POINTS:
            stride = math.ceil(len(pts) / MAX_CHART_POINTS)
            pts = pts[::stride] + [pts[-1]]
        if pts:
            series.append((k, pts))
    if not series:
        return ""
    w, h, pad_l, pad_b, pad_t, pad_r = 640, 260, 58, 34, 14, 14
    xs = [x for _, p in series for x, _ in p]
    ys = [y for _, p in series for _, y in p]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(ys), max(ys) if max(ys) > min(ys) else min(ys) + 1

    def sx(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * (w - pad_l - pad_r)

    def sy(y: float) -> float:
        return h - pad_b - (y - y0) / (y1 - y0) * (h - pad_b - pad_t)

    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    parts = [
        f'<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" xmlns="http://www.w3.org/2000/svg" '
        f'role="img" aria-label="loss curve">',
        f'<line x1="{pad_l}" y1="{h - pad_b}" x2="{w - pad_r}" y2="{h - pad_b}" stroke="#888"/>',
        f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{h - pad_b}" stroke="#888"/>',
    ]
    for frac in (0.0, 0.5, 1.0):
        y = y0 + frac * (y1 - y0)
        parts.append(
            f'<text x="{pad_l - 6}" y="{sy(y) + 4:.1f}" font-size="11" text-anchor="end">{y:.4g}</text>'
        )
        x = x0 + frac * (x1 - x0)
        parts.append(
            f'<text x="{sx(x):.1f}" y="{h - pad_b + 16}" font-size="11" text-anchor="middle">{x:.6g}</text>'
        )
    parts.append(
        f'<text x="{(w + pad_l) / 2:.0f}" y="{h - 4}" font-size="11" text-anchor="middle">step</text>'
    )
    for i, (k, pts) in enumerate(series):
        color = colors[i % len(colors)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{coords}"/>')
        if len(pts) <= 30:  # sparse series (periodic evals): mark the measured points
            parts.extend(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>' for x, y in pts
            )
        parts.append(
            f'<text x="{w - pad_r - 4}" y="{pad_t + 12 + 14 * i}" font-size="12" text-anchor="end" '
            f'fill="{color}">{_esc(k)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _metrics_rows(storage: Any, folder: str) -> list[dict[str, Any]]:
    text = storage.read_text(f"{folder}/metrics.jsonl")
    rows = []
    for line in (text or "").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line being appended while we read
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _list_outputs(folder: str) -> list[tuple[str, int | None, bool]]:
    """(name, size or None, is_dir) of the top-level entries of an output folder, without runner files."""
    try:
        if is_local(folder):
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


def _read_bytes(folder: str, name: str) -> bytes | None:
    path = f"{folder}/{name}"
    try:
        if is_local(path):
            with open(path, "rb") as f:
                return f.read()
        import fsspec

        with fsspec.open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _kv_table(rows: Iterable[tuple[str, str]]) -> str:
    body = "".join(f"<tr><td>{_esc(k)}</td><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _pre_json(value: Any) -> str:
    return f"<pre>{_esc(json.dumps(value, indent=2, sort_keys=True, default=str))}</pre>"


def _anchor(key: str) -> str:
    return f"step-{_esc(key[:16])}"


# --------------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------------
def _render_step(step: dict[str, Any], keys: dict[str, str], out_dir: str | None) -> str:
    record, folder = step["record"], step["folder"]
    state = step["state"]
    name = record.get("name") or (step["status"].name if step["status"] else os.path.basename(folder))
    key = record.get("key") or (step["status"].key if step["status"] else "")
    storage = storage_for(folder)
    parts = [
        f'<section class="card" id="{_anchor(key)}">',
        f'<h3>{_esc(name)} <span class="badge {_esc(state)}">{_esc(state)}</span> '
        f'<span class="muted">{_esc(key[:8])}</span></h3>',
    ]
    if record.get("description"):
        parts.append(f"<p>{_esc(record['description'])}</p>")
    inputs = []
    for item in record.get("inputs") or []:
        k = item.get("key", "")
        label = keys.get(k, k[:8])
        inputs.append(
            f'<a href="#{_anchor(k)}">{_esc(label)}</a> <span class="muted">({_esc(item.get("field"))})</span>'
        )
    env = record.get("env") or {}
    git = env.get("git") or {}
    rows = [
        ("output", f'<a href="{_href(folder, out_dir)}">{_esc(folder)}</a>'),
        ("function", _esc(record.get("fn", "—"))),
        ("version", _esc(record.get("version") or "—")),
        ("started", _esc(_when(record.get("started")))),
        ("ended", _esc(_when(record.get("ended")))),
        ("duration", _esc(_duration(record.get("duration_s")))),
        ("inputs", ", ".join(inputs) or "—"),
        ("run", _esc(f"{record.get('run_id', '—')} on {env.get('host', '?')}")),
    ]
    if git:
        rows.append(("code", _esc(f"{git.get('commit', '')[:12]}{' (dirty)' if git.get('dirty') else ''}")))
    if record.get("resources"):
        res = {k: v for k, v in record["resources"].items() if v not in (None, {}, [], 0)}
        rows.append(("resources", _esc(json.dumps(res, sort_keys=True))))
    parts.append(_kv_table(rows))
    error = record.get("error") or (step["status"].error if step["status"] else "")
    if error:
        parts.append(f'<pre class="error">{_esc(error)}</pre>')
    result = record.get("result")
    # the result's headline numbers; a copy of the config or package versions inside it stays in the JSON view
    shown = (
        {k: v for k, v in result.items() if k not in _NOT_HEADLINE} if isinstance(result, dict) else result
    )
    scalars = _flatten_scalars(shown) if shown is not None else []
    if scalars:
        body = "".join(f'<tr><td>{_esc(k)}</td><td class="num">{_fmt(v)}</td></tr>' for k, v in scalars[:40])
        more = (
            f'<p class="muted">… {len(scalars) - 40} more in the JSON below</p>' if len(scalars) > 40 else ""
        )
        parts.append(f"<h4>Result</h4><table>{body}</table>{more}")
    rows_m = _metrics_rows(storage, folder)
    if rows_m:
        last = {k: v for k, v in rows_m[-1].items() if isinstance(v, int | float | str)}
        parts.append(
            f'<h4>Metrics <span class="muted">({len(rows_m)} rows of metrics.jsonl; last row)</span></h4>'
        )
        parts.append(_kv_table((k, _fmt(v)) for k, v in sorted(last.items())))
        parts.append(_chart(rows_m))
    outputs = _list_outputs(folder)
    for fname, size, is_dir in outputs:
        if is_dir or not fname.lower().endswith(".png"):
            continue
        link = _href(f"{folder}/{fname}", out_dir)
        data = _read_bytes(folder, fname) if size is not None and size <= MAX_EMBED_BYTES else None
        if data is not None and data.startswith(b"\x89PNG"):
            src = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
            parts.append(f'<a href="{link}"><img class="plot" alt="{_esc(fname)}" src="{src}"></a>')
        else:
            parts.append(f'<p><a href="{link}">{_esc(fname)}</a> (not embedded)</p>')
    if outputs:
        items = "".join(
            f'<li><a href="{_href(f"{folder}/{n}", out_dir)}">{_esc(n)}{"/" if d else ""}</a>'
            f"{'' if s is None else f' <span class=muted>({s:,} bytes)</span>'}</li>"
            for n, s, d in outputs[:MAX_FILES_LISTED]
        )
        more = f"<li>… {len(outputs) - MAX_FILES_LISTED} more</li>" if len(outputs) > MAX_FILES_LISTED else ""
        parts.append(f"<details><summary>Files ({len(outputs)})</summary><ul>{items}{more}</ul></details>")
    if record.get("config") is not None:
        parts.append(f"<details><summary>Config</summary>{_pre_json(record['config'])}</details>")
    if result is not None:
        parts.append(f"<details><summary>Result (JSON)</summary>{_pre_json(result)}</details>")
    parts.append("</section>")
    return "\n".join(parts)


def _render_experiment(exp: dict[str, Any], keys: dict[str, str]) -> str:
    ok = exp.get("ok")
    badge = (
        '<span class="badge ok">ok</span>'
        if ok
        else '<span class="badge bad">failed</span>'
        if ok is False
        else '<span class="badge running">running</span>'
    )
    started, ended = exp.get("started"), exp.get("ended")
    env = exp.get("env") or {}
    git = env.get("git") or {}
    rows = [
        ("run", _esc(exp.get("run_id", "—"))),
        ("started", _esc(_when(started))),
        ("duration", _esc(_duration(ended - started) if isinstance(ended, int | float) and started else "—")),
        ("steps", _esc(exp.get("counts") or "—")),
        ("command", _esc(" ".join(map(str, exp.get("argv") or [])) or "—")),
        ("script", _esc(env.get("script") or "—")),
        ("host", _esc(f"{env.get('host', '?')}, Python {env.get('python', '?')}")),
    ]
    if git:
        rows.append(("code", _esc(f"{git.get('commit', '')[:12]}{' (dirty)' if git.get('dirty') else ''}")))
    step_rows = "".join(
        f'<tr><td><a href="#{_anchor(s.get("key", ""))}">{_esc(s.get("name"))}</a></td>'
        f'<td><span class="badge {_esc(s.get("state"))}">{_esc(s.get("state"))}</span></td>'
        f'<td class="num">{_esc(_duration(s.get("duration_s")))}</td><td>{_esc(s.get("error") or "")}</td></tr>'
        for s in exp.get("steps") or []
    )
    table = (
        (
            f"<table><tr><th>step</th><th>state in this run</th><th>duration</th><th>error</th></tr>{step_rows}"
            "</table>"
        )
        if step_rows
        else ""
    )
    return (
        f'<section class="card"><h3>{_esc(exp.get("experiment", "?"))} {badge}</h3>{_kv_table(rows)}{table}'
        "</section>"
    )


def render_report(prefix: str, *, out_dir: str | None = None) -> str:
    """The HTML page for `prefix`; links to outputs are relative to `out_dir` when given (and local)."""
    data = collect(prefix)
    steps, experiments = data["steps"], data["experiments"]
    keys = {s["record"].get("key", ""): s["record"].get("name", "") for s in steps}
    counts: dict[str, int] = {}
    for s in steps:
        counts[s["state"]] = counts.get(s["state"], 0) + 1
    summary = ", ".join(f"{n} {state.lower()}" for state, n in sorted(counts.items())) or "no steps"
    body = [
        f"<header><h1>Schooner report</h1><p>{_esc(data['prefix'])} · {len(experiments)} experiment run(s) · "
        f"{len(steps)} step(s): {_esc(summary)} · generated {_esc(_when(time.time()))}</p></header><main>",
        "<h2>Experiments</h2>",
        *(_render_experiment(e, keys) for e in experiments),
    ]
    if not experiments:
        body.append('<p class="muted">No experiment records under this prefix.</p>')
    body.append("<h2>Steps</h2>")
    if steps:
        index = "".join(
            f'<tr><td><a href="#{_anchor(s["record"].get("key", ""))}">{_esc(s["record"].get("name", s["folder"]))}</a></td>'
            f'<td><span class="badge {_esc(s["state"])}">{_esc(s["state"])}</span></td>'
            f'<td class="num">{_esc(_duration(s["record"].get("duration_s")))}</td></tr>'
            for s in steps
        )
        body.append(
            f'<section class="card"><table><tr><th>step</th><th>state</th><th>duration</th></tr>{index}'
            "</table></section>"
        )
        body.extend(_render_step(s, keys, out_dir) for s in steps)
    else:
        body.append('<p class="muted">No steps under this prefix.</p>')
    body.append("</main>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Schooner report: {_esc(data['prefix'])}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def write_report(prefix: str, out: str | None = None) -> str:
    """Write the report for `prefix` to `out` (default `{prefix}/report.html`); returns the path written."""
    prefix = normalize_prefix(prefix)
    out = out or f"{prefix}/report.html"
    if is_local(out):
        out = os.path.abspath(out)
        page = render_report(prefix, out_dir=os.path.dirname(out))
    else:
        page = render_report(prefix)
    storage = storage_for(out)
    storage.makedirs(os.path.dirname(out) if is_local(out) else out.rsplit("/", 1)[0])
    storage.write_text(out, page)
    return out
