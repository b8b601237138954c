"""Token cache and loader throughput, each next to its peer measured in the same run.

1. Cache build (records -> `train/`+`validation/` tensorstore caches, end to end: read .jsonl.zst shards,
   encode, split, write parts, merge, manifests) with each encoder (HF `tokenizers` and the tiktoken fast
   path), next to the bare encoders on the same texts, in MB of text per CPU-second (user + system of
   this process and its workers: per core, and much less sensitive than wall clock to a busy machine).
   Peers: bare HF `encode_batch` on one thread (TOKENIZERS_PARALLELISM=false, ids materialised); bare
   tiktoken `encode_ordinary` on one thread, and on `--workers` threads as tiktoken's own
   `encode_ordinary_batch` runs it (a thread pool over the texts): the peer at the build's parallelism.
   The build runs on `--workers` threads of this process (inputs under `build_cache`'s in_process_below)
   and, as a further line, on `--workers` LocalClient worker processes (`in_process_below=0`).
   Goals: build with tiktoken >= 3x bare HF and >= 0.9x bare tiktoken; both caches byte-identical.
   Each tiktoken figure is the best of `--repeat` interleaved runs (the HF ones, far from their goal,
   run once): on a shared machine other processes inflate CPU-seconds by cache and memory contention.
2. `DataLoader` batches/s (MixtureDataset over two caches, prefetch threads, device placement) for the
   tutorial's training shape, next to the training steps/s that shape allows (a jitted fwd+bwd+Adam step
   of `llama_nano`). Target: >= 20x.

Usage: uv run python benchmarks/tokenize_throughput.py [--mb 100] [--workers 2] [--repeat 3] [--out /tmp/bench]
       [--no-loader]
"""

from __future__ import annotations

import argparse
import concurrent.futures
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


def _build(
    src: str, out: str, tok, encoder: str, workers: int, in_process: bool
) -> tuple[dict, float, float]:
    from schooner.cluster import LocalClient
    from schooner.tokenize import build_cache

    shutil.rmtree(out, ignore_errors=True)
    client = LocalClient(max_workers=workers)
    below = {} if in_process else {"in_process_below": 0}
    t, c = time.perf_counter(), _cpu(children=True)
    try:
        summary = build_cache(
            src, out, tok, validation_fraction=0.01, client=client, encoder=encoder, **below
        )
        wall = time.perf_counter() - t
    finally:
        client.shutdown()  # waits for the workers, so their CPU time lands in RUSAGE_CHILDREN
    return summary, wall, _cpu(children=True) - c


def _arrays_equal(a: str, b: str) -> bool:
    """Whether two builds hold byte-identical caches (every array file and every manifest field but the
    encoder choice)."""
    import json

    for split in ("train", "validation"):
        for root, _, names in os.walk(os.path.join(a, split)):
            for n in names:
                pa = os.path.join(root, n)
                pb = os.path.join(b, os.path.relpath(pa, a))
                with open(pa, "rb") as fa, open(pb, "rb") as fb:
                    da, db = fa.read(), fb.read()
                if n == "manifest.json":
                    ma, mb = json.loads(da), json.loads(db)
                    ma.pop("encoder"), mb.pop("encoder")
                    da, db = json.dumps(ma).encode(), json.dumps(mb).encode()
                if da != db:
                    return False
    return True


def bench_build(args: argparse.Namespace, work: str) -> tuple[str, object]:
    from schooner.data import write_records
    from schooner.tokenize import TokenCache, train_bpe

    records = corpus(int(args.mb * 1e6))
    n_bytes = sum(len(r["text"].encode("utf-8")) for r in records)
    src = os.path.join(work, "records")
    write_records(records, src, format="jsonl.zst", num_shards=args.shards)
    texts = [r["text"] for r in records]
    del records
    tok = train_bpe(texts[:1200], vocab_size=4096)
    print(
        f"corpus: {len(texts)} documents, {n_bytes / 1e6:.1f} MB of text, {args.shards} shards; vocab 4096; "
        f"fast path: {tok.encoder_choice.reason}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    mb = n_bytes / 1e6
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    core = tok._fast._core if tok._fast is not None else None
    w = args.workers

    def bare_hf() -> int:
        n = 0
        for i in range(0, len(texts), 512):
            batch = tok._hf_plain.encode_batch_fast(texts[i : i + 512], add_special_tokens=False)
            n += sum(len(e.ids) for e in batch)
        return n

    def bare_tiktoken() -> int:
        return sum(len(core.encode_ordinary(t)) for t in texts)

    def bare_tiktoken_threads() -> int:  # tiktoken's encode_ordinary_batch(texts, num_threads=w)
        with concurrent.futures.ThreadPoolExecutor(w) as pool:
            return sum(len(ids) for ids in pool.map(core.encode_ordinary, texts))

    def timed(fn) -> tuple[float, int]:
        c = _cpu()
        n = fn()
        return _cpu() - c, n

    cpu: dict[str, float] = {}
    outs = {"hf": os.path.join(work, "cache-hf"), "tiktoken": os.path.join(work, "cache-tiktoken"),
            "workers": os.path.join(work, "cache-workers")}  # fmt: skip
    cpu["bare HF encode_batch, 1 thread"], n_bare = timed(bare_hf)
    summary, wall, cpu["cache build, hf encoder"] = _build(src, outs["hf"], tok, "hf", w, True)
    print(f"cache build (hf): {wall:.1f} s wall, {cpu['cache build, hf encoder']:.1f} CPU-s, {w} threads")
    n_docs = summary["train_documents"] + summary["validation_documents"]
    assert summary["train_tokens"] + summary["validation_tokens"] == n_bare + n_docs
    names = ("bare tiktoken, 1 thread", f"bare tiktoken, {w} threads", "cache build, tiktoken encoder",
             f"cache build, tiktoken, {w} worker processes")  # fmt: skip
    for rep in range(args.repeat):
        for name in names:
            if name.startswith("bare"):
                got, n = timed(bare_tiktoken if name.endswith("1 thread") else bare_tiktoken_threads)
                assert n == n_bare, (name, n, n_bare)
            else:
                out = outs["tiktoken" if name.endswith("encoder") else "workers"]
                summary, wall, got = _build(src, out, tok, "tiktoken", w, name.endswith("encoder"))
                assert summary["train_tokens"] + summary["validation_tokens"] == n_bare + n_docs
                print(f"{name} (run {rep + 1}): {wall:.1f} s wall, {got:.1f} CPU-s")
            cpu[name] = min(got, cpu.get(name, got))
    rates = {name: mb / c for name, c in cpu.items()}
    for name, r in rates.items():
        print(f"{name:44s}: {r:7.2f} MB per CPU-second")
    fast, hf = rates["cache build, tiktoken encoder"], rates["bare HF encode_batch, 1 thread"]
    tt1, ttw = rates["bare tiktoken, 1 thread"], rates[f"bare tiktoken, {w} threads"]
    procs = rates[f"cache build, tiktoken, {w} worker processes"]
    identical = _arrays_equal(outs["hf"], outs["tiktoken"]) and _arrays_equal(outs["hf"], outs["workers"])
    print(
        f"cache build (tiktoken) / bare HF, 1 thread        : {fast / hf:.2f}x (goal >= 3x)\n"
        f"cache build (tiktoken) / bare tiktoken, {w} threads : {fast / ttw:.2f}x (goal >= 0.9x)\n"
        f"cache build (tiktoken) / bare tiktoken, 1 thread  : {fast / tt1:.2f}x\n"
        f"cache build on {w} worker processes / bare tiktoken, {w} threads: {procs / ttw:.2f}x\n"
        f"cache build (hf) / bare HF, 1 thread              : {rates['cache build, hf encoder'] / hf:.2f}x\n"
        f"caches byte-identical (hf, tiktoken, tiktoken on workers): {identical}; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    return outs["tiktoken"], TokenCache.open(os.path.join(outs["tiktoken"], "train"))


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
    p.add_argument("--repeat", type=int, default=3, help="runs of each tiktoken figure (the best is kept)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--loader-batches", type=int, default=400)
    p.add_argument("--train-steps", type=int, default=20)
    p.add_argument("--out", default=None, help="work folder (default: a temporary one, removed)")
    p.add_argument("--no-loader", action="store_true", help="only the tokenization part")
    args = p.parse_args()
    work = args.out or tempfile.mkdtemp(prefix="schooner-bench-")
    try:
        cache, _ = bench_build(args, work)
        if not args.no_loader:
            bench_loader(cache, args)
    finally:
        if args.out is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
