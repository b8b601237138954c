"""The samples a step wrote, shown on its card: generations are results, read like its curves and scores.

A step records samples as `samples.json` (a JSON list of objects, as `schooner.eval`'s evaluate step writes its
prompts and completions) or `samples.jsonl` (one object per line), at the top of its output folder or one
folder down (`step-000100/samples.json`, one per evaluated checkpoint). Each object is a row; its fields with
text or numbers are the columns (other fields are named under the table, and stay in the file). A file that
is not a list of objects is named with what is wrong, never skipped silently.
"""

from __future__ import annotations

import json
from typing import Any

from schooner.cluster.storage import json_kind, read_json_lines, storage_for

from ._html import esc, fmt

SAMPLE_FILES = ("samples.json", "samples.jsonl")
MAX_SAMPLES = 20
"""Rows shown per samples file (the rest are counted)."""
MAX_SAMPLE_FILES = 6
"""Samples files shown per card (the newest subfolders' when a step wrote more)."""
MAX_SUBFOLDERS_LOOKED_IN = 40
"""Subfolders looked into for samples files at most (the last ones by name; one listing each on a store)."""
MAX_SAMPLE_BYTES = 4 * 1024 * 1024
"""Larger samples files are named, not read."""


def _rows(path: str) -> list[dict[str, Any]]:
    """The objects of a samples file (none when it is gone); ValueError naming the line or item that is not
    one (`storage.read_json_lines` names a `.jsonl` file's bad line as `path:line`)."""
    if path.endswith(".jsonl"):
        try:
            return [row for _n, row in read_json_lines(path)]
        except FileNotFoundError:
            return []
    try:
        rows = json.loads(storage_for(path).read_text(path) or "")
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(rows, list):
        raise ValueError(f"it holds {json_kind(rows)}, not an array of objects")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"item {i} is {json_kind(row)}, not an object")
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return '<span class="muted">—</span>'
    if isinstance(value, str):
        return f'<pre class="sample">{esc(value)}</pre>'
    return f'<span class="num">{fmt(value)}</span>'


def _table(rows: list[dict[str, Any]]) -> str:
    columns = list(
        dict.fromkeys(k for r in rows for k, v in r.items() if v is None or isinstance(v, str | int | float))
    )
    other = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in columns]
    head = "".join(f"<th>{esc(c)}</th>" for c in ["#", *columns])
    body = "".join(
        f'<tr><td class="num">{i}</td>' + "".join(f"<td>{_cell(r.get(c))}</td>" for c in columns) + "</tr>"
        for i, r in enumerate(rows[:MAX_SAMPLES])
    )
    notes = []
    if len(rows) > MAX_SAMPLES:
        notes.append(f"… {len(rows) - MAX_SAMPLES} more samples in the file")
    if other:
        notes.append("fields not shown (not text or numbers): " + ", ".join(other))
    tail = "".join(f'<p class="muted">{esc(n)}</p>' for n in notes)
    return f'<div class="wide"><table class="samples"><tr>{head}</tr>{body}</table></div>{tail}'


def _sample_files(folder: str, outputs: list[tuple[str, int | None, bool]]) -> list[tuple[str, int | None]]:
    """(path relative to `folder`, size) of the samples files at its top and one folder down."""
    found = [(n, s) for n, s, d in outputs if not d and n in SAMPLE_FILES]
    storage = storage_for(folder)
    subfolders = [n for n, _s, d in outputs if d][-MAX_SUBFOLDERS_LOOKED_IN:]
    for name in reversed(subfolders):  # newest subfolders (step-000300) first
        if len(found) < MAX_SAMPLE_FILES:
            for f in SAMPLE_FILES:
                path = f"{folder}/{name}/{f}"
                if storage.exists(path):
                    found.append((f"{name}/{f}", None))
    return found[:MAX_SAMPLE_FILES]


def samples_section(folder: str, outputs: list[tuple[str, int | None, bool]]) -> str:
    """The samples files of `folder` (`outputs`: its top-level entries), one table each."""
    parts = []
    for rel, size in _sample_files(folder, outputs):
        path = f"{folder}/{rel}"
        if size is not None and size > MAX_SAMPLE_BYTES:
            parts.append(f'<p class="muted">{esc(rel)}: {size:,} bytes, too large to show here</p>')
            continue
        try:
            rows = _rows(path)
        except (OSError, UnicodeDecodeError, ValueError) as err:
            parts.append(f'<p class="muted">{esc(rel)} is not a list of samples: {esc(err)}</p>')
            continue
        if rows:
            parts.append(
                f'<h4>Samples <span class="muted">({esc(rel)}, {len(rows)})</span></h4>{_table(rows)}'
            )
    return "".join(parts)
