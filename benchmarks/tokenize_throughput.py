"""Token cache and loader throughput, each next to its peer measured in the same run.

1. Cache build (records -> `train/`+`validation/` tensorstore caches, end to end on a 2-worker
   LocalClient: read .jsonl.zst shards, encode, split, write parts, merge) in tokens/s, next to bare
   `tokenizers` `encode_batch` on the same texts in this process (Rayon, all cores). Wall-clock ratios
   depend on how busy the machine is; tokens per CPU-second do not. Target: >= 0.9x per CPU-second.
2. `DataLoader` batches/s (MixtureDataset over two caches, prefetch threads, device placement) for the
   tutorial's training shape, next to the training steps/s that shape allows (a jitted fwd+bwd+Adam step
   of `llama_nano`). Target: >= 20x.

Usage: uv run python benchmarks/tokenize_throughput.py [--mb 100] [--workers 2] [--out /tmp/bench]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import shutil
import tempfile
import time


def _cpu(children: bool = False) -> float:
    """CPU seconds (user + system) of this process, plus its reaped children when asked."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    total = r.ru_utime + r.ru_stime
    if children:
        rc = resource.getrusage(resource.RUSAGE_CHILDREN)
        total += rc.ru_utime + rc.ru_stime
    return total


def corpus(target_bytes: int) -> list[dict]:
    """python-docs + python-code records, repeated (with fresh ids) until `target_bytes` of text."""
    from schooner.data import make_record
    from schooner.data.sources import iter_source

    base = [r for name in ("python-docs", "python-code") for r in iter_source(name)]
    out, size, rep = [], 0, 0
    while size < target_bytes:
        for r in base:
            out.append(make_record(r["text"], source=r["source"], id=f"{r['id']}-rep{rep}"))
            size += len(r["text"].encode("utf-8"))
            if size >= target_bytes:
                break
        rep += 1
    return out


def bench_build(args: argparse.Namespace, work: str) -> tuple[str, object]:
    from schooner.cluster import LocalClient
    from schooner.data import write_records
    from schooner.tokenize import TokenCache, build_cache, train_bpe

    records = corpus(int(args.mb * 1e6))
    n_bytes = sum(len(r["text"].encode("utf-8")) for r in records)
    src = os.path.join(work, "records")
    write_records(records, src, format="jsonl.zst", num_shards=args.shards)
    texts = [r["text"] for r in records]
    tok = train_bpe(texts[:1200], vocab_size=4096)
    print(
        f"corpus: {len(records)} documents, {n_bytes / 1e6:.1f} MB of text, {args.shards} shards; vocab 4096"
    )

    # Bare encoder: the same texts, this process, encode_batch over all cores (Rayon), ids materialised.
    t, c = time.perf_counter(), _cpu()
    n_bare = 0
    for i in range(0, len(texts), 512):
        batch = tok.hf.encode_batch_fast(texts[i : i + 512], add_special_tokens=False)
        n_bare += sum(len(e.ids) for e in batch)
    bare_s, bare_cpu = time.perf_counter() - t, _cpu() - c
    del texts, records

    out = os.path.join(work, "cache")
    client = LocalClient(max_workers=args.workers)
    t, c = time.perf_counter(), _cpu(children=True)
    try:
        summary = build_cache(src, out, tok, validation_fraction=0.01, client=client)
        build_s = time.perf_counter() - t
    finally:
        client.shutdown()  # waits for the workers, so their CPU time lands in RUSAGE_CHILDREN
    build_cpu = _cpu(children=True) - c
    n_built = summary["train_tokens"] + summary["validation_tokens"]
    n_docs = summary["train_documents"] + summary["validation_documents"]
    # the cache holds exactly the encoder's ids plus one EOS per document
    assert n_built == n_bare + n_docs, (n_built, n_bare, n_docs)
    bare_tps, build_tps = n_bare / bare_s, n_bare / build_s
    print(
        f"bare tokenizers encode_batch : {bare_tps / 1e6:7.3f} M tokens/s  ({n_bare} tokens in {bare_s:.1f} s)"
    )
    print(
        f"cache build, end to end      : {build_tps / 1e6:7.3f} M tokens/s  ({build_s:.1f} s, {args.workers} workers)"
    )
    print(f"build / bare ratio (wall)    : {build_tps / bare_tps:7.2f}x")
    # CPU seconds per token do not depend on how busy the machine is; wall-clock ratios do.
    print(
        f"tokens per CPU-second        : bare {n_bare / bare_cpu / 1e6:.3f} M, build {n_bare / build_cpu / 1e6:.3f} M "
        f"(build / bare {bare_cpu / build_cpu:.2f}x, target >= 0.9x); load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores"
    )
    return out, TokenCache.open(os.path.join(out, "train"))


def bench_loader(cache_path: str, args: argparse.Namespace) -> None:
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import NamedSharding, PartitionSpec

    from schooner.model import init, loss_fn, presets
    from schooner.tokenize import DataLoader, MixtureDataset

    seq_len, batch_size = args.seq_len, args.batch_size
    # Two components (train and validation caches of the corpus) so the mixture path is exercised.
    ds = MixtureDataset(
        {os.path.join(cache_path, "train"): 0.9, os.path.join(cache_path, "validation"): 0.1},
        seq_len=seq_len,
        seed=0,
    )
    mesh = jax.make_mesh((len(jax.devices()),), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data", None))

    n = args.loader_batches
    with DataLoader(ds, batch_size, sharding=sharding, prefetch=4, stop_step=n + 10) as loader:
        it = iter(loader)
        for _ in range(10):  # warm: threads up, first chunks cached
            next(it)
        t = time.perf_counter()
        for _ in range(n):
            _, batch = next(it)
        jax.block_until_ready(batch["tokens"])
        loader_s = (time.perf_counter() - t) / n

    config = dataclasses.replace(presets.llama_nano, vocab_size=4096, max_seq_len=max(seq_len, 512))
    model = init(config, key=jax.random.PRNGKey(0))
    opt = optax.adamw(3e-4)
    opt_state = opt.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def train_step(model, opt_state, tokens, segment_ids):
        (loss, _), grads = eqx.filter_value_and_grad(
            lambda m: loss_fn(m, tokens, segment_ids=segment_ids), has_aux=True
        )(model)
        updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    b = ds.batch(0, batch_size)
    tokens, segs = jnp.asarray(b["tokens"]), jnp.asarray(b["segment_ids"])
    for _ in range(3):
        model, opt_state, loss = train_step(model, opt_state, tokens, segs)
    jax.block_until_ready(loss)
    steps = args.train_steps
    t = time.perf_counter()
    for _ in range(steps):
        model, opt_state, loss = train_step(model, opt_state, tokens, segs)
    jax.block_until_ready(loss)
    step_s = (time.perf_counter() - t) / steps
    print(
        f"loader  (B={batch_size}, T={seq_len}, prefetch 4, sharded over {len(jax.devices())} devices): "
        f"{1 / loader_s:9.1f} batches/s"
    )
    print(f"train step (llama_nano vocab 4096, fwd+bwd+AdamW, jit)  : {1 / step_s:9.1f} steps/s")
    print(
        f"loader / train-step ratio                                : {step_s / loader_s:9.1f}x   (target >= 20x)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=100.0, help="MB of text to tokenize")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--loader-batches", type=int, default=400)
    p.add_argument("--train-steps", type=int, default=20)
    p.add_argument("--out", default=None, help="work folder (default: a temporary one, removed)")
    args = p.parse_args()
    work = args.out or tempfile.mkdtemp(prefix="schooner-bench-")
    try:
        cache, _ = bench_build(args, work)
        bench_loader(cache, args)
    finally:
        if args.out is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
