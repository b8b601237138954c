"""Planning a run: which steps it picks, what their status files say, and why a reused step is noted.

`--only`/`--force` patterns pick steps by name (`picks`, `select`); statuses are read concurrently on object
stores (`read_statuses`); a cached step whose input was published again reruns (`input_replaced`), and one
reused although its latest forced rerun failed or its function's source changed gets a note
(`forced_rerun_failed`, `code_change`).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from schooner.cluster.records import StepState, read_step_record, step_status
from schooner.cluster.storage import is_plain_path

from ._lower import Step
from ._records import fn_source_hash
from ._version import ConfigError


def picks(pattern: re.Pattern[str], name: str, names: Collection[str]) -> bool:
    """`--only`/`--force` RE picks `name` of a run whose step names are `names`: RE that is the name of one of
    them picks that step alone (names may hold regex characters: `grid/lr+1e-3`, copied from the status
    table, would also match `grid/lrr1e-3`); any other RE picks the names the regex finds."""
    if pattern.pattern in names:
        return pattern.pattern == name
    return pattern.search(name) is not None


def select(steps: list[Step], only: list[re.Pattern[str]]) -> list[Step]:
    """The steps whose names match one of `only`, plus everything they need (keeping the order)."""
    by_key = {s.key: s for s in steps}
    step_names = {s.name for s in steps}
    for p in only:
        if not any(picks(p, s.name, step_names) for s in steps):
            listed = ", ".join(sorted(step_names)[:20])
            raise ConfigError(f"run_only/--only {p.pattern!r} matches no step; steps are: {listed}")
    keep: set[str] = set()
    stack = [s.key for s in steps if any(picks(p, s.name, step_names) for p in only)]
    while stack:
        k = stack.pop()
        if k not in keep:
            keep.add(k)
            stack.extend(by_key[k].deps)
    return [s for s in steps if s.key in keep]


STATUS_READERS = 32
"""Concurrent status reads when planning on an object store (one GET each; a local read needs no pool)."""


def read_statuses(paths: list[str]) -> list[Any]:
    """Every step's status file: in order locally, concurrently on object stores where each read is a
    request (1,000 steps: ~20 s one by one against a local S3 server)."""
    if all(is_plain_path(p) for p in paths) or len(paths) < 2:
        return [step_status(p) for p in paths]
    with ThreadPoolExecutor(max_workers=STATUS_READERS, thread_name_prefix="schooner-status") as pool:
        return list(pool.map(lambda p: step_status(p), paths))


def input_replaced(step: Step, out: str, status_of: dict[str, Any], by_key: dict[str, Step]) -> str:
    """A note when an input of a cached step was published again since the step ran (its record names the
    attempt of each input it read: the input's status owner then)."""
    if not step.deps:
        return ""
    record = read_step_record(out) or {}
    for inp in record.get("inputs") or []:
        used, now = inp.get("owner"), status_of.get(inp.get("key"))
        if used and now is not None and now.state is StepState.SUCCESS and now.owner != used:
            name = by_key[inp["key"]].name if inp["key"] in by_key else inp.get("name")
            return (
                f"reruns: its input {name!r} was replaced since it ran (published again by run "
                f"{now.owner.split('-')[0]}, e.g. --force; this step read run {used.split('-')[0]}'s output)"
            )
    return ""


def forced_rerun_failed(step: Step, out: str, st: Any) -> str:
    """A note when the latest forced rerun of a reused step failed (its published output is older)."""
    if st is None or st.state is not StepState.SUCCESS or not st.error:
        return ""
    return f"reused; {st.error}"


def code_change(step: Step, out: str, st: Any) -> str:
    """A note when a cached step's function source changed since it ran and its version did not."""
    now = fn_source_hash(step.handle.fn)
    then = st.fn_sha
    if not then:  # status files written before the hash was kept there: the record has it
        then = (read_step_record(out) or {}).get("fn_source_sha256")
    if not then or not now or then == now:
        return ""
    return (
        f"reused, but the source of {step.handle.fn_name()} changed since it ran and the step's version "
        f"did not ({step.handle.version!r}); bump the version (or --force) to rerun it with the new code"
    )
