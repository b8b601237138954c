"""Storage helpers shared by the cache writer and reader: paths, atomic JSON, tensorstore specs.

Local paths (and `file://` URLs) are the tested case. Other URLs (`gs://`, `s3://`) go to fsspec for the
JSON files and to tensorstore's kvstore URL syntax for the arrays; both stores must see the same bytes, so
`memory://` (process-local in both libraries, but two different memories) is refused.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import numpy as np
import tensorstore as ts

_CONTEXT: ts.Context | None = None
READ_CHUNK = 1 << 16
"""Tokens per read chunk: a random 4 KiB sequence read touches at most two of these."""
WRITE_CHUNK = 1 << 22
"""Tokens per stored shard file (the zarr3 sharding codec packs read chunks into these)."""


def _is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def local(path: str) -> str:
    """`path` without a `file://` prefix."""
    return path[len("file://") :] if path.startswith("file://") else path


def check_supported(path: str) -> None:
    if path.startswith("memory://"):
        raise ValueError(
            f"token cache path {path!r}: memory:// is not shared between fsspec and tensorstore; "
            "use a local folder (or gs:// / s3://)"
        )


def join(path: str, *parts: str) -> str:
    if _is_url(path):
        return "/".join([path.rstrip("/"), *parts])
    return os.path.join(local(path), *parts)


def exists(path: str) -> bool:
    if _is_url(path):
        import fsspec

        fs, p = fsspec.core.url_to_fs(path)
        return fs.exists(p)
    return os.path.exists(local(path))


def read_json(path: str) -> Any:
    if _is_url(path):
        import fsspec

        with fsspec.open(path, "r") as f:
            return json.load(f)
    with open(local(path), encoding="utf-8") as f:
        return json.load(f)


def write_json(path: str, obj: Any) -> None:
    """Write JSON so readers see the old file or the new one, never half of one."""
    text = json.dumps(obj, indent=1, sort_keys=True) + "\n"
    if _is_url(path):
        import fsspec

        with fsspec.open(path, "w") as f:  # object stores publish a whole object at close
            f.write(text)
        return
    path = local(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_tree(path: str) -> None:
    if _is_url(path):
        import fsspec

        fs, p = fsspec.core.url_to_fs(path)
        if fs.exists(p):
            fs.rm(p, recursive=True)
        return
    shutil.rmtree(local(path), ignore_errors=True)


def context() -> ts.Context:
    """One tensorstore context per process, with a small chunk cache so nearby random reads are cheap."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = ts.Context({"cache_pool": {"total_bytes_limit": 64 << 20}})
    return _CONTEXT


def _kvstore(path: str) -> Any:
    if _is_url(path):
        return path.rstrip("/") + "/"
    return {"driver": "file", "path": os.path.abspath(local(path))}


def create_array(path: str, n: int, dtype: str) -> ts.TensorStore:
    """A new 1-D zarr3 array of `n` elements at `path` (replacing whatever was there)."""
    inner = min(READ_CHUNK, max(1, n))
    chunk = min(
        WRITE_CHUNK, -(-max(1, n) // inner) * inner
    )  # a multiple of the read chunk, as zarr3 requires
    spec = {
        "driver": "zarr3",
        "kvstore": _kvstore(path),
        "metadata": {
            "shape": [n],
            "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk]}},
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": [inner],
                        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                        "index_codecs": [
                            {"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "crc32c"},
                        ],
                    },
                }
            ],
        },
        "create": True,
        "delete_existing": True,
    }
    return ts.open(spec, context=context()).result()


def open_array(path: str) -> ts.TensorStore:
    """Open an existing zarr3 array read-only."""
    return ts.open(
        {"driver": "zarr3", "kvstore": _kvstore(path), "open": True}, read=True, context=context()
    ).result()


def write_all(arr: ts.TensorStore, data: np.ndarray, start: int = 0) -> None:
    """Write `data` at `start`, one stored shard file at a time (whole-shard writes need no read-back)."""
    if data.size == 0:
        return
    arr[start : start + data.size].write(data).result()


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned dtype that holds every id: half the disk and I/O for vocabularies <= 65536."""
    return "uint16" if vocab_size <= 1 << 16 else "int32"
