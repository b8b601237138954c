"""Finding the step output folders under a prefix: the one scanner `schooner status`, the report, `compare`
and `explain` use."""

from __future__ import annotations

from dataclasses import dataclass

from schooner.cluster.records import META_DIR, StepStatus, step_status
from schooner.cluster.storage import is_plain_path, storage_for


@dataclass(frozen=True)
class FoundStep:
    """A step output folder found under a prefix by `scan_prefix`."""

    output_path: str
    status: StepStatus | None
    """None when the folder has a record but no readable status."""


def scan_prefix(prefix: str) -> list[FoundStep]:
    """Every step output folder under `prefix` (a folder holding `.schooner/`), sorted by path.

    The one scanner of a prefix (`schooner status`, the report and `explain` use it). Locally the walk does
    not descend into step folders (which may hold many files), nor into hidden folders or the prefix's
    `experiments/` records; on an object store it lists folder by folder the same way (`_walk_url`).
    """

    storage = storage_for(prefix)
    folders: list[str] = []
    if is_plain_path(prefix):
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
    return [FoundStep(f, step_status(f, storage=storage)) for f in sorted(set(folders))]


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
