"""The storage layer of schooner-data and schooner-tokenize: paths on any fsspec filesystem, and writes
that readers see whole or not at all.

Local paths (and `file://` URLs) use `os` directly; any other URL (`gs://`, `s3://`, `memory://`, ...) goes
through fsspec. Every write is atomic and durable:

- whole files (`write_bytes`, `write_json`) are `schooner.cluster.atomic_write`: a uniquely named
  temporary file (host, pid and a random part), fsync'd, renamed over the target, and the folder fsync'd;
  on object stores one put of the whole object;
- streamed files (`atomic_open`, used for shards and spill files too large to hold in memory) are
  `schooner.cluster.atomic_open`: the same protocol, writing the temporary file as they go; on object
  stores the object is published when the stream closes, so a failed writer leaves nothing under the final
  name. `is_temp_name` tells such a temporary file from data.

Example:
    >>> from schooner.data import storage
    >>> with storage.atomic_open("/tmp/storage-demo/big.bin") as f:  # doctest: +SKIP
    ...     f.write(b"chunk after chunk")
    >>> storage.write_json("/tmp/storage-demo/done.json", {"ok": True})  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import IO, Any

import fsspec
import orjson

from schooner.cluster import atomic_open as _atomic_open
from schooner.cluster import atomic_write
from schooner.cluster import is_temp_name as is_temp_name
from schooner.cluster import unique_tag as unique_tag

from ._json import dumps_json, loads_json

_GLOB_CHARS = ("*", "?", "[")


def url_to_fs(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and the path inside it for a local path or an fsspec URL."""
    return fsspec.core.url_to_fs(url)


def is_local(url: str) -> bool:
    """True for plain paths and `file://` URLs."""
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    """A local path without its `file://` prefix."""
    return url.removeprefix("file://")


def join(base: str, *parts: str) -> str:
    """Join path parts with '/', for local paths and URLs alike."""
    out = base.rstrip("/")
    for p in parts:
        out = f"{out}/{p.lstrip('/')}"
    return out


def has_glob(path: str) -> bool:
    return any(c in path for c in _GLOB_CHARS)


# ---------------------------------------------------------------------------------------------- reading


def exists(url: str) -> bool:
    if is_local(url):
        return os.path.exists(local_path(url))
    fs, p = url_to_fs(url)
    return fs.exists(p)


def isdir(url: str) -> bool:
    if is_local(url):
        return os.path.isdir(local_path(url))
    fs, p = url_to_fs(url)
    return fs.isdir(p)


def open_file(url: str, mode: str = "rb") -> IO[Any]:
    """Open a local path (plain `open`, the fast path) or an fsspec URL for reading."""
    if is_local(url):
        return open(local_path(url), mode)
    fs, p = url_to_fs(url)
    return fs.open(p, mode)


def file_size(url: str) -> int:
    if is_local(url):
        return os.path.getsize(local_path(url))
    fs, p = url_to_fs(url)
    return int(fs.size(p))


def file_identity(url: str) -> dict[str, Any]:
    """What identifies a file's content cheaply: its size and modification time (local), or its size and
    the store's version tag (ETag, md5, generation or mtime) on object stores. Rewriting a file changes it."""
    if is_local(url):
        st = os.stat(local_path(url))
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    fs, p = url_to_fs(url)
    info = fs.info(p)
    tag = next((info[k] for k in ("ETag", "etag", "md5Hash", "generation", "mtime", "LastModified", "created")
                if info.get(k) is not None), None)  # fmt: skip
    return {"size": int(info.get("size") or 0), "tag": str(tag)}


def read_bytes(url: str) -> bytes:
    with open_file(url, "rb") as f:
        return f.read()


def read_json(url: str) -> Any:
    """A JSON file (integers of any size kept exact)."""
    return loads_json(read_bytes(url))


def list_dir(url: str) -> list[str]:
    """The names of the entries of folder `url`, sorted (empty when it does not exist)."""
    if is_local(url):
        try:
            return sorted(os.listdir(local_path(url)))
        except (FileNotFoundError, NotADirectoryError):
            return []
    fs, p = url_to_fs(url)
    try:
        return sorted(os.path.basename(x.rstrip("/")) for x in fs.ls(p, detail=False))
    except FileNotFoundError:
        return []


# ---------------------------------------------------------------------------------------------- writing


def write_bytes(url: str, data: bytes | str) -> None:
    """Replace the file at `url` atomically and durably (`schooner.cluster.atomic_write`)."""
    atomic_write(local_path(url) if is_local(url) else url, data)


def write_json(url: str, obj: Any, *, pretty: bool = False) -> None:
    """Write `obj` as JSON atomically (`pretty`: indented with sorted keys, for files people read)."""
    if pretty:
        try:
            data = orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
        except TypeError:
            import json

            data = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False).encode("utf-8")
    else:
        data = dumps_json(obj)
    write_bytes(url, data + b"\n")


def makedirs(url: str) -> None:
    if is_local(url):
        os.makedirs(local_path(url), exist_ok=True)
        return
    fs, p = url_to_fs(url)
    fs.makedirs(p, exist_ok=True)


def remove(url: str) -> None:
    """Delete one file (nothing when it is already gone)."""
    if is_local(url):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(local_path(url))
        return
    fs, p = url_to_fs(url)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(p)


def remove_tree(url: str) -> None:
    """Delete a folder and everything in it (nothing when it is already gone)."""
    if is_local(url):
        shutil.rmtree(local_path(url), ignore_errors=True)
        return
    fs, p = url_to_fs(url)
    if fs.exists(p):
        fs.rm(p, recursive=True)


def atomic_open(final: str) -> contextlib.AbstractContextManager[IO[bytes]]:
    """A binary file to write `final` through, seen whole or not at all (`schooner.cluster.atomic_open`)."""
    return _atomic_open(local_path(final) if is_local(final) else final)
