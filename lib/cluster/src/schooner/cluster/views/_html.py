"""Small HTML pieces the report's sections share: escaping, times, badges, tables, links, errors."""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Iterable
from typing import Any

from schooner.cluster.runner._results import exception_reason
from schooner.cluster.storage import is_plain_path


def esc(value: Any) -> str:
    """`value` as text safe inside HTML and attribute values."""
    return html.escape(str(value), quote=True)


def when(t: Any) -> str:
    """A Unix time as `YYYY-MM-DD HH:MM:SS UTC`; '—' when unknown."""
    if not isinstance(t, int | float) or not t:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def duration(seconds: Any) -> str:
    """`12.3 s`, `4 min 5 s`, `2 h 3 min`; '—' when unknown."""
    if not isinstance(seconds, int | float):
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {seconds % 60:.0f} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def fmt(value: Any) -> str:
    """A table cell's text: floats to 6 significant digits, the rest as is (escaped)."""
    if isinstance(value, float):
        return f"{value:.6g}"
    return esc(value)


def badge(state: Any) -> str:
    """A coloured state label (the CSS class is the state)."""
    return f'<span class="badge {esc(state)}">{esc(state)}</span>'


def kv_table(rows: Iterable[tuple[str, str]]) -> str:
    """A two-column table; values are HTML already."""
    body = "".join(f"<tr><td>{esc(k)}</td><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def table(head: list[str], rows: Iterable[list[str]], cls: str = "") -> str:
    """A table with a header row; cells are HTML already. Wider than the page, it scrolls in its own box."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<div class="wide"><table class="{esc(cls)}"><tr>{th}</tr>{body}</table></div>'


def pre_json(value: Any) -> str:
    """`value` as indented JSON in a `<pre>`."""
    return f"<pre>{esc(json.dumps(value, indent=2, sort_keys=True, default=str))}</pre>"


def anchor(key: str) -> str:
    """The id of a step's card (from its key, so links between versions and inputs are stable)."""
    return f"step-{esc(key[:16])}"


def href(target: str, out_dir: str | None) -> str:
    """A link to `target` that works from the report's folder (relative when both are local)."""
    if is_plain_path(target) and out_dir is not None:
        return esc(os.path.relpath(target, out_dir).replace(os.sep, "/"))
    if is_plain_path(target):
        return esc("file://" + os.path.abspath(target))
    return esc(target)


def error_block(text: str) -> str:
    """An error: the exception with its whole message visible (`exception_reason`: a message's line naming
    the field at fault is often not its last), the whole traceback collapsed under it."""
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    reason = exception_reason(text)
    if len(lines) == 1 or reason == "\n".join(lines):
        return f'<pre class="error">{esc(chr(10).join(lines))}</pre>'
    return (
        f'<details class="error"><summary>{esc(reason)}</summary>'
        f'<pre class="error">{esc(chr(10).join(lines))}</pre></details>'
    )


def flatten_scalars(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """`(dotted.path, value)` of the numbers, booleans and short strings in nested dicts."""
    if isinstance(value, dict):
        out: list[tuple[str, Any]] = []
        for k, v in value.items():
            out += flatten_scalars(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(value, bool | int | float) or (isinstance(value, str) and len(value) <= 120):
        return [(prefix or "value", value)]
    return []
