"""`schooner status`: one row per step output folder under a prefix, with the state a reader should see."""

from __future__ import annotations

import re
from typing import Any

from schooner.cluster.records import StepState, meta_path, read_step_record
from schooner.cluster.runner._lease import parse_lease
from schooner.cluster.runner._progress import fmt_age, fmt_duration
from schooner.cluster.runner._version import ConfigError
from schooner.cluster.storage import storage_for

from ._scan import scan_prefix


def status_rows(prefix: str, name: str | None = None) -> list[dict[str, Any]]:
    """`{"name", "key", "state", "time", "duration_s", "output_path"}` for every step folder under `prefix`
    (sorted by path). A RUNNING step whose lease is free or stale is INTERRUPTED (its runner was killed);
    a folder without a readable status is UNKNOWN.

    Args:
        name: only steps whose name matches this regex; a step's exact name is that step alone (names may
            hold regex characters: `grid/lr+1e-3`).

    Raises:
        ConfigError: `name` is not a valid regular expression.
    """
    try:
        pattern = re.compile(name) if name else None
    except re.error as e:
        raise ConfigError(f"--name {name!r} is not a valid regular expression: {e}") from None
    listed = []
    for found in scan_prefix(prefix):
        st = found.status
        record = read_step_record(found.output_path) or {}
        step_name = (st.name if st else "") or record.get("name") or found.output_path.rsplit("/", 1)[-1]
        listed.append((found.output_path, st, record, step_name))
    exact = pattern is not None and any(n == name for *_, n in listed)
    rows = []
    for out, st, record, step_name in listed:
        if pattern and (step_name != name if exact else not pattern.search(step_name)):
            continue
        state = st.state.value if st else "UNKNOWN"
        if st is not None and st.state is StepState.RUNNING:
            lease = parse_lease(storage_for(out).read_text(meta_path(out, "lease.json")))
            if lease is None or lease.is_stale():
                state = "INTERRUPTED"
        rows.append(
            {
                "name": step_name,
                "key": st.key if st else record.get("key"),
                "state": state,
                "time": st.time if st else None,
                "duration_s": record.get("duration_s"),
                "output_path": out,
            }
        )
    return rows


_STYLE = {"SUCCESS": "green", "FAILED": "red", "RUNNING": "cyan"}


def print_status(rows: list[dict[str, Any]], prefix: str, console: Any) -> None:
    """The rows as a table on a rich console, and a count per state under it."""
    from rich.table import Table

    table = Table(title=f"steps under {prefix}", title_justify="left")
    for col in ("step", "key", "state", "age", "took", "output"):
        table.add_column(col, overflow="fold" if col == "output" else "ellipsis")
    counts: dict[str, int] = {}
    for r in rows:
        state = r["state"]
        counts[state] = counts.get(state, 0) + 1
        table.add_row(
            r["name"],
            (r["key"] or "")[:8],
            f"[{_STYLE.get(state, 'yellow')}]{state}[/]",
            fmt_age(r["time"]),
            fmt_duration(r["duration_s"]),
            r["output_path"],
        )
    console.print(table)
    console.print(", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) or "no steps found")
