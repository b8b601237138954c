"""A step's status file: `{output}/.schooner/status.json` holding RUNNING, SUCCESS or FAILED.

SUCCESS is written last, after the step's outputs and its record are complete, so a folder marked
SUCCESS never holds partial output. The status also names the step key: an output folder that holds a
different step (an `override_output_path` reused by another config) is never taken for this one.
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass
from typing import Any

from schooner.cluster._storage import Storage

from ._step import join_path

META_DIR = ".schooner"
"""Folder inside every step output that holds the runner's own files (status, lease, record)."""


class StepState(enum.StrEnum):
    """What a status file says."""

    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    INTERRUPTED = "INTERRUPTED"
    """Stopped by Ctrl-C (or SIGTERM) of its runner; a rerun resumes or restarts it."""


def meta_path(output_path: str, file: str) -> str:
    """`{output_path}/.schooner/{file}`."""
    return join_path(output_path, f"{META_DIR}/{file}")


@dataclass(frozen=True)
class StatusInfo:
    """A parsed status file."""

    state: StepState
    key: str
    name: str
    owner: str
    """Lease owner id of the attempt that wrote it."""
    time: float
    """Unix time it was written."""
    error: str = ""
    """One line: the exception for FAILED."""
    fn_sha: str = ""
    """SHA-256 of the step function's source when it ran (a plan notes a change without a version bump)."""

    def to_json(self) -> str:
        return json.dumps(
            {
                "status": self.state.value,
                "key": self.key,
                "name": self.name,
                "owner": self.owner,
                "time": self.time,
                "error": self.error,
                "fn_sha": self.fn_sha,
            }
        )


def read_status(storage: Storage, output_path: str) -> StatusInfo | None:
    """The status of the step in `output_path`, or None when there is none (never run, or unreadable)."""
    text = storage.read_text(meta_path(output_path, "status.json"))
    if not text:
        return None
    try:
        d: dict[str, Any] = json.loads(text)
        return StatusInfo(
            StepState(d["status"]),
            d["key"],
            d.get("name", ""),
            d.get("owner", ""),
            float(d.get("time", 0.0)),
            d.get("error", ""),
            d.get("fn_sha") or "",
        )
    except (ValueError, KeyError, TypeError):
        return None


def write_status(
    storage: Storage,
    output_path: str,
    state: StepState,
    *,
    key: str,
    name: str,
    owner: str,
    error: str = "",
    fn_sha: str = "",
) -> StatusInfo:
    """Atomically replace the status file."""
    info = StatusInfo(state, key, name, owner, time.time(), error, fn_sha)
    storage.write_text(meta_path(output_path, "status.json"), info.to_json())
    return info


@dataclass(frozen=True)
class FoundStep:
    """A step output folder found under a prefix by `scan_prefix`."""

    output_path: str
    status: StatusInfo | None
    """None when the folder has a record but no readable status."""


def scan_prefix(prefix: str) -> list[FoundStep]:
    """Every step output folder under `prefix` (a folder holding `.schooner/`), sorted by path.

    The one scanner of a prefix (`schooner status`, the report and `explain` use it). Locally the walk does
    not descend into step folders (which may hold many files), nor into hidden folders or the prefix's
    `experiments/` records; on an object store it lists folder by folder the same way (`_walk_url`).
    """
    from schooner.cluster._storage import is_local, storage_for

    storage = storage_for(prefix)
    folders: list[str] = []
    if is_local(prefix):
        import os

        for root, dirs, _files in os.walk(prefix):
            if META_DIR in dirs:
                folders.append(root)
                dirs[:] = []
            else:
                dirs[:] = sorted(
                    d for d in dirs if not d.startswith(".") and not (root == prefix and d == "experiments")
                )
    else:
        folders = _walk_url(prefix)
    return [FoundStep(f, read_status(storage, f)) for f in sorted(set(folders))]


def _walk_url(prefix: str) -> list[str]:
    """Step folders under an object-store prefix, found level by level with delimited listings (one request
    per folder level), never descending into a step folder: a step's thousands of shards are never listed."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(prefix)
    proto = prefix.split("://", 1)[0]
    top = root.rstrip("/")
    found, todo = [], [top]
    while todo:
        folder = todo.pop()
        try:
            entries = fs.ls(folder, detail=True, refresh=True)
        except FileNotFoundError:
            continue
        subdirs = [e["name"].rstrip("/") for e in entries if e.get("type") == "directory"]
        if any(d.rsplit("/", 1)[-1] == META_DIR for d in subdirs):
            found.append(f"{proto}://{folder.lstrip('/')}")
            continue
        for d in subdirs:
            name = d.rsplit("/", 1)[-1]
            if not name.startswith(".") and not (folder == top and name == "experiments"):
                todo.append(d)
    return found
