"""Fuzzy deduplication's parts against independent references: LSH candidates against a brute-force bucket
table, connected components against a breadth-first search, packed n-gram Jaccard against Python sets,
and the whole operator (several shards, worker processes) against planted near duplicates whose similarity
a plain-Python reference computes."""

from __future__ import annotations

import random
import string
from collections import deque
from itertools import combinations

import numpy as np
import pytest

pytest.importorskip("dupekit")

from schooner.data import Dataset, list_shards, read_shards
from schooner.data.curation import MinHashConfig, fuzzy_dedup_attributes, iter_attributes
from schooner.data.curation._lsh import bucket_pairs, candidate_pairs, component_groups, connected_components
from schooner.data.curation._minhash import jaccard, ngram_codes, shingles

_PUNCT = str.maketrans("", "", string.punctuation)


def _ref_grams(text: str, n: int = 5) -> set[str]:
    t = " ".join(text.lower().translate(_PUNCT).split())
    return {t[i : i + n] for i in range(len(t) - n + 1)} if len(t) > n else ({t} if t else set())


def _ref_jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def _bfs_components(n: int, edges) -> list[int]:
    """Each node's label: the smallest node of its component (breadth-first search)."""
    adj: list[list[int]] = [[] for _ in range(n)]
    for a, b in edges:
        adj[a].append(b)
        adj[b].append(a)
    label = [-1] * n
    for s in range(n):
        if label[s] >= 0:
            continue
        label[s] = s
        q = deque([s])
        while q:
            x = q.popleft()
            for y in adj[x]:
                if label[y] < 0:
                    label[y] = s
                    q.append(y)
    return label


@pytest.mark.parametrize("seed", range(6))
def test_lsh_candidates_and_components_match_a_brute_force_bucket_table(seed, tmp_path):
    rng = np.random.default_rng(seed)
    n, bands = int(rng.integers(1, 300)), 5
    keys = rng.integers(0, int(rng.integers(2, 400)), size=(n, bands)).astype(np.uint64)
    # every pair sharing a key in some band, the clique of each bucket
    clique = {(a, b) for a, b in combinations(range(n), 2) if (keys[a] == keys[b]).any()}
    files, start = [], 0
    for k, size in enumerate(np.array_split(np.arange(n), 3)):
        path = tmp_path / f"bands-{k}.npy"
        np.save(path, np.ascontiguousarray(keys[size].T))
        files.append(str(path))
        start += len(size)
    for budget in (1 << 30, 1):  # all bands at once, and one band at a time
        pairs = candidate_pairs(files, bands, n, budget)
        got = {tuple(p) for p in pairs.tolist()}
        assert got <= clique and all(a < b for a, b in got)
        assert len(got) == len(pairs)  # unique
        labels = connected_components(n, pairs)
        assert labels.tolist() == _bfs_components(n, clique)
    groups = component_groups(labels, pairs)
    assert sorted(g for g in groups) == sorted(
        tuple(x for x in range(n) if labels[x] == r) for r in set(labels.tolist()) if (labels == r).sum() > 1
    )


def test_bucket_pairs_link_each_member_to_the_first_of_its_bucket():
    keys = np.array([7, 3, 7, 9, 3, 7], dtype=np.uint64)
    assert sorted(map(tuple, bucket_pairs(keys).tolist())) == [(0, 2), (0, 5), (1, 4)]
    assert bucket_pairs(np.array([1, 2, 3], dtype=np.uint64)).shape == (0, 2)


@pytest.mark.parametrize("seed", range(4))
def test_components_of_long_chains_and_random_graphs(seed):
    rng = random.Random(seed)
    n = 500
    edges = [(i, i + 1) for i in range(0, 200)]  # a long path, then random edges
    edges += [tuple(sorted(rng.sample(range(n), 2))) for _ in range(rng.randrange(0, 400))]
    rng.shuffle(edges)
    labels = connected_components(n, np.array(edges, dtype=np.int64))
    assert labels.tolist() == _bfs_components(n, edges)


def test_packed_ngram_jaccard_equals_the_jaccard_of_string_sets():
    rng = random.Random(0)
    for _ in range(3000):
        n = rng.choice([1, 2, 5, 7])
        alphabet = rng.choice(["ab c", "abc déf", "xyzß ü"])
        a = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        b = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        ca, cb = ngram_codes(a, n), ngram_codes(b, n)
        sa, sb = shingles(a, n), shingles(b, n)
        assert len(ca) == len(sa) and len(cb) == len(sb)
        assert jaccard(ca, cb) == _ref_jaccard(sa, sb)
    assert ngram_codes("漢字のテキスト", 5) is None  # code points beyond 12 bits: the caller uses sets
    with pytest.raises(TypeError, match="two sets of shingles or two arrays of n-gram codes"):
        jaccard(ngram_codes("abcdef", 2), shingles("abcdef", 2))


def _near(text: str, rng: random.Random, edits: int) -> str:
    ws = text.split(" ")
    for _ in range(edits):
        ws[rng.randrange(len(ws))] = rng.choice(["alpha", "beta", "gamma"])
    return " ".join(ws)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Python's docs cut into ~600-character documents, a near copy of every fourth one (reference 5-gram
    Jaccard >= 0.85), and a loose copy of every ninth (reference Jaccard well under 0.8), in 5 shards (one
    empty)."""
    from schooner.data.sources import iter_source

    rng = random.Random(3)
    base: list[str] = []
    for r in iter_source("python-docs"):
        t = r["text"]
        base += [t[i : i + 600] for i in range(0, len(t) - 600, 600)]
        if len(base) >= 400:
            break
    docs = [{"id": f"b{i}", "text": t, "source": "t", "metadata": {}} for i, t in enumerate(base)]
    near, loose = set(), set()
    for i, t in enumerate(base):
        if i % 4 == 0:
            c = _near(t, rng, 2)
            if _ref_jaccard(_ref_grams(c), _ref_grams(t)) >= 0.85:
                docs.append({"id": f"n{i}", "text": c, "source": "t", "metadata": {}})
                near.add((f"b{i}", f"n{i}"))
        elif i % 9 == 0:
            c = _near(t, rng, 14)
            if _ref_jaccard(_ref_grams(c), _ref_grams(t)) < 0.7:
                docs.append({"id": f"l{i}", "text": c, "source": "t", "metadata": {}})
                loose.add((f"b{i}", f"l{i}"))
    rng.shuffle(docs)
    folder = str(tmp_path_factory.mktemp("fuzzy") / "src")
    # 5 contiguous shards, the last made only of placeholders that the filter drops: an empty shard
    pad = [{"id": f"x{i}", "text": "x", "source": "t", "metadata": {}} for i in range(len(docs) // 4 + 5)]
    Dataset.from_records(docs + pad, num_shards=5).filter(_not_placeholder).write_jsonl(
        folder, progress=False
    )
    assert [sum(1 for _ in read_shards(p)) for p in list_shards(folder)][-1] == 0
    return {"docs": docs, "folder": folder, "near": near, "loose": loose}


def _not_placeholder(rec: dict) -> bool:
    return not rec["id"].startswith("x")


def _clusters(folder: str, out: str) -> dict[str, dict]:
    return {r["id"]: a for r, a in zip(read_shards(folder), iter_attributes(out))}


def test_fuzzy_dedup_finds_planted_near_duplicates_and_keeps_false_candidates(corpus, tmp_path):
    docs = {d["id"]: d["text"] for d in corpus["docs"]}
    # 2 rows per band: pairs far below 0.8 become LSH candidates, which verification must keep
    cfg = MinHashConfig(num_perms=40, num_bands=20)
    out = str(tmp_path / "out")
    stats = fuzzy_dedup_attributes(
        corpus["folder"], out, cfg, work=str(tmp_path / "w"), max_workers=2, progress=False
    )
    attrs = _clusters(corpus["folder"], out)
    assert stats["documents"] == len(docs) == len(attrs)
    removed = {i: a["fuzzy_cluster"] for i, a in attrs.items() if a["fuzzy_dup"]}
    # recall: at most one document of each planted pair is kept
    found = sum(a in removed or b in removed for a, b in corpus["near"])
    assert found == len(corpus["near"])
    # precision: every removed document is >= 0.8 similar (reference) to the one it is attributed to
    for i, rep in removed.items():
        assert _ref_jaccard(_ref_grams(docs[i]), _ref_grams(docs[rep])) >= 0.8, (i, rep)
        assert not attrs[rep]["fuzzy_dup"]
    # the loose copies were candidates (at this setting), never removed as duplicates of their original
    assert stats["unverified_candidates"] > 0
    assert not [p for p in corpus["loose"] if removed.get(p[1]) == p[0] or removed.get(p[0]) == p[1]]
    # cluster sizes count the representative and its duplicates
    sizes: dict[str, int] = {}
    for rep in removed.values():
        sizes[rep] = sizes.get(rep, 1) + 1
    assert all(attrs[rep]["fuzzy_cluster_size"] == k for rep, k in sizes.items())
    # without verification every candidate of a component but the first is removed, loose copies too
    out2 = str(tmp_path / "out2")
    fuzzy_dedup_attributes(corpus["folder"], out2, MinHashConfig(num_perms=40, num_bands=20, verify=False),
                           work=str(tmp_path / "w2"), client="inline", progress=False)  # fmt: skip
    unverified = {i for i, a in _clusters(corpus["folder"], out2).items() if a["fuzzy_dup"]}
    assert set(removed) < unverified
    assert any(b in unverified or a in unverified for a, b in corpus["loose"])


def test_fuzzy_dedup_at_marins_parameters_on_several_shards(corpus, tmp_path):
    docs = {d["id"]: d["text"] for d in corpus["docs"]}
    out = str(tmp_path / "out")
    stats = fuzzy_dedup_attributes(
        corpus["folder"], out, work=str(tmp_path / "w"), max_workers=2, progress=False
    )
    attrs = _clusters(corpus["folder"], out)
    removed = {i: a["fuzzy_cluster"] for i, a in attrs.items() if a["fuzzy_dup"]}
    assert sum(a in removed or b in removed for a, b in corpus["near"]) >= 0.95 * len(corpus["near"])
    assert all(_ref_jaccard(_ref_grams(docs[i]), _ref_grams(docs[r])) >= 0.8 for i, r in removed.items())
    assert stats["duplicates"] == len(removed)
    assert not (tmp_path / "w").exists()  # intermediate files removed
    # the attribute folder pairs with the source shard by shard, the empty shard included
    assert len(list_shards(out)) == len(list_shards(corpus["folder"])) == 5


def test_arrow_arrays_for_the_kernels_keep_ids_exactly():
    from schooner.data.curation._minhash import string_array

    texts = ["plain", "", "ünïcödé ✓", "lone \ud800 surrogate"]
    assert [b.decode("utf-8", "surrogatepass") for b in string_array(texts, binary=True).to_pylist()] == texts
    assert string_array(texts).to_pylist() == ["plain", "", "ünïcödé ✓", "lone ? surrogate"]


# ------------------------------------------------------------------ which member of a cluster survives


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """12 planted clusters among 60 unique documents (Python's docs, ~600 characters each), the members of
    each cluster in input order: a truncated copy, the original, a chrome-padded copy (the longest, last);
    3 more clusters whose two longest members tie (two one-word edits of the original, same length) after a
    truncated copy. Every cluster is a clique at reference 5-gram Jaccard >= 0.8; `score` is a metadata
    number, highest on the truncated copy. The same records are written as 1 shard and as 4 shards."""
    from schooner.data.sources import iter_source

    base: list[str] = []
    for r in iter_source("python-docs"):
        t = r["text"]
        # pieces of varied text (repetitive pieces have few distinct 5-grams: a cut changes them a lot)
        base += [p for i in range(0, len(t) - 600, 600) if len(_ref_grams(p := t[i : i + 600])) >= 450]
        if len(base) >= 80:
            break
    rng = random.Random(29)
    docs: list[dict] = []
    clusters: list[list[str]] = []

    def add(i: str, text: str, score: float) -> None:
        docs.append({"id": i, "text": text, "source": "t", "metadata": {"score": score}})

    for k in range(15):
        t = base[k]
        members = [(f"c{k}-trunc", t[:570], 0.9)]
        if k < 12:
            members += [(f"c{k}-orig", t, 0.5), (f"c{k}-padded", "Menu | Docs\n" + t + "\nTerms", 0.1)]
        else:  # a tie: one word swapped for another of the same length, twice
            ws = t.split(" ")
            j = next(j for j in range(len(ws) // 2, len(ws)) if len(ws[j]) == 4 and ws[j].isalpha())
            members += [
                (f"c{k}-tie{n}", " ".join([*ws[:j], w, *ws[j + 1 :]]), 0.2)
                for n, w in enumerate(("abcd", "wxyz"))
            ]
        grams = [_ref_grams(text) for _, text, _ in members]
        assert all(_ref_jaccard(a, b) >= 0.8 for a, b in combinations(grams, 2)), k
        clusters.append([m[0] for m in members])
        for m in members:
            add(*m)
    for k in range(15, 75):
        add(f"u{k}", base[k], rng.random() / 2)
    # shuffle, then put each cluster's members back in their order at the positions they took
    rng.shuffle(docs)
    pos = {d["id"]: p for p, d in enumerate(docs)}
    by_id = {d["id"]: d for d in docs}
    for members in clusters:
        for p, i in zip(sorted(pos[m] for m in members), members):
            docs[p] = by_id[i]
    folders = {}
    for shards in (1, 4):
        folders[shards] = str(tmp_path_factory.mktemp("planted") / f"src{shards}")
        Dataset.from_records(docs, num_shards=shards).write_jsonl(folders[shards], progress=False)
    return {"docs": docs, "clusters": clusters, "folders": folders}


def _survivors(folder: str, out: str) -> tuple[dict[str, dict], dict[str, list[str]]]:
    attrs = _clusters(folder, out)
    groups: dict[str, list[str]] = {}
    for i, a in attrs.items():
        if a["fuzzy_cluster"] is not None:
            groups.setdefault(a["fuzzy_cluster"], []).append(i)
    return attrs, {k: v for k, v in groups.items() if len(v) > 1}


def _datasketch_clusters(docs: list[dict]) -> list[set[str]]:
    """Clusters by datasketch's MinHashLSH (Marin's 26 bands x 11 rows) over the reference 5-grams, each
    candidate pair verified by the reference Jaccard >= 0.8, joined into connected components."""
    pytest.importorskip("datasketch")
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(num_perm=286, params=(26, 11))
    grams = {d["id"]: _ref_grams(d["text"]) for d in docs}
    for i, g in grams.items():
        m = MinHash(num_perm=286, seed=1)
        m.update_batch([s.encode() for s in g])
        lsh.insert(i, m)
        grams[i] = g
    index = {d["id"]: k for k, d in enumerate(docs)}
    edges = set()
    for i, g in grams.items():
        m = MinHash(num_perm=286, seed=1)
        m.update_batch([s.encode() for s in g])
        for j in lsh.query(m):
            if j != i and _ref_jaccard(g, grams[j]) >= 0.8:
                edges.add(tuple(sorted((index[i], index[j]))))
    labels = _bfs_components(len(docs), edges)
    out: dict[int, set[str]] = {}
    for k, lab in enumerate(labels):
        out.setdefault(lab, set()).add(docs[k]["id"])
    return [c for c in out.values() if len(c) > 1]


@pytest.mark.parametrize("keep", [None, "longest", "first", "metadata.score"])
def test_fuzzy_dedup_keeps_the_longest_or_best_scored_member_whatever_the_shards(planted, keep, tmp_path):
    docs = {d["id"]: d for d in planted["docs"]}
    order = {d["id"]: k for k, d in enumerate(planted["docs"])}
    cfg = MinHashConfig() if keep is None else MinHashConfig(keep=keep)
    rank = {
        None: lambda i: len(docs[i]["text"]),
        "longest": lambda i: len(docs[i]["text"]),
        "first": lambda i: 0,
        "metadata.score": lambda i: docs[i]["metadata"]["score"],
    }[keep]
    got = {}
    for shards, folder in planted["folders"].items():
        out = str(tmp_path / f"out{shards}")
        fuzzy_dedup_attributes(
            folder, out, cfg, work=str(tmp_path / f"w{shards}"), max_workers=2, progress=False
        )
        attrs, groups = _survivors(folder, out)
        got[shards] = attrs
        assert sorted(map(sorted, groups.values())) == sorted(map(sorted, planted["clusters"]))
        for members in planted["clusters"]:
            # the highest rank, ties broken by input order
            want = max(members, key=lambda i: (rank(i), -order[i]))
            kept = [i for i in members if not attrs[i]["fuzzy_dup"]]
            assert kept == [want], (members, kept)
            assert all(attrs[i]["fuzzy_cluster"] == want for i in members)
            assert attrs[want]["fuzzy_cluster_size"] == len(members)
    assert got[1] == got[4]  # the same attributes whatever the shard count
    if keep is None:
        assert {frozenset(c) for c in _datasketch_clusters(planted["docs"])} == {
            frozenset(c) for c in planted["clusters"]
        }
        assert [i for i in order if i.endswith("-padded") and got[1][i]["fuzzy_dup"]] == []


def test_fuzzy_dedup_keep_names_a_missing_or_bad_score_field(planted, tmp_path):
    with pytest.raises(ValueError, match=r"keep='best'.*'longest', 'first' or 'metadata.<field>'"):
        MinHashConfig(keep="best")
    docs = [dict(d, metadata={}) if k == 7 else d for k, d in enumerate(planted["docs"])]
    folder = str(tmp_path / "src")
    Dataset.from_records(docs, num_shards=2).write_jsonl(folder, progress=False)
    bad = docs[7]["id"]
    with pytest.raises(
        ValueError, match=rf"record {bad!r} has no number in metadata field 'score' \(got None\)"
    ):
        fuzzy_dedup_attributes(folder, str(tmp_path / "out"), MinHashConfig(keep="metadata.score"),
                               work=str(tmp_path / "w"), client="inline", progress=False)  # fmt: skip


def test_fuzzy_keep_metadata_next_to_exact_dedup_leaves_one_copy(tmp_path):
    """Exact copies of a page crawled on different dates, `keep="metadata.date"`: fuzzy dedup kept the newest
    copy and exact dedup (which keeps the first copy of a text) dropped it, so `consolidate` with both
    filters left no copy at all. Among exact copies the first now stands for them all (with the best score
    among them), as in exact dedup, so exactly one copy of the text is kept, and a better-scored near copy
    still wins over them."""
    import random

    from schooner.data import write_records
    from schooner.data.curation import exact_dedup_attributes, iter_attributes, not_dup
    from schooner.data.curation._attributes import with_attributes
    from schooner.data.curation._consolidate import Consolidator

    rng = random.Random(1)
    a = " ".join("".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(200))
    b = " ".join("".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(200))
    b_near = b + " garden"  # a near copy of b, scored higher than both copies of b
    recs = [
        ("a-2019", a, 2019),
        ("b-2019", b, 2019),
        ("a-2024", a, 2024),
        ("b-2024", b, 2024),
        ("b-near", b_near, 2030),
    ]
    write_records([{"id": i, "text": t, "source": "s", "metadata": {"date": d}} for i, t, d in recs],
                  str(tmp_path / "src"), num_shards=2)  # fmt: skip
    fuzzy_dedup_attributes(str(tmp_path / "src"), str(tmp_path / "fz"), MinHashConfig(keep="metadata.date"),
                           work=str(tmp_path / "w1"), client="inline", progress=False)  # fmt: skip
    exact_dedup_attributes(
        str(tmp_path / "src"), str(tmp_path / "ex"), work=str(tmp_path / "w2"), progress=False
    )
    fz = {i: a for (i, _, _), a in zip(recs, iter_attributes(str(tmp_path / "fz")))}
    assert fz["a-2019"]["fuzzy_dup"] is False and fz["a-2024"]["fuzzy_cluster"] == "a-2019"
    assert fz["b-near"]["fuzzy_dup"] is False and fz["b-2019"]["fuzzy_cluster"] == "b-near"
    c = Consolidator((not_dup("exact"), not_dup("fuzzy")), (), fix_text=False, normalize_whitespace=False)
    counters: dict = {}
    kept = []
    for rec in with_attributes(
        str(tmp_path / "src"), [str(tmp_path / "ex"), str(tmp_path / "fz")]
    ).iter_records(client="inline", progress=False):
        kept.extend(c([rec], counters))
    assert sorted(r["id"] for r in kept) == ["a-2019", "b-near"]
