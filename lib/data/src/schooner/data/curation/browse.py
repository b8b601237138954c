"""A static HTML page of a record folder: its manifest, counters, the bad input skipped by reason, sample
records (drawn from every shard, the same each time) with their metadata and attributes, and, for a folder
written by `consolidate`, samples of the dropped records by reason, so a filter can be looked at before it
is trusted. No scripts, no network: open it in any browser. The page is written outside the folder
(`browse-<folder name>.html` in the working directory), so looking at a step's output does not change it.

    schooner browse PATH [--out FILE] [--sample N]      (or: python -m schooner.data.curation.browse PATH)
"""

from __future__ import annotations

import argparse
import html
import itertools
import json
import math
import random
import re
import sys
from collections.abc import Sequence
from typing import Any

from schooner.data import storage
from schooner.data._folders import list_shards
from schooner.data._readers import read_records
from schooner.data._writer import read_manifest

_CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{margin-top:1.6em;border-bottom:1px solid #ccc}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ddd;padding:2px 8px;text-align:left;vertical-align:top}th{background:#f4f4f4}
section.record{border:1px solid #ddd;border-radius:4px;padding:.5em 1em;margin:1em 0}
pre{white-space:pre-wrap;background:#fafafa;padding:.5em;max-height:24em;overflow:auto}
.reason{color:#a00;font-weight:bold}.muted{color:#777}"""


def _e(x: Any) -> str:
    return html.escape(x if isinstance(x, str) else json.dumps(x, ensure_ascii=False, default=str))


def _table(rows: Sequence[tuple[Any, Any]], head: tuple[str, str] = ("name", "value")) -> str:
    body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
    return f"<table><tr><th>{head[0]}</th><th>{head[1]}</th></tr>{body}</table>"


def _samples(folder: str, n: int, *, scan: int = 1000, seed: int = 0) -> list[dict]:
    """About `n` records drawn from every shard of `folder` (from `n` shards spread over them when there are
    more): from each, its first record and a seeded sample of its first `scan` records, in their order (the
    same each time)."""
    shards = list_shards(folder)
    if not shards or n <= 0:
        return []
    if len(shards) > n:
        shards = [shards[i * len(shards) // n] for i in range(n)]
    per = math.ceil(n / len(shards))
    out: list[dict] = []
    for i, shard in enumerate(shards):
        head = list(itertools.islice(read_records(shard), scan))
        rest = random.Random(seed * 1_000_003 + i).sample(
            range(1, len(head)), max(0, min(per, len(head)) - 1)
        )
        picked = sorted([0, *rest]) if head else []  # each shard's first record, then a seeded sample
        out.extend(head[j] for j in picked)
    return out[:n]


def _first(folder: str, n: int) -> list[dict]:
    out: list[dict] = []
    for shard in list_shards(folder):
        for rec in read_records(shard):
            out.append(rec)
            if len(out) >= n:
                return out
    return out


def _record_html(rec: dict, max_chars: int) -> str:
    meta = dict(rec.get("metadata") or {})
    attrs = meta.pop("attributes", None)
    reason = meta.pop("drop_reason", None)
    text = rec.get("text", "")
    parts = [f"<section class='record'><h3>{_e(rec.get('id'))} <span class='muted'>({_e(rec.get('source'))}, "
             f"{len(text):,} characters)</span></h3>"]  # fmt: skip
    if reason:
        parts.append(f"<p>dropped by <span class='reason'>{_e(reason)}</span></p>")
    if meta:
        parts.append("<h4>metadata</h4>" + _table(sorted(meta.items())))
    if attrs:
        parts.append("<h4>attributes</h4>" + _table(sorted(attrs.items()), ("attribute", "value")))
    more = f"\n… ({len(text) - max_chars:,} more characters)" if len(text) > max_chars else ""
    parts.append(f"<pre>{_e(text[:max_chars] + more)}</pre></section>")
    return "".join(parts)


def render_browse(path: str, *, sample: int = 25, max_chars: int = 3000) -> str:
    """The page for record folder (or file / glob) `path`."""
    manifest = read_manifest(path) if storage.isdir(path) else None
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(path)}</title><style>{_CSS}</style>"
           f"</head><body><h1>{_e(path)}</h1>"]  # fmt: skip
    if manifest:
        out.append(_table([("records", f"{manifest['records']:,}"), ("shards", manifest["num_shards"]),
                           ("bytes", f"{manifest['bytes']:,}"), ("format", manifest["format"]),
                           ("skipped bad input", manifest["errors"]["skipped"])]))  # fmt: skip
        counters = manifest.get("counters", {})
        dropped = sorted(
            (k.removeprefix("dropped."), v) for k, v in counters.items() if k.startswith("dropped.")
        )
        if dropped:
            out.append("<h2>Dropped, by reason</h2>" + _table(dropped, ("reason", "records")))
        if counters:
            out.append("<h2>Counters</h2>" + _table(sorted(counters.items()), ("counter", "count")))
        reasons = manifest["errors"].get("reasons", {})
        if reasons:
            rows = [(k, len(v)) for k, v in sorted(reasons.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
            out.append("<h2>Skipped bad input, by reason</h2>" + _table(rows, ("reason", "skipped")))
        if manifest["errors"]["examples"]:
            out.append(
                "<h2>Bad input</h2><ul>"
                + "".join(f"<li>{_e(x)}</li>" for x in manifest["errors"]["examples"])
                + "</ul>"
            )
    recs = _samples(path, sample)
    out.append(f"<h2>Sample records ({len(recs)})</h2>" + "".join(_record_html(r, max_chars) for r in recs))
    dropped_dir = storage.join(path, "dropped")
    if manifest and storage.isdir(dropped_dir) and read_manifest(dropped_dir):
        by_reason: dict[str, list[dict]] = {}
        for rec in _first(dropped_dir, 10_000):
            by_reason.setdefault(rec["metadata"].get("drop_reason", "?"), []).append(rec)
        out.append("<h2>Dropped records (samples)</h2>")
        for reason, rs in sorted(by_reason.items()):
            out.append(f"<h3 class='reason'>{_e(reason)} ({len(rs)} shown)</h3>")
            out.extend(_record_html(r, max_chars) for r in rs[:sample])
    out.append("</body></html>")
    return "".join(out)


def default_page(path: str) -> str:
    """Where `write_browse` writes the page of `path` by default: `browse-<its name>.html` in the working
    directory (never inside the folder: a step's output is not changed by looking at it)."""
    name = re.sub(r"[^\w.-]+", "_", path.rstrip("/").rsplit("/", 1)[-1]).strip("._") or "records"
    return f"browse-{name}.html"


def write_browse(path: str, out: str | None = None, *, sample: int = 25) -> str:
    """Write the page to `out` (default `default_page(path)`: `browse-<folder name>.html` in the working
    directory); returns where."""
    target = out or default_page(path)
    storage.write_bytes(target, render_browse(path, sample=sample).encode("utf-8"))
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """`schooner browse PATH [--out FILE] [--sample N]`."""
    p = argparse.ArgumentParser(prog="schooner browse", description="a static HTML page of a record folder")
    p.add_argument("path")
    p.add_argument("--out", default=None)
    p.add_argument("--sample", type=int, default=25)
    ns = p.parse_args(argv)
    print(f"page written to {write_browse(ns.path, ns.out, sample=ns.sample)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
