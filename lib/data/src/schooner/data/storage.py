"""The storage face of schooner-data: `schooner.cluster.storage` (the one owner of file access and atomic
writes, issue 35) for everything the two share, plus what is data's own.

Local paths (and `file://` URLs) use `os` directly; any other URL (`gs://`, `s3://`, `memory://`, ...) goes
through fsspec. Every write is atomic and durable:

- whole files (`write_bytes`, `write_json`) are `schooner.cluster.storage.write_bytes`: a uniquely named
  temporary file (host, pid and a random part), fsync'd, renamed over the target, and the folder fsync'd;
  on object stores one put of the whole object;
- streamed files (`atomic_open`, used for shards and spill files too large to hold in memory) are
  `schooner.cluster.storage.atomic_open`: the same protocol, writing the temporary file as they go; on object
  stores the object is published when the stream closes, so a failed writer leaves nothing under the final
  name. `is_temp_name` tells such a temporary file from data.

The shared names (`exists`, `isdir`, `open_file` (reading only), `file_size`, `read_bytes`, `makedirs`,
`remove`, `remove_tree`, `write_bytes`, `atomic_open`, `join`, `is_local`, `local_path`, `url_to_fs`,
`is_temp_name`, `unique_tag`) are cluster's own functions. Data's own: `file_identity` (what a plan
fingerprint notes of an input file), `read_json` / `write_json` (orjson, compact; integers of any size
exact; `pretty=True` for files people read), `list_dir`, `has_glob`.

Example:
    >>> from schooner.data import storage
    >>> with storage.atomic_open("/tmp/storage-demo/big.bin") as f:  # doctest: +SKIP
    ...     f.write(b"chunk after chunk")
    >>> storage.write_json("/tmp/storage-demo/done.json", {"ok": True})  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import orjson

from schooner.cluster.storage import atomic_open as atomic_open
from schooner.cluster.storage import exists as exists
from schooner.cluster.storage import file_size as file_size
from schooner.cluster.storage import is_local as is_local
from schooner.cluster.storage import is_temp_name as is_temp_name
from schooner.cluster.storage import isdir as isdir
from schooner.cluster.storage import join as join
from schooner.cluster.storage import listdir as _listdir
from schooner.cluster.storage import local_path as local_path
from schooner.cluster.storage import makedirs as makedirs
from schooner.cluster.storage import open_file as open_file
from schooner.cluster.storage import read_bytes as read_bytes
from schooner.cluster.storage import remove as remove
from schooner.cluster.storage import remove_tree as remove_tree
from schooner.cluster.storage import unique_tag as unique_tag
from schooner.cluster.storage import url_to_fs as url_to_fs
from schooner.cluster.storage import write_bytes as write_bytes

from ._json import dumps_json, loads_json

_GLOB_CHARS = ("*", "?", "[")


def has_glob(path: str) -> bool:
    """Whether `path` holds a glob character (`*`, `?`, `[`)."""
    return any(c in path for c in _GLOB_CHARS)


def file_identity(url: str) -> dict[str, Any]:
    """What identifies a file's content cheaply: its size and modification time (local), or its size and
    the store's version tag (ETag, md5, generation or mtime) on object stores. Rewriting a file changes it."""
    import os

    if is_local(url):
        st = os.stat(local_path(url))
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    fs, p = url_to_fs(url)
    info = fs.info(p)
    tag = next((info[k] for k in ("ETag", "etag", "md5Hash", "generation", "mtime", "LastModified", "created")
                if info.get(k) is not None), None)  # fmt: skip
    return {"size": int(info.get("size") or 0), "tag": str(tag)}


def read_json(url: str) -> Any:
    """A JSON file (integers of any size kept exact)."""
    return loads_json(read_bytes(url))


def list_dir(url: str) -> list[str]:
    """The names of the entries of folder `url`, sorted (empty when it does not exist): cluster's
    `listdir`."""
    return _listdir(url)


def write_json(url: str, obj: Any, *, pretty: bool = False) -> None:
    """Write `obj` as JSON atomically (`write_bytes`); compact orjson (integers of any size exact), or
    `pretty`: indented with sorted keys, for files people read."""
    if pretty:
        try:
            data = orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
        except TypeError:
            import json

            data = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False).encode("utf-8")
    else:
        data = dumps_json(obj)
    write_bytes(url, data + b"\n")
