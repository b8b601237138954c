"""The token arrays of a cache: tensorstore zarr3 specs, creation, reads and aligned writes.

Everything else a cache holds (manifests, the build's ledger and part files) goes through the storage
layer of schooner-data (`schooner.data.storage`). Local paths (and `file://` URLs) are the tested case.
Other URLs (`gs://`, `s3://`) go to fsspec for files and to tensorstore's kvstore URL syntax for the
arrays; both must see the same bytes, so `memory://` (process-local in both libraries, but two different
memories) is refused.
"""

from __future__ import annotations

import os
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


def check_supported(path: str) -> None:
    if path.startswith("memory://"):
        raise ValueError(
            f"token cache path {path!r}: memory:// is not shared between fsspec and tensorstore; "
            "use a local folder (or gs:// / s3://)"
        )


def context() -> ts.Context:
    """One tensorstore context per process, with a small chunk cache so nearby random reads are cheap."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = ts.Context({"cache_pool": {"total_bytes_limit": 64 << 20}})
    return _CONTEXT


def _kvstore(path: str) -> Any:
    if path.startswith("s3://"):
        return s3_kvstore(path)
    if _is_url(path):
        return path.rstrip("/") + "/"
    return {"driver": "file", "path": os.path.abspath(path.removeprefix("file://"))}


def s3_kvstore(url: str) -> dict[str, Any]:
    """tensorstore's S3 kvstore spec for `s3://bucket/path`, honouring the endpoint and region that
    botocore and s3fs read from the environment (`AWS_ENDPOINT_URL[_S3]`, `AWS_REGION`/`AWS_DEFAULT_REGION`),
    which tensorstore's URL form ignores: an S3-compatible store (MinIO, a local server) works for the token
    arrays exactly as it does for the files beside them."""
    bucket, _, key = url.removeprefix("s3://").partition("/")
    spec: dict[str, Any] = {"driver": "s3", "bucket": bucket, "path": key.rstrip("/") + "/" if key else ""}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        spec["endpoint"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        spec["aws_region"] = region
    return spec


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
