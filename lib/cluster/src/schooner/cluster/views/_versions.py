"""Versions of a step: the output folders of steps with one name, and the config fields that tell them apart.

A step's name is stable while its key changes with its config, code version and inputs, so every output
folder of a name under a prefix is one version. The report lays them side by side and `schooner compare`
prints them; both take the config differences from `diff_configs` (the one used by `schooner explain`),
against the newest version.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from schooner.cluster.records import (
    StepState,
    StepStatus,
    meta_path,
    read_history,
    read_step_record,
    step_status,
)
from schooner.cluster.runner._lease import parse_lease
from schooner.cluster.storage import storage_for

from ._explain import FieldChange, _ref_label, _short, diff_configs
from ._scan import scan_prefix


@dataclass(frozen=True)
class Version:
    """One output folder of a step, as recorded by the runner."""

    folder: str
    record: dict[str, Any]
    """`.schooner/step.json` (empty when missing)."""
    status: StepStatus | None
    state: str
    """SUCCESS, FAILED, RUNNING, INTERRUPTED (a RUNNING status whose runner is gone) or UNKNOWN."""

    @property
    def name(self) -> str:
        if self.record.get("name"):
            return str(self.record["name"])
        return self.status.name if self.status else self.folder.rstrip("/").rsplit("/", 1)[-1]

    @property
    def key(self) -> str:
        return str(self.record.get("key") or (self.status.key if self.status else ""))

    @property
    def started(self) -> float:
        return float(self.record.get("started") or (self.status.time if self.status else 0.0))

    def history(self) -> list[dict[str, Any]]:
        """Every recorded attempt, oldest first (`.schooner/history.jsonl`)."""
        return read_history(self.folder)


def step_state(folder: str, status: StepStatus | None, record: dict[str, Any]) -> str:
    """The state a reader should see: the status file's, INTERRUPTED for RUNNING with a stale or no lease."""
    if status is None:
        return str(record.get("state") or "UNKNOWN")
    if status.state is StepState.RUNNING:
        lease = parse_lease(storage_for(folder).read_text(meta_path(folder, "lease.json")))
        if lease is None or lease.is_stale():
            return StepState.INTERRUPTED.value
    return status.state.value


def load_version(folder: str) -> Version | None:
    """The version recorded in `folder`; None when it holds neither a step record nor a status."""
    folder = folder.rstrip("/")
    storage = storage_for(folder)
    record = read_step_record(folder, storage=storage)
    status = step_status(folder, storage=storage)
    if record is None and status is None:
        return None
    return Version(folder, record or {}, status, step_state(folder, status, record or {}))


def by_name(versions: list[Version]) -> dict[str, list[Version]]:
    """Versions grouped by step name, each group oldest first."""
    groups: dict[str, list[Version]] = {}
    for v in sorted(versions, key=lambda v: (v.started, v.folder)):
        groups.setdefault(v.name, []).append(v)
    return groups


@dataclass(frozen=True)
class DiffRow:
    """One field that differs between versions, with each version's value (display text)."""

    field: str
    """The field's path, e.g. `optimizer.learning_rate` (`config.` dropped), or `version` for the code version."""
    values: list[str] = dataclasses.field(default_factory=list)  # `field` is a field's name here


def input_names(versions: list[Version]) -> dict[str, str]:
    """Step key -> step name of every input recorded by `versions` (to show input references by name)."""
    return {
        i["key"]: i.get("name", "?") for v in versions for i in v.record.get("inputs") or [] if "key" in i
    }


def _display(value: Any, names: dict[str, str]) -> str:
    return _ref_label(value, names) or _short(value)


def _changes(old: Version, new: Version, names: dict[str, str]) -> list[FieldChange]:
    """What differs from `old` to `new`: the code version, then the config field by field."""
    changes = []
    if old.record.get("version") != new.record.get("version"):
        changes.append(FieldChange("version", old.record.get("version"), new.record.get("version")))
    return changes + diff_configs(old.record.get("config"), new.record.get("config"), names=names)


def config_rows(versions: list[Version]) -> list[DiffRow]:
    """The fields on which any version differs from the newest (the last), each with every version's value.

    Every version is diffed against the newest; where a version does not differ on a field, it holds the
    newest one's value.
    """
    if not versions:
        return []
    newest, names = versions[-1], input_names(versions)
    diffs = [{c.path: c for c in _changes(v, newest, names)} for v in versions]
    paths = list(dict.fromkeys(p for d in diffs for p in d))
    rows = []
    for path in paths:
        newest_value = next(d[path].new for d in diffs if path in d)
        values = [_display(d[path].old if path in d else newest_value, names) for d in diffs]
        rows.append(DiffRow(path.removeprefix("config."), values))
    return rows


def short_labels(
    versions: list[Version], rows: list[DiffRow], *, fields: int = 2, width: int = 28
) -> list[str]:
    """A legend label per version: its key prefix and its values of the first differing fields."""
    labels = []
    for i, v in enumerate(versions):
        bits = []
        for row in rows[:fields]:
            value = row.values[i]
            value = value if len(value) <= width else value[: width - 1] + "…"
            bits.append(f"{row.field.rsplit('.', 1)[-1]}={value}")
        more = " …" if len(rows) > fields else ""
        labels.append(f"{v.key[:8]} ({', '.join(bits)}{more})" if bits else v.key[:8])
    return labels


def known_names(prefix: str) -> list[str]:
    """The names of the steps recorded under `prefix` (for error messages)."""
    if not storage_for(prefix).exists(prefix):
        return []
    versions = [load_version(f.output_path) for f in scan_prefix(prefix)]
    return sorted({v.name for v in versions if v is not None})
