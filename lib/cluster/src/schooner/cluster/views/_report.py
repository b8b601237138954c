"""`schooner report`: one static, self-contained HTML page describing everything under a prefix.

It reads only what the step runner writes — experiment records (`{prefix}/experiments/**/*.json`, one per
run, failed and interrupted ones included), each step's record, status and attempt history
(`{output}/.schooner/`) — plus, from each step's output folder, its top-level files, its PNGs (embedded
as data URIs, so the page is one file), its samples and its `metrics.jsonl` (every numeric series charted as
inline SVG). Nothing in it knows what a step does. Steps with several versions (output folders of one name) are
also shown side by side, with their config differences and overlaid metrics; runs named on the command line
(`schooner report A B`) are overlaid on one chart per metric, with a sortable table of their hyperparameters
and results. Results come first (runs, versions, then each step's card with its results on top), the
bookkeeping (each experiment run's command, host and steps) last. A series has one colour in every chart.
No network: inline CSS, and only the runs table's sorting is a few lines of inline JavaScript, so the page
opens from disk, from an object store, or as an e-mail attachment.
"""

from __future__ import annotations

import os
import time
from typing import Any

from schooner.cluster.records import read_experiment_records
from schooner.cluster.storage import atomic_write, is_plain_path, normalize_prefix, storage_for

from ._html import anchor, badge, duration, error_block, esc, kv_table, table, when
from ._refs import resolve_versions
from ._report_runs import SORT_SCRIPT, render_runs
from ._report_step import render_step
from ._report_versions import render_versions
from ._scan import scan_prefix
from ._svg import Colours
from ._versions import Version, by_name, load_version

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#1d2433;background:#f6f7f9}
header{background:#12324a;color:#fff;padding:18px 28px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;opacity:.85}main{padding:18px 28px;max-width:1240px}
section.card{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:14px 18px;margin:14px 0}
h2{font-size:18px;margin:22px 0 6px}h3{font-size:16px;margin:0 0 6px}h4{margin:12px 0 4px}
table{border-collapse:collapse;width:100%;margin:6px 0}th,td{border-bottom:1px solid #eceff3;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f0f2f5;font-weight:600}
td.num,.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f4f6f8;border-radius:6px;padding:8px 10px;overflow:auto;max-height:420px;font-size:12px;margin:4px 0}
pre.error{background:#fdecec;color:#8a1f1f}details.error summary{color:#8a1f1f;font-family:monospace}
td pre,td summary,summary{white-space:pre-wrap;overflow-wrap:anywhere}td code{overflow-wrap:anywhere}
pre.sample{margin:0;max-height:240px}.wall-clock{color:#4b5563;font-size:13px}
table.sortable th{cursor:pointer;user-select:none}table.sortable th[aria-sort=ascending]::after{content:" \\25B2"}
table.sortable th[aria-sort=descending]::after{content:" \\25BC"}.wide{overflow-x:auto}
.badge{display:inline-block;border-radius:10px;padding:1px 9px;font-size:12px;font-weight:600;color:#fff}
.SUCCESS,.succeeded,.cached,.ok{background:#2e7d32}.FAILED,.failed,.bad{background:#c62828}
.RUNNING,.running{background:#1565c0}.skipped,.UNKNOWN,.will_run,.unfinished{background:#757575}
.INTERRUPTED,.interrupted{background:#ef6c00}.LOST{background:#6d4c41}
.muted{color:#6b7280}.kv td:first-child{width:190px;color:#4b5563}
img.plot{max-width:100%;border:1px solid #eceff3;border-radius:4px;margin:4px 8px 4px 0}
details summary{cursor:pointer;color:#12324a;margin:4px 0}svg.chart{background:#fff}
.charts{display:flex;flex-wrap:wrap;gap:6px 18px}figure.chart{margin:6px 0}
figure.chart figcaption{font-weight:600;font-size:13px}
ul.legend{list-style:none;padding:0;margin:2px 0 0;font-size:12px;max-width:540px}
ul.legend li{display:inline-block;margin-right:14px}
.swatch{display:inline-block;width:12px;height:3px;vertical-align:middle;margin-right:5px}
code{font-size:12px}a{color:#1a5e9a}
"""


def collect(prefix: str) -> dict[str, Any]:
    """What the report shows: `{"prefix", "experiments": [records, newest first], "steps": [Version, ...]}`.

    Step folders are those under the prefix plus any the experiment records name elsewhere
    (`override_output_path`); steps are ordered by start time.
    """
    prefix = normalize_prefix(prefix)
    storage = storage_for(prefix)
    experiments = [{**record, "_path": path} for path, record in read_experiment_records(prefix)]
    folders = [f.output_path for f in scan_prefix(prefix)] if storage.exists(prefix) else []
    for exp in experiments:
        for s in exp.get("steps") or []:
            out = s.get("output_path")
            if isinstance(out, str):
                folders.append(out)
    steps = [v for v in map(load_version, dict.fromkeys(folders)) if v is not None]
    steps.sort(key=lambda v: (v.started, v.folder))
    return {"prefix": prefix, "experiments": experiments, "steps": steps}


def outcome(exp: dict[str, Any]) -> str:
    """How an experiment run ended: succeeded, failed, interrupted, or unfinished (running, or its driver
    died before writing an end)."""
    if exp.get("ok") is True:
        return "succeeded"
    if exp.get("interrupted"):
        return "interrupted"
    if exp.get("ok") is False:
        return "failed"
    return "unfinished"


def _run_duration(exp: dict[str, Any]) -> str:
    started, ended = exp.get("started"), exp.get("ended")
    return duration(ended - started) if isinstance(ended, int | float) and started else "—"


def _experiments_table(experiments: list[dict[str, Any]]) -> str:
    """One row per run of every experiment, newest first, linked to the run's card."""
    rows = [
        [f'<a href="#run-{esc(e.get("run_id", ""))}">{esc(e.get("experiment", "?"))}</a>',
         badge(outcome(e)), esc(when(e.get("started"))), esc(_run_duration(e)), esc(e.get("counts") or "—"),
         esc(e.get("run_id", "—"))]
        for e in experiments
    ]  # fmt: skip
    return table(["experiment", "outcome", "started", "took", "steps", "run"], rows, cls="experiments")


def _render_experiment(exp: dict[str, Any]) -> str:
    env = exp.get("env") or {}
    rows = [
        ("run", esc(exp.get("run_id", "—"))),
        ("started", esc(when(exp.get("started")))),
        ("duration", esc(_run_duration(exp))),
        ("steps", esc(exp.get("counts") or "—")),
        ("command", esc(" ".join(map(str, exp.get("argv") or [])) or "—")),
        ("script", esc(env.get("script") or "—")),
        ("host", esc(f"{env.get('host', '?')}, Python {env.get('python', '?')}")),
    ]
    git = env.get("git") or {}
    if git:
        rows.append(("code", esc(f"{git.get('commit', '')[:12]}{' (dirty)' if git.get('dirty') else ''}")))
    steps = [
        [f'<a href="#{anchor(s.get("key", ""))}">{esc(s.get("name"))}</a>', badge(s.get("state")),
         esc(duration(s.get("duration_s"))), error_block(s.get("error") or "")]
        for s in exp.get("steps") or []
    ]  # fmt: skip
    step_table = table(["step", "state in this run", "duration", "error"], steps) if steps else ""
    return (
        f'<section class="card run" id="run-{esc(exp.get("run_id", ""))}">'
        f"<h3>{esc(exp.get('experiment', '?'))} {badge(outcome(exp))}</h3>{kv_table(rows)}{step_table}</section>"
    )


def _steps_index(steps: list[Version]) -> str:
    rows = [
        [f'<a href="#{anchor(v.key)}">{esc(v.name)}</a>', f'<span class="muted">{esc(v.key[:8])}</span>',
         badge(v.state), esc(when(v.record.get("started"))), esc(duration(v.record.get("duration_s")))]
        for v in steps
    ]  # fmt: skip
    return f'<section class="card">{table(["step", "key", "state", "started", "duration"], rows)}</section>'


def _page(title: str, body: list[str], *, script: bool) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(body)
        + (SORT_SCRIPT if script else "")
        + "\n</body></html>\n"
    )


def _runs(prefix: str, runs: list[str]) -> list[Version]:
    return resolve_versions(prefix, runs)


def render_runs_page(prefix: str, runs: list[str]) -> str:
    """A page of only the runs `runs` names (as `schooner compare` resolves them): overlaid metrics and the
    sortable table (`schooner compare A B --html OUT`)."""
    prefix = normalize_prefix(prefix)
    versions = _runs(prefix, runs)
    body = [
        f"<header><h1>Schooner runs compared</h1><p>{esc(prefix)} · {len(versions)} runs · generated "
        f"{esc(when(time.time()))}</p></header><main>",
        render_runs(versions, Colours()),
        "</main>",
    ]
    return _page(f"Schooner runs: {prefix}", body, script=True)


def render_report(prefix: str, *, out_dir: str | None = None, runs: list[str] | None = None) -> str:
    """The HTML page for `prefix`; links to outputs are relative to `out_dir` when given (and local).

    `runs`: steps to overlay at the top of the page (folders, `name@key` or names, as `schooner compare`
    takes them), with a sortable table of their hyperparameters and results.

    Raises:
        ConfigError: a run names no step (the message lists the steps under the prefix).
    """
    chosen = _runs(normalize_prefix(prefix), runs) if runs else []
    data = collect(prefix)
    steps, experiments = data["steps"], data["experiments"]
    names = {v.key: v.name for v in steps}
    colours = Colours()
    counts: dict[str, int] = {}
    for v in steps:
        counts[v.state] = counts.get(v.state, 0) + 1
    summary = ", ".join(f"{n} {state.lower()}" for state, n in sorted(counts.items())) or "no steps"
    body = [
        f"<header><h1>Schooner report</h1><p>{esc(data['prefix'])} · "
        f'<a href="#experiments" style="color:#fff">{len(experiments)} experiment run(s)</a> · '
        f"{len(steps)} step(s): {esc(summary)} · generated {esc(when(time.time()))}</p></header><main>",
    ]
    if chosen:
        body += ["<h2>Runs compared</h2>", render_runs(chosen, colours)]
    versioned = {name: vs for name, vs in by_name(steps).items() if len(vs) > 1}
    if versioned:
        body.append("<h2>Versions compared</h2>")
        body.extend(render_versions(name, vs, colours) for name, vs in versioned.items())
    body.append("<h2>Steps</h2>")
    if steps:
        body.append(_steps_index(steps))
        body.extend(render_step(v, names, out_dir, colours) for v in steps)
    else:
        body.append('<p class="muted">No steps under this prefix.</p>')
    body.append("<h2>Experiment runs</h2>")
    if experiments:
        body.append(f'<section class="card" id="experiments">{_experiments_table(experiments)}</section>')
        body.extend(_render_experiment(e) for e in experiments)
    else:
        body.append('<p class="muted">No experiment records under this prefix.</p>')
    body.append("</main>")
    return _page(f"Schooner report: {data['prefix']}", body, script=bool(chosen))


def write_report(prefix: str, out: str | None = None, *, runs: list[str] | None = None) -> str:
    """Write the report for `prefix` to `out` (default `{prefix}/report.html`); returns the path written.

    `runs`: steps overlaid at the top, with a sortable table of their hyperparameters and results
    (`render_report`)."""
    prefix = normalize_prefix(prefix)
    out = out or f"{prefix}/report.html"
    if is_plain_path(out):
        out = os.path.abspath(out)
        page = render_report(prefix, out_dir=os.path.dirname(out), runs=runs)
    else:
        page = render_report(prefix, runs=runs)
    storage = storage_for(out)
    storage.makedirs(os.path.dirname(out) if is_plain_path(out) else out.rsplit("/", 1)[0])
    storage.write_text(out, page)
    return out


def write_runs_page(prefix: str, refs: list[str], out: str) -> str:
    """Write the page of the runs `refs` names (overlaid metrics, sortable table) to `out`; its path."""
    out = out if "://" in out else os.path.abspath(out)
    atomic_write(out, render_runs_page(prefix, refs).encode("utf-8"))
    return out
