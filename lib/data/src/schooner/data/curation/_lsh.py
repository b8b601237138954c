"""LSH candidates and their connected components, vectorised (numpy), over the band keys of pass 1 of
fuzzy deduplication (`_fuzzy`): no per-document Python, no shuffle.

Documents are numbered globally in input order (shard by shard). For each band, a stable sort of the band
keys puts documents of one bucket next to each other; each is paired with the bucket's first (smallest)
document, a star that has the components of the bucket's full clique. Pairs of all bands are made unique,
then labelled by connected components (min-label hooking and pointer jumping).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from schooner.data import storage


def bucket_pairs(keys: np.ndarray) -> np.ndarray:
    """`int64 [m, 2]` pairs `(first document of a bucket, another document of it)` of one band's keys."""
    order = np.argsort(keys, kind="stable")
    s = keys[order]
    starts = np.empty(len(s), dtype=bool)
    starts[:1] = True
    np.not_equal(s[1:], s[:-1], out=starts[1:])
    later = np.flatnonzero(~starts)
    if not len(later):
        return np.empty((0, 2), dtype=np.int64)
    first_of_run = order[np.flatnonzero(starts)][np.cumsum(starts) - 1]
    return np.stack([first_of_run[later], order[later]], axis=1).astype(np.int64)


def _load_bands(path: str, bands: range) -> np.ndarray:
    if storage.is_local(path):
        arr = np.load(storage.local_path(path), mmap_mode="r")
    else:
        with storage.open_file(path, "rb") as f:
            arr = np.load(f)
    return np.asarray(arr[bands.start : bands.stop])


def candidate_pairs(
    band_files: Sequence[str], num_bands: int, num_docs: int, memory_budget: int = 1 << 30
) -> np.ndarray:
    """Unique candidate pairs `int64 [m, 2]` (a < b, global document numbers) from the band-key files of
    every shard (`uint64 [num_bands, n_shard]` each, in shard order; `num_docs` in all). Bands are read in
    groups whose keys fit `memory_budget` bytes (sorting one band needs about three times its keys)."""
    step = max(1, min(num_bands, memory_budget // max(1, 8 * num_docs) - 2))
    found: list[np.ndarray] = []
    for start in range(0, num_bands, step):
        group = range(start, min(num_bands, start + step))
        keys = np.concatenate([_load_bands(p, group) for p in band_files], axis=1)
        found.extend(bucket_pairs(keys[b]) for b in range(len(group)))
    if not found or not sum(len(f) for f in found):
        return np.empty((0, 2), dtype=np.int64)
    pairs = np.concatenate(found)
    lo, hi = np.minimum(pairs[:, 0], pairs[:, 1]), np.maximum(pairs[:, 0], pairs[:, 1])
    width = np.int64(max(int(hi.max()) + 1, 1))
    code = np.unique(lo * width + hi)
    return np.stack([code // width, code % width], axis=1)


def connected_components(n: int, pairs: np.ndarray) -> np.ndarray:
    """`int64 [n]`: each node's component label, the smallest node of its component."""
    labels = np.arange(n, dtype=np.int64)
    if not len(pairs):
        return labels
    a, b = pairs[:, 0], pairs[:, 1]
    while True:
        la, lb = labels[a], labels[b]
        if np.array_equal(la, lb):
            return labels
        lo = np.minimum(la, lb)
        # hook each root to the smallest root it is linked to, then jump pointers until every node
        # points at a root (labels only decrease, and always name a node of the same component)
        np.minimum.at(labels, la, lo)
        np.minimum.at(labels, lb, lo)
        while True:
            nxt = labels[labels]
            if np.array_equal(nxt, labels):
                break
            labels = nxt


def component_groups(labels: np.ndarray, pairs: np.ndarray) -> list[tuple[int, ...]]:
    """The components with at least two members, each as its members in ascending order."""
    if not len(pairs):
        return []
    nodes = np.unique(pairs)
    lab = labels[nodes]
    order = np.lexsort((nodes, lab))
    nodes, lab = nodes[order], lab[order]
    cuts = np.flatnonzero(lab[1:] != lab[:-1]) + 1
    return [tuple(g.tolist()) for g in np.split(nodes, cuts)]
