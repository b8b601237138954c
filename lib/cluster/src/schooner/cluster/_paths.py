"""Paths of the storage layer: local paths (and `file://` URLs) that `os` serves, and fsspec URLs.

Public through `schooner.cluster.storage`; the reading and writing modules build on these.
"""

from __future__ import annotations

import os
from typing import Any


def normalize_prefix(prefix: str) -> str:
    """An absolute local path for local prefixes (also `file://...`), else the URL without trailing '/'."""
    if prefix.startswith("file://"):
        prefix = prefix[len("file://") :]
    if "://" in prefix:
        return prefix.rstrip("/")
    return os.path.abspath(os.path.expanduser(prefix))


def is_local(path: str) -> bool:
    """True for plain paths and `file://` URLs (both go through `os`)."""
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> str:
    """A local path without its `file://` prefix (other paths unchanged)."""
    return path.removeprefix("file://")


def join(base: str, *parts: str) -> str:
    """`base/part/...` for local paths and URLs alike: '/' between parts, no normalisation of `..`."""
    out = base.rstrip("/") if base not in ("", "/") else base
    for p in parts:
        p = p.strip("/")
        if p:
            out = f"{out}/{p}" if out and not out.endswith("/") else f"{out}{p}"
    return out


def url_to_fs(path: str) -> tuple[Any, str]:
    """The fsspec filesystem and the path inside it, for a local path or any fsspec URL."""
    import fsspec

    return fsspec.core.url_to_fs(path)


def is_plain_path(path: str) -> bool:
    """Whether `path` has no URL scheme at all: what `storage_for` serves through `os` (a `file://` URL
    goes through fsspec's local filesystem there, so code that then calls `os` on the path itself tests
    this, not `is_local`)."""
    return "://" not in path
