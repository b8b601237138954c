"""Why a step reruns or is reused: its recorded config against today's, field by field.

`explain_step(step, prefix)` looks at the step's own output folder (done? running? failed?) and, when
the step would run, at the most recent earlier output of a step with the same name under the prefix:
the differences between that record and today's config, code version and inputs say exactly why the
key changed. An input whose key changed is explained in turn (down to the field that started it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from schooner.cluster.records import StepState, meta_path, read_step_record, step_status
from schooner.cluster.runner._lease import parse_lease
from schooner.cluster.runner._lower import Step
from schooner.cluster.runner._records import fn_source_hash, redact_config
from schooner.cluster.runner._step import join_path
from schooner.cluster.storage import storage_for

from ._scan import scan_prefix


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
        a, b = _text(self.old), _text(self.new)
        if len(a) <= 100 and len(b) <= 100:
            return f"{self.path}: {a} -> {b}"
        # Long values: show both from a little before their first difference (equal heads said nothing).
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        start = max(0, at - 30)
        return f"{self.path}: {_window(a, start)} -> {_window(b, start)}"


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


@dataclass(frozen=True)
class _FileState:
    """One file of an `InputFiles` as explain shows it: size and the start of its content hash."""

    size: int
    digest: str

    def __str__(self) -> str:
        return f"{self.size} bytes, {self.digest[:16]}"


def _text(v: Any) -> str:
    if isinstance(v, _FileState) or (isinstance(v, str) and v.startswith("<step ")):
        return str(v)
    return json.dumps(v, sort_keys=True, ensure_ascii=False) if v is not _ABSENT else "<absent>"


def _window(text: str, start: int, width: int = 100) -> str:
    """`width` characters of `text` from `start`, with '...' where it is cut."""
    head = "..." if start > 0 else ""
    body = text[start:]
    return head + (body if len(body) <= width - len(head) else body[: width - len(head) - 3] + "...")


def _short(v: Any) -> str:
    return _window(_text(v), 0)


def _ref_label(v: Any, names: dict[str, str]) -> str | None:
    """`<step 'name' 1a2b3c4d/sub>` for an input reference, else None."""
    if isinstance(v, dict) and "__step__" in v:
        key = v["__step__"]
        sub = f"/{v['__path__']}" if v.get("__path__") else ""
        return f"<step {names.get(key, '?')!r} {key[:8]}{sub}>"
    return None


def _pair_label(key: Any, names: dict[str, str]) -> str:
    """How a dict key is matched across versions: inputs by step name (their keys change), others by value."""
    if isinstance(key, dict) and "__step__" in key:
        sub = f"/{key['__path__']}" if key.get("__path__") else ""
        return f"<step {names.get(key['__step__'], key['__step__'][:8])!r}{sub}>"
    return json.dumps(key, sort_keys=True)


def diff_configs(
    old: Any, new: Any, path: str = "config", names: dict[str, str] | None = None
) -> list[FieldChange]:
    """Field-by-field differences between two canonical configs.

    Dicts compare by key, lists by index; dicts keyed by inputs (`{"__dict__": [[key, value], ...]}`) compare
    by the input's step name, so `{tokenized(...): 1.0}` lines up across versions even though the input's
    key (and with it the pair order) changed. `names` maps step keys to names for display.
    """
    names = names or {}
    if isinstance(old, dict) and isinstance(new, dict):
        if "__step__" in old or "__step__" in new:
            return [] if old == new else [FieldChange(path, old, new)]
        files_old, files_new = _files_view(old), _files_view(new)
        if files_old is not None and files_new is not None:
            return _diff_files(files_old, files_new, path)
        if "__dict__" in old and "__dict__" in new:
            return _diff_pairs(old["__dict__"], new["__dict__"], path, names)
        if "__tuple__" in old and "__tuple__" in new and old.get("__class__") == new.get("__class__"):
            return diff_configs(old["__tuple__"], new["__tuple__"], path, names)  # tuples read as lists
        changes = []
        for k in sorted(set(old) | set(new)):
            changes += diff_configs(old.get(k, _ABSENT), new.get(k, _ABSENT), f"{path}.{k}", names)
        return changes
    if isinstance(old, list) and isinstance(new, list):
        changes = []
        for i in range(max(len(old), len(new))):
            a = old[i] if i < len(old) else _ABSENT
            b = new[i] if i < len(new) else _ABSENT
            changes += diff_configs(a, b, f"{path}[{i}]", names)
        return changes
    return [] if old == new else [FieldChange(path, old, new)]


def _files_view(v: dict) -> dict | None:
    """The canonical form of an `InputFiles` (a dict with tag-shaped keys, so held as `__dict__` pairs) as a
    plain dict; None for anything else."""
    pairs = v.get("__dict__")
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        return None
    if not all(isinstance(k, str) for k, _ in pairs) or "__files__" not in {k for k, _ in pairs}:
        return None
    return dict(pairs)


def _diff_files(old: dict, new: dict, path: str) -> list[FieldChange]:
    """`InputFiles` by file name (by list index, one removed file read as every later file renamed)."""

    def by_name(entries: Any) -> dict[str, _FileState]:
        out: dict[str, _FileState] = {}
        for e in entries if isinstance(entries, list) else []:
            if isinstance(e, list) and len(e) == 3:
                name = str(e[0])
                while name in out:  # the same name under two patterns' roots
                    name += "'"
                out[name] = _FileState(int(e[1]), str(e[2]))
        return out

    olds, news = by_name(old.get("__files__")), by_name(new.get("__files__"))
    changes = [
        FieldChange(f"{path}: {n}", olds.get(n, _ABSENT), news.get(n, _ABSENT))
        for n in sorted(set(olds) | set(news))
        if olds.get(n) != news.get(n)
    ]
    rest_old = {k: v for k, v in old.items() if k != "__files__"}
    rest_new = {k: v for k, v in new.items() if k != "__files__"}
    return changes + diff_configs(rest_old, rest_new, path)


def _diff_pairs(old: list, new: list, path: str, names: dict[str, str]) -> list[FieldChange]:
    olds = {_pair_label(k, names): (k, v) for k, v in old}
    news = {_pair_label(k, names): (k, v) for k, v in new}
    changes = []
    for label in sorted(set(olds) | set(news)):
        sub = f"{path}[{label}]"
        if label not in olds or label not in news:
            changes.append(
                FieldChange(sub, olds.get(label, (None, _ABSENT))[1], news.get(label, (None, _ABSENT))[1])
            )
            continue
        (ok, ov), (nk, nv) = olds[label], news[label]
        changes += diff_configs(ok, nk, f"{sub}<key>", names)
        changes += diff_configs(ov, nv, sub, names)
    return changes


def find_records(prefix: str, name: str) -> list[dict[str, Any]]:
    """Records of every output folder of steps named `name` under `prefix`, newest first."""
    storage = storage_for(prefix)
    parent, stem = join_path(prefix, name).rsplit("/", 1)
    records = []
    for found in scan_prefix(parent) if storage.exists(parent) else []:
        folder = found.output_path
        tail = folder[len(parent) + 1 :]
        if not (tail.startswith(f"{stem}-") and len(tail) == len(stem) + 9):  # `{stem}-{key[:8]}`
            continue
        rec = read_step_record(folder, storage=storage)
        if rec is not None and rec.get("name") == name:
            rec["_folder"] = folder
            rec["_status"] = found.status.state.value if found.status is not None else None
            if found.status is not None and found.status.state is StepState.RUNNING:
                lease = parse_lease(storage.read_text(meta_path(folder, "lease.json")))
                if lease is None or lease.is_stale():  # its runner died (kill -9): as `schooner status` says
                    rec["_status"] = "INTERRUPTED"
            records.append(rec)
    records.sort(
        key=lambda r: (r.get("_status") == "SUCCESS", r.get("ended") or r.get("started") or 0), reverse=True
    )
    return records


def explain_step(
    step: Step,
    prefix: str,
    by_key: dict[str, Step] | None = None,
    depth: int = 4,
    _seen: set[str] | None = None,
) -> Explanation:
    """Why `step` would be reused or run under `prefix` (see the module docstring)."""
    by_key = by_key or {}
    seen = set() if _seen is None else _seen
    h = step.handle
    out = h.output_path(prefix)
    storage = storage_for(out)
    st = step_status(out, storage=storage)
    if st is not None and st.state is StepState.SUCCESS and st.key == h.key:
        reason = "its output folder is marked SUCCESS; same name, config, code version and inputs as recorded"
        rec = read_step_record(out, storage=storage) or {}
        then, now = rec.get("fn_source_sha256"), fn_source_hash(h.fn)
        if then and now and then != now:
            reason += (
                f"; NOTE: the source of {h.fn_name()} changed since it ran, but the step's `version` did "
                f"not ({h.version!r}): bump the version to rerun it with the new code"
            )
        return Explanation(h.name, h.key, out, "reused", reason)
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
    if "code" in rec and rec.get("code") != h.code:  # the function's code or a helper it calls was edited
        changes.append(FieldChange("code", rec.get("code"), h.code))
    names = {i["key"]: i.get("name", "?") for i in rec.get("inputs", [])}
    names.update({k: s.name for k, s in by_key.items()})
    changes += diff_configs(rec.get("config"), today, names=names)
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
        old_ref, new_ref = _ref_label(c.old, names), _ref_label(c.new, names)
        if new_ref is None and old_ref is None:
            explanation.changes.append(c)
            continue
        explanation.changes.append(FieldChange(c.path, old_ref or c.old, new_ref or c.new))
        dep = by_key.get(c.new["__step__"]) if new_ref else None
        if dep is not None and depth > 0:
            if dep.key in seen:
                explanation.inputs.append(Explanation(dep.name, dep.key, "", "will run", "explained above"))
            else:
                seen.add(dep.key)
                explanation.inputs.append(explain_step(dep, prefix, by_key, depth - 1, seen))
    if not explanation.changes:
        explanation.reason += "; no field differs: the record predates a change of the key format"
    return explanation


def _when(record: dict[str, Any]) -> str:
    t = record.get("started")
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if isinstance(t, int | float) else "?"


def explain_records(prefix: str, name: str) -> Explanation | None:
    """Without today's experiment: the difference between the two latest recorded versions of `name`."""
    records = find_records(prefix, name)
    if not records:
        return None
    # By when they ran, whatever their state: the newest (a failed or interrupted run, too) against the one
    # before it, old -> new (find_records puts SUCCESS first, for the output a new run is compared with).
    records.sort(key=lambda r: r.get("started") or r.get("ended") or 0, reverse=True)
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
    if "code" in prev and "code" in latest and prev["code"] != latest["code"]:
        changes.append(FieldChange("code", prev["code"], latest["code"]))
    names = {i["key"]: i.get("name", "?") for r in (prev, latest) for i in r.get("inputs", [])}
    for c in diff_configs(prev.get("config"), latest.get("config"), names=names):
        # an input by its step's name and key, as with the experiment file
        changes.append(
            FieldChange(c.path, _ref_label(c.old, names) or c.old, _ref_label(c.new, names) or c.new)
        )
    return Explanation(
        name,
        latest["key"],
        latest["_folder"],
        latest.get("_status") or "unknown",
        f"the latest recorded version (its run started {_when(latest)}); what changed since "
        f"{prev['key'][:8]} ({prev.get('_status') or 'no status'}, started {_when(prev)}) "
        "(pass the experiment file to compare with today's config)",
        compared_with=prev["_folder"],
        changes=changes,
    )
