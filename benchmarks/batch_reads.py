"""Milliseconds to read one plain-text batch of a token cache, next to the old way measured in the same run.

The old way (kept here as the peer, in a few lines): one tensorstore read per row for its tokens and one
per row for the document offsets around it, then a Python loop over the rows for the segment ids. The new
way is `TokenSequences.batch`: one read for all the batch's windows (one per row for windows longer than
`schooner.tokenize._cache._INDEX_READ_MAX` tokens), one read per run of adjacent offset strides, and the
segment ids of all rows from one `searchsorted`. Both read the same random rows of a cache this script
builds (random tokens, documents of random lengths around `--doc-tokens`, about the shape of the Delphi
scaling suite's cache: 51M tokens, 5,300 per document) and must agree bit for bit. Each figure is the
best of `--repeat` interleaved rounds of `--batches` batches (a shared machine only ever slows a round).
Goal: new >= 2x faster at the suite's shape (B=64, T=64). A third line times the same batches of a
`TokenSequences(..., in_memory=True)` (what `MixtureDataset(in_memory_bytes=)` gives a cache that fits):
the cache's tokens and offsets held in memory, no reads at all.

Usage: uv run python benchmarks/batch_reads.py [--tokens 40e6] [--doc-tokens 5000] [--batch-size 64]
       [--seq-len 64] [--batches 200] [--repeat 5] [--out /tmp/bench]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time

import numpy as np

OLD_STRIDE = 256
"""Every this-many-th document offset, which the old reader held in memory (as the loader still does)."""


def old_batch(cache, sparse: np.ndarray, idx: np.ndarray, seq_len: int, stride: int = 256) -> dict:
    """The batch as read before: a read per row for its tokens, a read per row for its offsets."""
    starts = idx * seq_len
    reads = [cache._tok[int(s) : int(s) + seq_len].read() for s in starts]
    tokens = np.empty((idx.size, seq_len), dtype=np.int32)
    for i, f in enumerate(reads):
        tokens[i] = f.result()
    lo = (np.searchsorted(sparse, starts, side="right") - 1) * stride
    hi = np.minimum(np.searchsorted(sparse, starts + seq_len, side="left") * stride, cache.num_documents) + 1
    reads = [cache._off[int(a) : int(b)].read() for a, b in zip(lo, hi)]
    positions = np.arange(seq_len, dtype=np.int64)
    segs = np.empty((idx.size, seq_len), dtype=np.int32)
    for r, (s, f) in enumerate(zip(starts, reads)):
        offsets = np.asarray(f.result(), dtype=np.int64)
        inside = offsets[(offsets > s) & (offsets < s + seq_len)] - s
        segs[r] = np.searchsorted(inside, positions, side="right")
    return {"tokens": tokens, "loss_mask": np.ones_like(tokens), "segment_ids": segs}


def build(path: str, num_tokens: int, doc_tokens: int) -> None:
    from schooner.tokenize import train_bpe, write_cache

    tok = train_bpe(["def f(x):\n    return x + 1\n" * 50], vocab_size=300)
    rng = np.random.default_rng(0)
    lengths = np.maximum(
        1, rng.exponential(doc_tokens, size=2 * num_tokens // doc_tokens + 16).astype(np.int64)
    )
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), num_tokens)) + 1]
    docs = np.split(
        rng.integers(3, tok.vocab_size, int(lengths.sum()), dtype=np.int64), np.cumsum(lengths)[:-1]
    )
    write_cache(path, docs, tok, append_eos=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=float, default=40e6, help="tokens in the cache")
    p.add_argument("--doc-tokens", type=int, default=5000, help="mean tokens per document")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", default=None, help="work folder (default: a temporary one, removed)")
    args = p.parse_args()

    from schooner.tokenize import TokenCache, TokenSequences

    work = args.out or tempfile.mkdtemp(prefix="batch-reads-")
    try:
        path = f"{work}/cache"
        t = time.perf_counter()
        build(path, int(args.tokens), args.doc_tokens)
        cache = TokenCache.open(path)
        print(
            f"cache: {cache.num_tokens:,} tokens, {cache.num_documents:,} documents ({time.perf_counter() - t:.0f} s)"
        )
        seqs = TokenSequences(cache, args.seq_len)
        held = TokenSequences(cache, args.seq_len, in_memory=True)
        sparse = np.asarray(cache.offsets()[::OLD_STRIDE], dtype=np.int64)
        rng = np.random.default_rng(1)
        batches = [rng.integers(0, len(seqs), args.batch_size) for _ in range(args.batches)]
        for idx in batches[:20]:
            old = old_batch(cache, sparse, idx, args.seq_len)
            for name, new in (("new", seqs.batch(idx)), ("held", held.batch(idx))):
                for k in old:
                    if old[k].dtype != new[k].dtype or not np.array_equal(old[k], new[k]):
                        sys.exit(
                            f"the {name} batch differs from the old one in {k!r} for rows {idx[:8].tolist()}"
                        )

        ways = {
            "old": lambda idx: old_batch(cache, sparse, idx, args.seq_len),
            "new": seqs.batch,
            "held": held.batch,
        }
        best = dict.fromkeys(ways, float("inf"))
        for _ in range(args.repeat):
            for name, way in ways.items():
                t = time.perf_counter()
                for idx in batches:
                    way(idx)
                best[name] = min(best[name], (time.perf_counter() - t) / len(batches) * 1e3)
        shape = f"B={args.batch_size}, T={args.seq_len}"
        print(f"old: a read per row for tokens and offsets ({shape}): {best['old']:7.3f} ms per batch")
        print(f"new: TokenSequences.batch                   ({shape}): {best['new']:7.3f} ms per batch")
        print(f"held: TokenSequences(in_memory=True)        ({shape}): {best['held']:7.3f} ms per batch")
        print(
            f"old / new: {best['old'] / best['new']:.2f}x   (goal >= 2x at B=64, T=64); old / held: {best['old'] / best['held']:.1f}x"
        )
    finally:
        if args.out is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
