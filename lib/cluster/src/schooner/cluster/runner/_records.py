"""Step and experiment records: JSON provenance of what ran, where, from which code, with which result.

`{output}/.schooner/step.json` describes one step attempt; `{prefix}/experiments/{script}-{key}.json`
one run of an experiment. Records never hold secrets: configs are recorded in their canonical form, which
leaves out fields marked secret (`Secret`, `secret_field()`), and the values of those and of secret-looking
environment variables are scrubbed from every string (errors, results, argv).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from schooner.cluster._secrets import redact_env, scrub, secret_values
from schooner.cluster._storage import Storage

from ._status import meta_path
from ._version import to_jsonable

_PACKAGES = (
    "schooner",
    "schooner-cluster",
    "schooner-data",
    "schooner-tokenize",
    "schooner-model",
    "schooner-train",
    "schooner-eval",
    "jax",
    "jaxlib",
    "haliax",
    "equinox",
    "optax",
    "numpy",
    "tensorstore",
    "tokenizers",
    "ray",
    "fsspec",
)


def redact_config(value: Any, secrets: list[str] | None = None) -> Any:
    """A copy of a canonical (JSON-able) config with secret values scrubbed from every string.

    Marked secrets are already out of the canonical form; fields are never judged by their names (a
    `num_experts_per_token` or `eot_token` is recorded as it is).
    """
    secrets = secret_values() if secrets is None else secrets

    def go(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: go(v2) for k, v2 in v.items()}
        if isinstance(v, list):
            return [go(x) for x in v]
        if isinstance(v, str) and secrets:
            return scrub(v, secrets)
        return v

    return go(value)


def scrub_any(value: Any, secrets: list[str] | None = None) -> Any:
    """`to_jsonable(value)` with secret values scrubbed from every string."""
    return redact_config(to_jsonable(value), secret_values() if secrets is None else secrets)


@functools.cache
def package_versions() -> dict[str, str]:
    """Installed versions of the Schooner packages and the main libraries they use."""
    from importlib import metadata

    out = {}
    for name in _PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


@functools.cache
def git_info(directory: str) -> dict[str, Any] | None:
    """`{"commit", "dirty"}` of the git work tree holding `directory`, or None outside a repository."""
    try:
        commit = subprocess.run(
            ["git", "-C", directory, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", directory, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return None


_script_override: str | None = None


@contextlib.contextmanager
def running_script(path: str) -> Iterator[None]:
    """Inside the block, `script_path()` is `path`: `schooner run EXP.py` runs the steps an experiment file
    only declares after the file has run, when `__main__` is the `schooner` command again."""
    global _script_override
    old, _script_override = _script_override, os.path.abspath(path)
    try:
        yield
    finally:
        _script_override = old


def script_path() -> str | None:
    """The experiment script being run (`__main__`'s file), if any."""
    if _script_override is not None:
        return _script_override
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.abspath(path) if path else None


def environment() -> dict[str, Any]:
    """Host, interpreter, packages and git state of this run (for records)."""
    script = script_path()
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "packages": package_versions(),
        "git": git_info(os.path.dirname(script) if script else os.getcwd()),
        "script": script,
    }


def step_record(
    step: Any, output_path: str, *, run_id: str, owner: str, env: dict[str, Any], secrets: list[str]
) -> dict[str, Any]:
    """The record of a step attempt at its start (`state` RUNNING); the runner fills in the end."""
    h = step.handle
    resources = None
    if h.resources is not None:
        resources = {
            k: getattr(h.resources, k)
            for k in ("cpu", "ram", "disk", "device", "device_kind", "device_count", "slices")
        }
        resources["env"] = redact_env(dict(h.resources.env))
    return {
        "name": h.name,
        "key": h.key,
        "output_path": output_path,
        "override_output_path": h.override_output_path is not None,
        "description": h.description,
        "fn": h.fn_name(),
        "fn_source_sha256": fn_source_hash(h.fn),
        "version": h.version,
        "code": h.code,
        "config": redact_config(h.canonical_config, secrets),
        "inputs": [{"field": f, "key": d.key, "name": d.name} for f, d in h.inputs()],
        "resources": resources,
        "run_id": run_id,
        "owner": owner,
        "env": env,
        "state": "RUNNING",
        "started": time.time(),
        "ended": None,
        "duration_s": None,
        "result": None,
        "error": None,
    }


def fn_source_hash(fn: Any) -> str | None:
    """SHA-256 of a step function's source text (None when it has none, e.g. a builtin).

    Not part of the key (moving or reformatting code must not rerun steps); plans and `explain` note it
    when a reused step's function changed without a `version` bump.
    """
    try:
        return _source_hash(inspect.unwrap(fn))
    except TypeError:  # unhashable callables: no cache
        return _source_hash.__wrapped__(inspect.unwrap(fn))


@functools.lru_cache(maxsize=4096)
def _source_hash(fn: Any) -> str | None:
    try:
        return hashlib.sha256(inspect.getsource(fn).encode("utf-8")).hexdigest()
    except (OSError, TypeError):
        return None


def write_step_record(storage: Storage, output_path: str, record: dict[str, Any]) -> None:
    storage.write_text(meta_path(output_path, "step.json"), json.dumps(record, indent=1, sort_keys=True))


HISTORY_KEEP = 50
"""Attempts kept in a step's `history.jsonl` (the oldest are dropped beyond it)."""


def append_history(storage: Storage, output_path: str, record: dict[str, Any]) -> None:
    """Add the end of an attempt (its outcome, times, run, error traceback) to `.schooner/history.jsonl`.

    The status file and `step.json` describe the latest attempt; the history keeps every attempt, so an
    earlier failure's traceback survives a later success. Rewritten whole (object stores cannot append).
    """
    path = meta_path(output_path, "history.jsonl")
    entry = {
        k: record.get(k) for k in ("run_id", "owner", "state", "started", "ended", "duration_s", "error")
    }
    entry["host"] = (record.get("env") or {}).get("host")
    if record.get("starts"):  # every start of the function: node, pid, how it ended (preemptions too)
        entry["starts"] = record["starts"]
    lines = (storage.read_text(path) or "").splitlines()
    lines = [*lines, json.dumps(entry, sort_keys=True)][-HISTORY_KEEP:]
    storage.write_text(path, "\n".join(lines) + "\n")


LOST_STATE = "LOST"
"""The history's state for an attempt whose end was never recorded (see :func:`record_lost_attempt`)."""


def record_lost_attempt(storage: Storage, output_path: str) -> dict[str, Any] | None:
    """If the step's record still says RUNNING, its attempt ended without a record: add that attempt to the
    history as ``LOST`` (its start, no end) and return the entry; None if there is nothing to add.

    Called by the attempt that takes the step over (its lease was free or stale), before it writes its own
    record: without it a killed attempt would leave no trace in the history, and its start (the run's real
    start) would be lost. An attempt already in the history (same run, owner and start: a taker killed
    right after adding it) is not added twice.
    """
    previous = read_step_record(storage, output_path)
    if previous is None or previous.get("state") != "RUNNING":
        return None
    same = ("run_id", "owner", "started")
    if any(all(h.get(k) == previous.get(k) for k in same) for h in read_history(storage, output_path)):
        return None
    lost = {
        **previous,
        "state": LOST_STATE,
        "ended": None,
        "duration_s": None,
        "error": "no end was recorded: a later attempt found this one's record still RUNNING and its lease "
        "free or stale (its runner was killed, e.g. with SIGKILL, its machine was lost, or it stalled "
        "past the lease's time-out)",
    }
    append_history(storage, output_path, lost)
    return lost


def read_history(storage: Storage, output_path: str) -> list[dict[str, Any]]:
    """The attempts of a step, oldest first (unreadable lines skipped)."""
    out = []
    for line in (storage.read_text(meta_path(output_path, "history.jsonl")) or "").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def read_json(storage: Storage, path: str) -> Any:
    """The JSON value of a small file, or None when it is missing, empty or unreadable."""
    text = storage.read_text(path)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def read_step_record(storage: Storage, output_path: str) -> dict[str, Any] | None:
    record = read_json(storage, meta_path(output_path, "step.json"))
    return record if isinstance(record, dict) else None


def experiment_name() -> str:
    """The file stem of the experiment script, or 'interactive'."""
    script = script_path()
    stem = os.path.splitext(os.path.basename(script))[0] if script else "interactive"
    return re.sub(r"[^A-Za-z0-9._-]", "_", stem) or "interactive"


def experiment_record_path(prefix: str, name: str, key: str, started: float, run_id: str) -> str:
    """`{prefix}/experiments/{name}-{key[:12]}/{UTC start}-{run_id}.json`: one record per run, kept, so
    failed and interrupted runs stay on record beside later ones (sorted by name = by start time)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    return f"{prefix.rstrip('/')}/experiments/{name}-{key[:12]}/{stamp}-{run_id}.json"
