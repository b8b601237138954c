"""Fuzzy deduplication on the disk shuffle: MinHash + LSH candidates, connected components, verification.

1. Map: every document's 26 band buckets (`_minhash`), as small items `{"k": band:bucket, "l": place}`.
2. Shuffle by bucket (`Dataset.group_by`): a bucket holding several documents gives candidate edges.
3. Connected components of the candidate graph (union-find; the graph holds only candidate documents).
4. Verification (second shuffle, by component): in input order, each member is compared with the
   component's representatives so far by the exact Jaccard of its 5-gram set; at `threshold` or above it
   is a duplicate of the most similar one, else it becomes a representative itself. LSH false positives
   are never removed.
5. Attributes, co-partitioned with the source: `fuzzy_dup` (drop me), `fuzzy_cluster` (the id of the
   kept representative), `fuzzy_cluster_size` (documents in that cluster), `fuzzy_jaccard` (with it).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from schooner.data import storage
from schooner.data._dataset import Dataset

from ._marks import UnionFind, loc_key, write_marks_as_attributes
from ._minhash import MinHashConfig, jaccard, normalize_texts, shingles, signatures_and_buckets

FUZZY_DEFAULTS = {"fuzzy_dup": False, "fuzzy_cluster": None, "fuzzy_cluster_size": 1, "fuzzy_jaccard": None}


@dataclass(frozen=True)
class BandItems:
    """Map side: `{"k": "band:bucket", "l": [file, record]}` for every band of every document."""

    config: MinHashConfig

    @property
    def __name__(self) -> str:
        return "minhash_bands"

    def __call__(self, records: Iterator[dict], counters: dict[str, int]) -> Iterator[dict]:
        batch: list[dict] = []
        for rec in records:
            batch.append(rec)
            if len(batch) >= self.config.batch_size:
                yield from self._flush(batch, counters)
                batch = []
        if batch:
            yield from self._flush(batch, counters)

    def _flush(self, batch: list[dict], counters: dict[str, int]) -> Iterator[dict]:
        _, buckets = signatures_and_buckets([r["text"] for r in batch], self.config)
        counters["fuzzy.documents"] = counters.get("fuzzy.documents", 0) + len(batch)
        for rec, row in zip(batch, buckets.tolist()):
            loc = rec["_loc"]
            for band, b in enumerate(row):
                yield {"k": f"{band}:{b}", "l": loc}


def bucket_edges(key: Any, items: list[dict]) -> list[dict]:
    """Reduce side: a bucket of several documents links each to the first (a star: same components)."""
    if len(items) < 2:
        return []
    first = items[0]["l"]
    return [{"a": first, "b": it["l"]} for it in items[1:] if it["l"] != first]


@functools.lru_cache(maxsize=4)
def _candidates(path: str) -> dict[str, str]:
    with storage.open_file(path, "rb") as f:
        return orjson.loads(f.read())


@dataclass(frozen=True)
class InCandidates:
    path: str

    @property
    def __name__(self) -> str:
        return "in_candidates"

    def __call__(self, rec: dict) -> bool:
        return loc_key(rec["_loc"]) in _candidates(self.path)


@dataclass(frozen=True)
class ToMember:
    path: str
    max_chars: int

    @property
    def __name__(self) -> str:
        return "to_member"

    def __call__(self, rec: dict) -> dict:
        return {"c": _candidates(self.path)[loc_key(rec["_loc"])], "l": rec["_loc"], "id": rec["id"],
                "t": rec["text"][: self.max_chars]}  # fmt: skip


@dataclass(frozen=True)
class Verify:
    """Reduce side of the verification: one candidate component, members in input order."""

    config: MinHashConfig

    @property
    def __name__(self) -> str:
        return "verify"

    def __call__(self, key: Any, members: list[dict]) -> list[dict]:
        members = sorted(members, key=lambda m: m["l"])
        if not self.config.verify:
            rep = members[0]
            return [_mark(m, rep, len(members), None, m is not rep) for m in members]
        sets = [
            shingles(t, self.config.ngram)
            for t in normalize_texts([m["t"] for m in members], self.config.max_chars)
        ]
        reps: list[int] = []
        owner: list[tuple[int, float | None]] = []
        for i in range(len(members)):
            best, best_j = -1, 0.0
            for r in reps:
                j = jaccard(sets[i], sets[r])
                if j > best_j:
                    best, best_j = r, j
            if best >= 0 and best_j >= self.config.threshold:
                owner.append((best, best_j))
            else:
                reps.append(i)
                owner.append((i, None))
        sizes: dict[int, int] = {}
        for r, _ in owner:
            sizes[r] = sizes.get(r, 0) + 1
        return [
            _mark(m, members[r], sizes[r], j, r != i) for i, (m, (r, j)) in enumerate(zip(members, owner))
        ]


def _mark(m: dict, rep: dict, size: int, j: float | None, dup: bool) -> dict:
    return {"l": m["l"], "fuzzy_dup": dup, "fuzzy_cluster": rep["id"], "fuzzy_cluster_size": size,
            "fuzzy_jaccard": None if j is None else round(j, 4)}  # fmt: skip


def fuzzy_dedup_attributes(
    source: str, output: str, config: MinHashConfig | None = None, *, work: str, **execution: Any
) -> dict[str, Any]:
    """Compute the fuzzy-duplicate attributes of `source` into attribute folder `output` (`work`: a folder
    for the intermediate files). Returns counters: documents, candidate pairs and components, verified
    duplicates, LSH false positives, clusters and their sizes."""
    config = config or MinHashConfig()
    storage.makedirs(work)
    base = Dataset.from_files(source, split_row_groups=False, locate=True)
    bands = base.map_shard(BandItems(config), with_counters=True, name="minhash").group_by(
        "k", bucket_edges, name="lsh_buckets"
    )
    uf = UnionFind()
    n_edges = 0
    for e in bands.iter_records(**execution):
        uf.union(tuple(e["a"]), tuple(e["b"]))
        n_edges += 1
    comps = {r: m for r, m in uf.components().items() if len(m) > 1}
    cand = {loc_key(list(x)): loc_key(list(min(m))) for m in comps.values() for x in m}
    path = storage.join(work, "candidates.json")
    storage.write_bytes(path, orjson.dumps(cand, option=orjson.OPT_SORT_KEYS))
    marks: dict[str, dict] = {}
    if cand:
        verified = (
            base.filter(InCandidates(path), reason="not_candidate")
            .map(ToMember(path, config.max_chars))
            .group_by("c", Verify(config), name="verify")
        )
        for m in verified.iter_records(**execution):
            marks[loc_key(m.pop("l"))] = m
    manifest = write_marks_as_attributes(
        source, output, marks, FUZZY_DEFAULTS, name="fuzzy", work=work, **execution
    )
    dups = sum(1 for m in marks.values() if m["fuzzy_dup"])
    clusters = {m["fuzzy_cluster"] for m in marks.values() if m["fuzzy_dup"]}
    sizes = sorted((m["fuzzy_cluster_size"] for m in marks.values() if not m["fuzzy_dup"] and m["fuzzy_cluster_size"] > 1), reverse=True)  # fmt: skip
    candidates_dropped_by_verification = sum(
        1 for m in marks.values() if not m["fuzzy_dup"] and m["fuzzy_cluster_size"] == 1
    )
    return {
        "documents": manifest["records"],
        "candidate_pairs": n_edges,
        "candidate_components": len(comps),
        "candidate_documents": len(cand),
        "duplicates": dups,
        "clusters": len(clusters),
        "largest_clusters": sizes[:10],
        "unverified_candidates": candidates_dropped_by_verification,
        "lsh_threshold": round(config.lsh_threshold, 4),
        "counters": manifest["counters"],
    }
