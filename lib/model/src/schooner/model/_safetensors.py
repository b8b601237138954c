"""A small, dependency-free safetensors reader/writer (numpy; bfloat16 via ml_dtypes, no torch).

Format: 8-byte little-endian header length, a JSON header ``{name: {"dtype", "shape", "data_offsets"}}``
(plus optional ``"__metadata__"``), then the raw little-endian tensor bytes.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping

import ml_dtypes
import numpy as np

_TO_NP = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_FROM_NP = {v: k for k, v in _TO_NP.items()}


def write_safetensors(
    path: str | os.PathLike, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``tensors`` to ``path`` atomically (a temp file renamed into place)."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    arrays = []
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        if arr.dtype not in _FROM_NP:
            raise TypeError(f"safetensors cannot store tensor {name!r} of dtype {arr.dtype}.")
        header[name] = {
            "dtype": _FROM_NP[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
        arrays.append(arr)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * ((8 - len(blob) % 8) % 8)
    tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in arrays:
            f.write(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
    os.replace(tmp, path)


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file (memory-mapped, read-only numpy arrays)."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _TO_NP:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']!r}.")
        start, stop = info["data_offsets"]
        dtype = _TO_NP[info["dtype"]].newbyteorder("<")
        out[name] = data[start:stop].view(dtype).reshape(info["shape"])
    return out
