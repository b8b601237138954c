"""A small, dependency-free safetensors reader/writer (numpy; bfloat16 via ml_dtypes, no torch).

Format: 8-byte little-endian header length, a JSON header ``{name: {"dtype", "shape", "data_offsets"}}``
(plus optional ``"__metadata__"``), then the raw little-endian tensor bytes.

Both directions stream: the reader memory-maps the file (a tensor's bytes are read when it is used), and
:func:`write_safetensors_stream` writes the header from the tensors' shapes and dtypes first and then asks
for one tensor at a time, so a file is never held in memory whole.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of a tensor to write."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def write_safetensors_stream(
    path: str | os.PathLike,
    specs: Sequence[TensorSpec],
    produce: Callable[[TensorSpec], np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write the tensors ``specs`` to ``path``, asking ``produce(spec)`` for each one in order.

    The file is written to a temporary name and renamed into place, so a crash leaves no partial file.

    Raises:
        TypeError: a dtype safetensors cannot store.
        ValueError: ``produce`` returned an array of another shape or dtype than its spec.
    """
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for spec in specs:
        dtype = np.dtype(spec.dtype)
        if dtype not in _FROM_NP:
            raise TypeError(f"safetensors cannot store tensor {spec.name!r} of dtype {dtype}.")
        header[spec.name] = {
            "dtype": _FROM_NP[dtype],
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * ((8 - len(blob) % 8) % 8)
    tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for spec in specs:
                arr = np.ascontiguousarray(produce(spec))
                if arr.shape != tuple(spec.shape) or arr.dtype != np.dtype(spec.dtype):
                    raise ValueError(
                        f"tensor {spec.name!r}: got {arr.dtype}{list(arr.shape)}, expected "
                        f"{np.dtype(spec.dtype)}{list(spec.shape)}."
                    )
                f.write(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_safetensors(
    path: str | os.PathLike, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``tensors`` (sorted by name) to ``path`` atomically."""
    arrays = {name: np.asarray(tensors[name]) for name in sorted(tensors)}
    specs = [TensorSpec(name, tuple(a.shape), a.dtype) for name, a in arrays.items()]
    write_safetensors_stream(path, specs, lambda spec: arrays[spec.name], metadata)


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file as memory-mapped, read-only numpy arrays (nothing is read yet)."""
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
