"""Why a step reruns or is reused: its recorded config against today's, field by field.

`explain_step(step, prefix)` looks at the step's own output folder (done? running? failed?) and, when
the step would run, at the most recent earlier output of a step with the same name under the prefix:
the differences between that record and today's config, code version and inputs say exactly why the
key changed. An input whose key changed is explained in turn (down to the field that started it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ._lease import parse_lease
from ._records import read_step_record, redact_config
from ._status import StepState, meta_path, read_status
from ._step import Step, join_path
from ._storage import is_local, storage_for


@dataclass(frozen=True)
class FieldChange:
    """One difference between a recorded config and today's."""

    path: str
    old: Any
    new: Any

    def describe(self) -> str:
        if self.old is _ABSENT:
            return f"{self.path}: added ({_short(self.new)})"
        if self.new is _ABSENT:
            return f"{self.path}: removed (was {_short(self.old)})"
        return f"{self.path}: {_short(self.old)} -> {_short(self.new)}"


@dataclass
class Explanation:
    """What `explain_step` found for one step."""

    name: str
    key: str
    output_path: str
    verdict: str
    """'reused', 'will run', 'running' or 'will resume'."""
    reason: str
    compared_with: str | None = None
    """The output folder of the earlier record the diff is against."""
    changes: list[FieldChange] = field(default_factory=list)
    inputs: list[Explanation] = field(default_factory=list)
    """Explanations of the inputs whose keys changed."""

    def lines(self, indent: str = "") -> list[str]:
        out = [f"{indent}{self.name} [{self.key[:8]}]: {self.verdict}: {self.reason}"]
        if self.compared_with:
            out.append(f"{indent}  compared with {self.compared_with}")
        out += [f"{indent}  - {c.describe()}" for c in self.changes]
        for sub in self.inputs:
            out += sub.lines(indent + "    ")
        return out


_ABSENT: Any = type("_Absent", (), {"__repr__": lambda self: "<absent>"})()


def _short(v: Any) -> str:
    text = json.dumps(v, sort_keys=True) if v is not _ABSENT else "<absent>"
    return text if len(text) <= 100 else text[:97] + "..."


def diff_configs(old: Any, new: Any, path: str = "config") -> list[FieldChange]:
    """Field-by-field differences between two canonical configs (dict keys sorted, lists by index)."""
    if isinstance(old, dict) and isinstance(new, dict):
        if "__step__" in old and "__step__" in new:
            if old != new:
                return [FieldChange(path, old, new)]
            return []
        changes = []
        for k in sorted(set(old) | set(new)):
            sub = path if k == "__dict__" else f"{path}.{k}"
            changes += diff_configs(old.get(k, _ABSENT), new.get(k, _ABSENT), sub)
        return changes
    if isinstance(old, list) and isinstance(new, list):
        changes = []
        for i in range(max(len(old), len(new))):
            changes += diff_configs(
                old[i] if i < len(old) else _ABSENT, new[i] if i < len(new) else _ABSENT, f"{path}[{i}]"
            )
        return changes
    return [] if old == new else [FieldChange(path, old, new)]


def find_records(prefix: str, name: str) -> list[dict[str, Any]]:
    """Records of every output folder of steps named `name` under `prefix`, newest first."""
    storage = storage_for(prefix)
    base = join_path(prefix, name)
    parent, stem = base.rsplit("/", 1)
    pattern = f"{parent}/{stem}-*"
    if is_local(prefix):
        import glob

        folders = [p for p in glob.glob(glob.escape(parent) + f"/{glob.escape(stem)}-*") if p[-9:-8] == "-"]
    else:
        folders = [p.rsplit("/", 2)[0] for p in storage.glob(f"{pattern}/.schooner/step.json")]
    records = []
    for folder in folders:
        rec = read_step_record(storage, folder)
        if rec is not None and rec.get("name") == name:
            rec["_folder"] = folder
            st = read_status(storage, folder)
            rec["_status"] = st.state.value if st is not None else None
            records.append(rec)
    records.sort(
        key=lambda r: (r.get("_status") == "SUCCESS", r.get("ended") or r.get("started") or 0), reverse=True
    )
    return records


def explain_step(
    step: Step, prefix: str, by_key: dict[str, Step] | None = None, depth: int = 3
) -> Explanation:
    """Why `step` would be reused or run under `prefix` (see the module docstring)."""
    by_key = by_key or {}
    h = step.handle
    out = h.output_path(prefix)
    storage = storage_for(out)
    st = read_status(storage, out)
    if st is not None and st.state is StepState.SUCCESS and st.key == h.key:
        return Explanation(
            h.name,
            h.key,
            out,
            "reused",
            "its output folder is marked SUCCESS; same name, config, code version and inputs as recorded",
        )
    if st is not None and st.state is StepState.RUNNING:
        lease = parse_lease(storage.read_text(meta_path(out, "lease.json")))
        if lease is not None and not lease.is_stale():
            return Explanation(h.name, h.key, out, "running", f"in progress: {lease.describe()}")
        return Explanation(
            h.name,
            h.key,
            out,
            "will resume",
            "an earlier run died while running it (stale or "
            "no lease); the next run takes it over and runs it again in the same folder",
        )
    if st is not None and st.state is StepState.FAILED:
        return Explanation(h.name, h.key, out, "will run", f"it failed last time: {st.error}")
    today = redact_config(h.canonical_config)
    earlier = [r for r in find_records(prefix, h.name) if r.get("key") != h.key]
    if not earlier:
        return Explanation(
            h.name,
            h.key,
            out,
            "will run",
            f"no output of a step named {h.name!r} exists "
            "under this prefix yet (first run, a new name, or another prefix)",
        )
    rec = earlier[0]
    changes = []
    if rec.get("version") != h.version:
        changes.append(FieldChange("version", rec.get("version"), h.version))
    changes += diff_configs(rec.get("config"), today)
    explanation = Explanation(
        h.name,
        h.key,
        out,
        "will run",
        "its key differs from the latest earlier output "
        f"({rec.get('key', '')[:8]}, {rec.get('_status') or 'no status'})",
        compared_with=rec["_folder"],
    )
    for c in changes:
        if isinstance(c.new, dict) and "__step__" in c.new:
            dep = by_key.get(c.new["__step__"])
            name = dep.name if dep else "?"
            c_new = FieldChange(
                c.path,
                f"input {name!r} key {str((c.old or {}).get('__step__', ''))[:8]}",
                f"{c.new['__step__'][:8]}",
            )
            explanation.changes.append(c_new)
            if dep is not None and depth > 0:
                explanation.inputs.append(explain_step(dep, prefix, by_key, depth - 1))
        else:
            explanation.changes.append(c)
    if not explanation.changes:
        hidden = any(v == "***" for v in _leaves(today))
        explanation.reason += (
            "; no visible field differs, so a redacted (secret-named) field changed"
            if hidden
            else "; no field differs: the record predates a change of the key format"
        )
    return explanation


def _leaves(v: Any) -> list[Any]:
    if isinstance(v, dict):
        return [x for y in v.values() for x in _leaves(y)]
    if isinstance(v, list):
        return [x for y in v for x in _leaves(y)]
    return [v]


def explain_records(prefix: str, name: str) -> Explanation | None:
    """Without today's experiment: the difference between the two latest recorded versions of `name`."""
    records = find_records(prefix, name)
    if not records:
        return None
    latest = records[0]
    if len(records) == 1:
        return Explanation(
            name,
            latest["key"],
            latest["_folder"],
            latest.get("_status") or "unknown",
            "the only recorded version of this step; pass the experiment file to compare with today's config",
        )
    prev = records[1]
    changes = []
    if prev.get("version") != latest.get("version"):
        changes.append(FieldChange("version", prev.get("version"), latest.get("version")))
    changes += diff_configs(prev.get("config"), latest.get("config"))
    return Explanation(
        name,
        latest["key"],
        latest["_folder"],
        latest.get("_status") or "unknown",
        f"latest recorded version; differs from {prev['key'][:8]} as follows "
        "(pass the experiment file to compare with today's config)",
        compared_with=prev["_folder"],
        changes=changes,
    )
