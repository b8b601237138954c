"""Write and read a pytree of arrays as tensorstore (zarr3) arrays, one array per leaf.

The train state (model, optimizer state, RNG key) is written leaf by leaf in flatten order with a small
`leaves.json` index (shape, dtype per leaf). Reading takes a `like` tree (the freshly initialized state or
its `jax.eval_shape`) that supplies the structure, and checks every shape and dtype against the index so a
checkpoint from a different model or optimizer fails with a clear message instead of loading garbage.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

_INDEX = "leaves.json"


def _kvstore(path: str) -> dict[str, Any] | str:
    if "://" in path and not path.startswith("file://"):
        return path  # tensorstore URL (gs://, s3://, memory://)
    return {"driver": "file", "path": os.path.abspath(path.removeprefix("file://"))}


def _ts_dtype(dtype: np.dtype) -> Any:
    import tensorstore as ts

    return ts.bfloat16 if dtype.name == "bfloat16" else ts.dtype(dtype.name)


def _leaf_path(root: str, i: int) -> str:
    return f"{root.rstrip('/')}/leaf-{i:05d}"


def save_tree(path: str, leaves: Sequence[np.ndarray], *, threads: int = 8) -> None:
    """Write host arrays `leaves` under `path` (a folder) plus the `leaves.json` index.

    Args:
        path: destination folder (local path or a tensorstore URL).
        leaves: numpy arrays (the flattened pytree, in `jax.tree.leaves` order).
        threads: parallel writers; tensorstore releases the GIL while writing.
    """
    import fsspec
    import tensorstore as ts

    def write(i_arr: tuple[int, np.ndarray]) -> None:
        i, arr = i_arr
        spec = {"driver": "zarr3", "kvstore": _kvstore(_leaf_path(path, i))}
        t = ts.open(
            spec, create=True, delete_existing=True, dtype=_ts_dtype(arr.dtype), shape=arr.shape
        ).result()
        t.write(arr).result()

    arrays = [np.asarray(x) for x in leaves]
    with ThreadPoolExecutor(max(1, min(threads, len(arrays)))) as pool:
        list(pool.map(write, enumerate(arrays)))
    index = [{"shape": list(a.shape), "dtype": a.dtype.name} for a in arrays]
    with fsspec.open(f"{path.rstrip('/')}/{_INDEX}", "w") as f:
        json.dump({"leaves": index}, f)


def load_tree(path: str, like: Any, *, shardings: Any = None, threads: int = 8) -> Any:
    """Read the tree written by `save_tree` into the structure of `like`.

    Args:
        path: the folder `save_tree` wrote.
        like: a pytree with the target structure; leaves are arrays or `jax.ShapeDtypeStruct`s.
        shardings: None (default device), or a pytree like `like` of `jax.sharding.Sharding`s to place each
            leaf with.
        threads: parallel readers.

    Returns:
        A pytree like `like` holding jax arrays.

    Raises:
        ValueError: the stored leaves do not match `like` (count, shape or dtype), naming the first mismatch.
    """
    import fsspec
    import tensorstore as ts

    with fsspec.open(f"{path.rstrip('/')}/{_INDEX}", "r") as f:
        index = json.load(f)["leaves"]
    like_leaves, treedef = jax.tree.flatten(like)
    if len(index) != len(like_leaves):
        raise ValueError(
            f"checkpoint {path} holds {len(index)} arrays but the current train state has {len(like_leaves)}; "
            "it was written for a different model or optimizer configuration"
        )
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(like)[0]]
    for i, (entry, leaf) in enumerate(zip(index, like_leaves)):
        shape, dtype = tuple(leaf.shape), np.dtype(leaf.dtype).name
        if tuple(entry["shape"]) != shape or entry["dtype"] != dtype:
            raise ValueError(
                f"checkpoint {path}: array {i} ({paths[i]}) is {entry['dtype']}{entry['shape']} but the train "
                f"state expects {dtype}{list(shape)}; the checkpoint belongs to a different configuration"
            )

    def read(i: int) -> np.ndarray:
        spec = {"driver": "zarr3", "kvstore": _kvstore(_leaf_path(path, i))}
        return ts.open(spec, open=True).result().read().result()

    with ThreadPoolExecutor(max(1, min(threads, len(index)))) as pool:
        host = list(pool.map(read, range(len(index))))
    if shardings is None:
        out = [jax.numpy.asarray(h) for h in host]
    else:
        shard_leaves = treedef.flatten_up_to(shardings)
        out = [jax.device_put(h, s) for h, s in zip(host, shard_leaves)]
    return treedef.unflatten(out)
