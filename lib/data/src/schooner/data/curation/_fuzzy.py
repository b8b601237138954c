"""Fuzzy deduplication: MinHash + LSH candidates, connected components, verification against the text.

Four passes, none of them a shuffle of per-band items:

1. Signatures (one task per source shard): the kernels (`_minhash`) normalise each text and compute its
   band keys in batches; the task writes two files to `work`: the shard's band keys (`uint64 [bands, n]`,
   one contiguous row per band) and an Arrow file of ids, normalised texts and ranks (`MinHashConfig.keep`).
2. Candidates (here, vectorised, `_lsh`): per band, documents sharing a key are linked (a stable sort,
   equal neighbours); the unique pairs become connected components. Only the band keys are in memory
   (8 bytes per band and document, a group of bands at a time when they do not fit `memory_budget`).
3. Verification (tasks over groups of components): best first (`MinHashConfig.keep`: the longest text by
   default, or the first, or the highest metadata score; ties in input order), each member is compared with
   the component's representatives so far by the exact Jaccard of its character n-gram set (from the
   normalised texts of pass 1); at `threshold` or above it is a duplicate of the most similar one, else it
   becomes a representative itself. LSH false positives are never removed.
4. Attributes (one task per shard, from the ids of pass 1: the source is not read again), co-partitioned
   with the source: `fuzzy_dup` (drop me), `fuzzy_cluster` (the id of the kept representative),
   `fuzzy_cluster_size` (documents in that cluster), `fuzzy_jaccard` (with it).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schooner.data import storage
from schooner.data._dataset import Dataset
from schooner.data._errors import SkipLog
from schooner.data._execute import Execution, Sink, Stats, Task, execute
from schooner.data._splits import Split

from ._lsh import candidate_pairs, component_groups, connected_components
from ._marks import CollectSink, MarkedIdsSplit, read_arrow
from ._minhash import MinHashConfig, jaccard, kernel_batch, ngram_codes, shingles, string_array

FUZZY_DEFAULTS = {"fuzzy_dup": False, "fuzzy_cluster": None, "fuzzy_cluster_size": 1, "fuzzy_jaccard": None}


@dataclass(frozen=True)
class SignatureSink(Sink):
    """Pass 1: the band keys (`.npy`) and ids + normalised texts (`.arrow`) of one source shard."""

    work: str
    config: MinHashConfig

    def consume(self, records: Iterator[dict], index: int, stats: Stats) -> dict:
        import pyarrow as pa

        tag = storage.unique_tag()
        text_path = storage.join(self.work, f"norm-{index:05d}-{tag}.arrow")
        bands: list[np.ndarray] = []
        schema = pa.schema([("id", pa.binary()), ("norm", pa.string()), ("rank", pa.float64()),
                            ("text_hash", pa.uint64())])  # fmt: skip
        n = nbytes = 0
        with storage.atomic_open(text_path) as f, pa.ipc.new_file(f, schema) as w:
            ids: list[str] = []
            texts: list[str] = []
            ranks: list[float] = []
            for rec in records:
                ids.append(rec["id"])
                texts.append(rec["text"])
                ranks.append(self.config.rank(rec))
                nbytes += len(rec["text"])
                if len(ids) >= self.config.batch_size:
                    bands.append(self._flush(ids, texts, ranks, w))
                    n += len(ids)
                    ids, texts, ranks = [], [], []
            if ids or not bands:
                bands.append(self._flush(ids, texts, ranks, w))
                n += len(ids)
        band_path = storage.join(self.work, f"bands-{index:05d}-{tag}.npy")
        with storage.atomic_open(band_path) as f:
            np.save(f, np.ascontiguousarray(np.concatenate(bands, axis=0).T))
        return {"records": n, "bytes": nbytes, "texts": text_path, "bands": band_path}

    def _flush(self, ids: list[str], texts: list[str], ranks: list[float], writer: Any) -> np.ndarray:
        norm, bands = kernel_batch(texts, self.config)
        import pyarrow as pa

        rank = np.asarray(ranks, dtype=np.float64)
        rank_array = pa.Array.from_buffers(
            pa.float64(), len(rank), [None, pa.py_buffer(rank)]
        )  # not pa.array: pandas
        hashes = np.frombuffer(b"".join(_text_hash(t) for t in texts), dtype=np.uint64)
        hash_array = pa.Array.from_buffers(pa.uint64(), len(hashes), [None, pa.py_buffer(hashes)])
        writer.write_batch(pa.RecordBatch.from_arrays(
            [string_array(ids, binary=True), norm, rank_array, hash_array], names=["id", "norm", "rank", "text_hash"]
        ))  # fmt: skip
        return bands


def _text_hash(text: str) -> bytes:
    """8 bytes of blake2b of a record's whole text: exact copies (what exact dedup groups) share it."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()


@dataclass(frozen=True)
class VerifySplit(Split):
    """Pass 3: verify some candidate components (each a tuple of global document indices, ascending)."""

    components: tuple[tuple[int, ...], ...]
    text_files: tuple[str, ...]
    offsets: tuple[int, ...]
    config: MinHashConfig
    index: int = 0
    reads_input = False

    @property
    def label(self) -> str:
        return f"verify[{self.index}]: {len(self.components)} components"

    def token(self) -> Any:
        return None

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        ids, texts, ranks, hashes = self._read_members()
        for members in self.components:
            # best first (`MinHashConfig.keep`), ties in input order: the first of a cluster is kept. Exact
            # copies of a text (all in one component: their band keys are equal) stand as their first copy
            # with the best rank among them, the copy exact dedup keeps, so the two never drop every copy
            best: dict[int, tuple[float, int]] = {}
            for g in members:
                r, first = best.get(hashes[g], (-np.inf, g))
                best[hashes[g]] = (max(r, ranks[g]), min(first, g))
            ordered = sorted(members, key=lambda g: (-best[hashes[g]][0], best[hashes[g]][1], g))
            yield from self._verify(ordered, ids, texts)

    def _read_members(self) -> tuple[dict[int, str], dict[int, str], dict[int, float], dict[int, int]]:
        import pyarrow as pa

        wanted = np.sort(np.fromiter((g for c in self.components for g in c), dtype=np.int64))
        files = np.searchsorted(np.asarray(self.offsets), wanted, side="right") - 1
        ids: dict[int, str] = {}
        texts: dict[int, str] = {}
        ranks: dict[int, float] = {}
        hashes: dict[int, int] = {}
        for f in np.unique(files):
            g = wanted[files == f]
            table = read_arrow(self.text_files[f])
            rows = np.ascontiguousarray(g - self.offsets[f], dtype=np.int64)
            rows = pa.Array.from_buffers(
                pa.int64(), len(rows), [None, pa.py_buffer(rows)]
            )  # not pa.array: pandas
            rank = table["rank"].take(rows).to_pylist()
            text_hash = table["text_hash"].take(rows).to_pylist()
            for k, i, t, r, h in zip(
                g.tolist(), table["id"].take(rows).to_pylist(), table["norm"].take(rows).to_pylist(), rank,
                text_hash,
            ):  # fmt: skip
                ids[k] = i.decode("utf-8", "surrogatepass")
                texts[k] = t
                ranks[k] = r
                hashes[k] = h
        return ids, texts, ranks, hashes

    def _verify(self, members: Sequence[int], ids: dict[int, str], texts: dict[int, str]) -> Iterator[dict]:
        if not self.config.verify:
            for k, g in enumerate(members):
                yield _mark(g, ids[members[0]], len(members), None, k > 0)
            return
        n = self.config.ngram
        codes = [c for g in members if (c := ngram_codes(texts[g], n)) is not None]
        sets: Sequence[set[str] | np.ndarray] = (
            codes if len(codes) == len(members) else [shingles(texts[g], n) for g in members]
        )
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
        for i, (r, sim) in enumerate(owner):
            yield _mark(members[i], ids[members[r]], sizes[r], sim, r != i)


def _mark(g: int, rep_id: str, size: int, j: float | None, dup: bool) -> dict:
    return {"g": g, "fuzzy_dup": dup, "fuzzy_cluster": rep_id, "fuzzy_cluster_size": size,
            "fuzzy_jaccard": None if j is None else round(j, 4)}  # fmt: skip


def fuzzy_dedup_attributes(
    source: str, output: str, config: MinHashConfig | None = None, *, work: str, memory_budget: int = 1 << 30,
    **execution: Any,
) -> dict[str, Any]:  # fmt: skip
    """Compute the fuzzy-duplicate attributes of `source` into attribute folder `output` (`work`: a folder
    for the intermediate files; `memory_budget`: bytes of band keys held at once here). Returns counters:
    documents, candidate pairs and components, verified duplicates, LSH false positives, clusters and
    their sizes, seconds per pass."""
    config = config or MinHashConfig()
    exe = Execution(**execution)
    storage.makedirs(work)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    splits = Dataset.from_files(source, split_row_groups=False)._splits()
    sink = SignatureSink(work, config)
    sig = execute([Task(i, s, (), sink) for i, s in enumerate(splits)], exe, "minhash")
    offsets = np.cumsum([0] + [r["records"] for r in sig]).tolist()
    t1 = time.perf_counter()
    seconds["signatures"] = t1 - t0

    pairs = candidate_pairs([r["bands"] for r in sig], config.num_bands, offsets[-1], memory_budget)
    labels = connected_components(offsets[-1], pairs)
    comps = component_groups(labels, pairs)
    t2 = time.perf_counter()
    seconds["candidates"] = t2 - t1

    marks: dict[int, dict] = {}
    if comps:
        groups = _balance(comps, max(1, len(splits)))
        texts = tuple(r["texts"] for r in sig)
        tasks = [Task(i, VerifySplit(g, texts, tuple(offsets), config, i), (), CollectSink())
                 for i, g in enumerate(groups)]  # fmt: skip
        for r in execute(tasks, exe, "verify"):
            for m in r["items"]:
                marks[m.pop("g")] = m
    t3 = time.perf_counter()
    seconds["verify"] = t3 - t2

    by_shard: list[dict[int, dict]] = [{} for _ in sig]
    for g, m in marks.items():
        f = int(np.searchsorted(offsets, g, side="right")) - 1
        by_shard[f][g - offsets[f]] = m
    attr_splits = [MarkedIdsSplit(r["texts"], tuple(sorted(by_shard[i].items())), tuple(FUZZY_DEFAULTS.items()), i)
                   for i, r in enumerate(sig)]  # fmt: skip
    manifest = Dataset(lambda: list(attr_splits), describe="fuzzy attributes").write_jsonl(
        output, **execution
    )
    seconds["attributes"] = time.perf_counter() - t3
    storage.remove_tree(work)

    dups = [m for m in marks.values() if m["fuzzy_dup"]]
    sizes = sorted((m["fuzzy_cluster_size"] for m in marks.values() if not m["fuzzy_dup"] and m["fuzzy_cluster_size"] > 1), reverse=True)  # fmt: skip
    return {
        "documents": manifest["records"],
        "candidate_pairs": len(pairs),
        "candidate_components": len(comps),
        "candidate_documents": len(marks),
        "duplicates": len(dups),
        "clusters": len({m["fuzzy_cluster"] for m in dups}),
        "largest_clusters": sizes[:10],
        "unverified_candidates": sum(1 for m in marks.values() if not m["fuzzy_dup"] and m["fuzzy_cluster_size"] == 1),
        "lsh_threshold": round(config.lsh_threshold, 4),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "counters": manifest["counters"],
    }  # fmt: skip


def _balance(comps: list[tuple[int, ...]], k: int) -> list[tuple[tuple[int, ...], ...]]:
    """Components in `k` groups of about equal member counts (largest first, each to the lightest group)."""
    groups: list[list[tuple[int, ...]]] = [[] for _ in range(min(k, len(comps)))]
    load = [0] * len(groups)
    for c in sorted(comps, key=len, reverse=True):
        i = load.index(min(load))
        groups[i].append(c)
        load[i] += len(c)
    return [tuple(sorted(g)) for g in groups]
