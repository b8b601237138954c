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
from schooner.cluster.records import installed_versions

from ._version import to_jsonable


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


def scrub_any(value: Any, secrets: list[str] | None = None, non_finite: list[str] | None = None) -> Any:
    """`to_jsonable(value)` with secret values scrubbed from every string (NaN and infinities become None,
    their paths appended to `non_finite`)."""
    return redact_config(to_jsonable(value, non_finite), secret_values() if secrets is None else secrets)


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
        "packages": installed_versions(),
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


def experiment_name() -> str:
    """The file stem of the experiment script, or 'interactive'."""
    script = script_path()
    stem = os.path.splitext(os.path.basename(script))[0] if script else "interactive"
    return re.sub(r"[^A-Za-z0-9._-]", "_", stem) or "interactive"
