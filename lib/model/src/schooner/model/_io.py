"""Pytree I/O on tensorstore (zarr v3): one array per leaf, a ``metadata.json`` commit file written last.

Layout of a saved pytree folder::

    path/
      leaf-00000/zarr.json, leaf-00000/c/...   one zarr3 array per leaf (float, int, bool, bfloat16, ...)
      leaf-00001/...
      metadata.json                            written LAST: a folder without it is an unfinished save

``metadata.json`` lists every leaf's key path (``jax.tree_util.keystr``), array name, shape, dtype and
kind (``jax`` / ``numpy`` / ``int`` / ``float`` / ``bool``). Loading matches leaves by key path, so a
pytree saved from one program loads into any pytree with the same paths (e.g. the same model class).
Paths are local folders or tensorstore kvstore URLs (``gs://bucket/x/``, ``memory://x/``, ``file:///x/``).
Sharded jax arrays are written shard by shard (each addressable shard once) and can be read back onto
any sharding without materialising the whole array on one device. Several processes (multi-host, after
``jax.distributed.initialize``) call ``save_pytree`` together: each writes only its own devices' pieces and
process 0 commits after all have written.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import jax
import numpy as np
import tensorstore as ts

FORMAT = "schooner-pytree-v1"
METADATA = "metadata.json"
_CHUNK_BYTES = 64 * 1024 * 1024
# One context for every open: shares caches and makes ``memory://`` stores visible across calls.
_CONTEXT = ts.Context()


def _kvstore_spec(path: str | os.PathLike) -> Any:
    path = os.fspath(path)
    if path.startswith("s3://"):
        return _s3_spec(path)
    if "://" in path:
        return path.rstrip("/") + "/"
    return {"driver": "file", "path": os.path.abspath(path) + "/"}


def _s3_spec(url: str) -> dict[str, Any]:
    # tensorstore's s3:// URL form ignores the endpoint and region that botocore and s3fs read from the
    # environment; the spec form takes them, so an S3-compatible store (MinIO, a local server) works.
    bucket, _, key = url.removeprefix("s3://").partition("/")
    spec: dict[str, Any] = {"driver": "s3", "bucket": bucket, "path": key.strip("/") + "/" if key else ""}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        spec["endpoint"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        spec["aws_region"] = region
    return spec


_BARRIERS: dict[str, int] = {}
_BARRIER_TIMEOUT_MS = 600_000


def _barrier(label: str) -> None:
    """Wait until every process of a multi-process run got here (the coordination service's barrier: no
    collective, so it is safe on a background thread while the devices run other programs)."""
    from jax._src import distributed

    n = _BARRIERS[label] = _BARRIERS.get(label, 0) + 1
    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("save_pytree on several processes needs jax.distributed.initialize() first")
    client.wait_at_barrier(f"schooner-save-{label}-{n}", _BARRIER_TIMEOUT_MS)


def _join(base: Any, name: str) -> Any:
    if isinstance(base, str):
        return base + name + "/"
    return {**base, "path": base["path"] + name + "/"}


def _open_kv(path: str | os.PathLike) -> ts.KvStore:
    return ts.KvStore.open(_kvstore_spec(path), context=_CONTEXT).result()


def _key(path: tuple) -> str:
    # NamedArray flattens without keys; make its "[<flat index 0>]" readable and stable.
    return re.sub(r"\[<flat index (\d+)>\]", r"[\1]", jax.tree_util.keystr(path))


def _chunk_shape(shape: tuple[int, ...], itemsize: int) -> list[int]:
    chunk = [max(1, s) for s in shape]
    while chunk and math.prod(chunk) * itemsize > _CHUNK_BYTES:
        i = int(np.argmax(chunk))
        chunk[i] = (chunk[i] + 1) // 2
    return chunk


def _leaf_kind(key: str, leaf: Any) -> str:
    if isinstance(leaf, jax.Array):
        return "jax"
    if isinstance(leaf, np.ndarray | np.generic):
        return "numpy"
    if isinstance(leaf, bool):
        return "bool"
    if isinstance(leaf, int):
        return "int"
    if isinstance(leaf, float):
        return "float"
    raise TypeError(
        f"save_pytree can store jax/numpy arrays and Python scalars; leaf {key} is a {type(leaf).__name__}. "
        "Make it static (eqx.field(static=True)) or convert it to an array."
    )


def _create_leaf(spec: Any, leaf: Any, kind: str) -> list[Any]:
    """Create one leaf's array (replacing what was there); a host value is written at once. Returns the
    pending write futures."""
    if kind == "jax":
        dtype, shape = np.dtype(leaf.dtype), tuple(leaf.shape)
    else:
        leaf = np.asarray(leaf)
        dtype, shape = leaf.dtype, leaf.shape
    store = ts.open(
        {"driver": "zarr3", "kvstore": spec},
        create=True,
        delete_existing=True,
        context=_CONTEXT,
        dtype=ts.dtype(dtype.name),
        shape=list(shape),
        chunk_layout=ts.ChunkLayout(chunk_shape=_chunk_shape(shape, dtype.itemsize)),
    ).result()
    return [store.write(leaf)] if kind != "jax" else []


def _write_shards(spec: Any, leaf: jax.Array) -> list[Any]:
    """Write this process's pieces of a created array; returns the pending write futures."""
    store = ts.open({"driver": "zarr3", "kvstore": spec}, open=True, context=_CONTEXT).result()
    futures = []
    for shard in leaf.addressable_shards:
        if shard.replica_id == 0:  # each distinct piece once, by whichever device holds replica 0
            futures.append(store[shard.index].write(np.asarray(shard.data)))
    return futures


def save_pytree(path: str | os.PathLike, tree: Any, *, overwrite: bool = False) -> None:
    """Save a pytree of jax/numpy arrays and Python scalars to ``path`` (tensorstore zarr3), atomically.

    Data is written first and ``metadata.json`` last; readers treat a folder without it as absent.

    Args:
        path: a local folder or a tensorstore kvstore URL (``s3://`` uses ``AWS_ENDPOINT_URL`` when set).
        tree: any pytree (equinox modules, optax states, dicts...); ``None`` subtrees hold nothing.
        overwrite: replace an existing committed pytree at ``path`` (its commit file is removed first, so a
            crash mid-way leaves no half-old, half-new pytree that looks complete).

    Raises:
        FileExistsError: a committed pytree exists at ``path`` and ``overwrite`` is False.
        TypeError: a leaf is not an array or scalar (the message names its key path).
    """
    kv = _open_kv(path)
    if kv.read(METADATA).result().state == "value":
        if not overwrite:
            raise FileExistsError(
                f"a pytree is already saved at {os.fspath(path)!r}; pass overwrite=True to replace it."
            )
        if jax.process_index() == 0:
            kv.delete_range(ts.KvStore.KeyRange(METADATA, METADATA + "\0")).result()
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    base = _kvstore_spec(path)
    # Several processes (multi-host): process 0 creates every array (and writes host values), all wait,
    # each writes the pieces its devices hold, all wait, process 0 commits. One process: the same, unwaited.
    multi, primary = jax.process_count() > 1, jax.process_index() == 0
    entries, futures, sharded = [], [], []
    for i, (kp, leaf) in enumerate(leaves):
        key = _key(kp)
        kind = _leaf_kind(key, leaf)
        name = f"leaf-{i:05d}"
        if primary:
            futures.extend(_create_leaf(_join(base, name), leaf, kind))
        if kind == "jax":
            sharded.append((_join(base, name), leaf))
        arr_dtype = np.dtype(leaf.dtype) if kind in ("jax", "numpy") else np.asarray(leaf).dtype
        entries.append(
            {"key": key, "name": name, "shape": list(np.shape(leaf)), "dtype": arr_dtype.name, "kind": kind}
        )
    label = os.fspath(path)
    if multi:
        _barrier(f"{label}:created")
    for spec, leaf in sharded:
        futures.extend(_write_shards(spec, leaf))
    for f in futures:
        f.result()
    if multi:
        _barrier(f"{label}:written")
    if primary:
        meta = {"format": FORMAT, "treedef": str(treedef), "leaves": entries}
        kv.write(METADATA, json.dumps(meta, indent=1).encode()).result()


def read_pytree_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The ``metadata.json`` of a saved pytree (raises FileNotFoundError when there is no committed save)."""
    result = _open_kv(path).read(METADATA).result()
    if result.state != "value":
        raise FileNotFoundError(
            f"no committed pytree at {os.fspath(path)!r} ({METADATA} is missing: nothing was saved there, "
            "or the save did not finish)."
        )
    meta = json.loads(bytes(result.value))
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"{os.fspath(path)!r}/{METADATA} has format {meta.get('format')!r}; expected {FORMAT!r}."
        )
    return meta


def _reader(base: Any, entry: dict[str, Any]) -> ts.TensorStore:
    return ts.open(
        {"driver": "zarr3", "kvstore": _join(base, entry["name"])}, open=True, context=_CONTEXT
    ).result()


def _restore(store: ts.TensorStore, like: Any, sharding: Any, key: str) -> Any:
    shape = tuple(store.shape)
    like_shape = tuple(np.shape(like)) if not hasattr(like, "shape") else tuple(like.shape)
    if like is not None and like_shape != shape:
        raise ValueError(f"leaf {key}: saved shape {shape} does not match the target's shape {like_shape}.")
    dtype = np.dtype(like.dtype) if hasattr(like, "dtype") else None
    if isinstance(like, bool | int | float):
        return type(like)(store.read().result())
    if isinstance(like, np.ndarray | np.generic):
        return np.asarray(store.read().result(), dtype=dtype)
    if sharding is None:
        sharding = getattr(like, "sharding", None)
    if sharding is None or not isinstance(sharding, jax.sharding.Sharding):
        return jax.numpy.asarray(np.asarray(store.read().result(), dtype=dtype))

    def read(index: tuple[slice, ...] | None) -> np.ndarray:  # None: the whole array (jax's signature)
        return np.asarray((store if index is None else store[index]).read().result(), dtype=dtype)

    return jax.make_array_from_callback(shape, sharding, read)


def load_pytree(path: str | os.PathLike, like: Any = None, *, sharding: Any = None, prefix: str = "") -> Any:
    """Load a pytree saved by :func:`save_pytree`.

    Args:
        path: the folder (or kvstore URL) given to ``save_pytree``.
        like: a pytree with the target structure: arrays, ``jax.ShapeDtypeStruct`` (e.g. from
            ``eqx.filter_eval_shape``) or Python scalars. Leaves are matched by key path, checked for shape
            and cast to the target dtype. ``None`` returns a flat ``{key_path: numpy array}`` dict.
        sharding: a single ``jax.sharding.Sharding`` for every jax leaf, or a pytree of shardings (or
            ``None``) with ``like``'s structure; by default a ``ShapeDtypeStruct``/array leaf's own sharding.
            Each device reads only its own slice.
        prefix: prepended to ``like``'s key paths when looking them up (load a subtree, e.g. ``".model"``).

    Returns:
        A pytree like ``like`` (jax arrays where ``like`` has jax arrays / shape structs, numpy where it has
        numpy, Python scalars where it has scalars).
    """
    meta = read_pytree_metadata(path)
    base = _kvstore_spec(path)
    by_key = {e["key"]: e for e in meta["leaves"]}
    if like is None:
        return {k: np.asarray(_reader(base, e).read().result()) for k, e in by_key.items()}
    leaves, treedef = jax.tree_util.tree_flatten_with_path(like)
    shardings = _broadcast_shardings(sharding, like, len(leaves))
    out = []
    for (kp, leaf), shard in zip(leaves, shardings, strict=True):
        key = prefix + _key(kp)
        if key not in by_key:
            near = sorted(by_key)[:8]
            raise KeyError(
                f"leaf {key} is not in the pytree saved at {os.fspath(path)!r} (it has e.g. {near})."
            )
        out.append(_restore(_reader(base, by_key[key]), leaf, shard, key))
    return jax.tree_util.tree_unflatten(treedef, out)


_UNSET = object()  # stands for "no sharding" while flattening (None would vanish from the leaves)


def _broadcast_shardings(sharding: Any, like: Any, n: int) -> list[Any]:
    """One sharding (or None) per leaf of ``like``; ``sharding`` is one Sharding or a prefix tree of ``like``."""
    if sharding is None or isinstance(sharding, jax.sharding.Sharding):
        return [sharding] * n

    def is_spec(x: Any) -> bool:
        return x is None or isinstance(x, jax.sharding.Sharding)

    def expand(spec: Any, sub: Any) -> Any:
        return jax.tree_util.tree_map(lambda _: _UNSET if spec is None else spec, sub)

    try:
        expanded = jax.tree_util.tree_map(expand, sharding, like, is_leaf=is_spec)
    except ValueError as e:
        raise ValueError(f"the sharding pytree does not match the structure of `like`: {e}") from None
    flat = jax.tree_util.tree_leaves(
        expanded, is_leaf=lambda x: x is _UNSET or isinstance(x, jax.sharding.Sharding)
    )
    if len(flat) != n:
        raise ValueError(f"sharding pytree gives {len(flat)} shardings; `like` has {n} leaves.")
    return [None if s is _UNSET else s for s in flat]
