"""MoE load balance through the real train step: no balancing, the auxiliary loss, quantile balancing.

Each configuration trains with `schooner.train.make_train_step` and `AdamConfig()`'s defaults (AdamW, lr 3e-4,
1% warm-up, cosine decay; `--lr` to change) on real text: the bytes of Schooner's embedded corpus (Python's
documentation and standard-library source), random windows drawn from a fixed seed, so every run sees the same
batches. Models: a toy MoE (2 layers, width 64, 8 experts, top-2) and `presets.moe_small` (8 layers, width
512, 8 experts, top-2) with a 256-id byte vocabulary.

Reported per run, after `--warmup` steps: the mean, largest and 95th-percentile max/mean expert load (the
busiest expert of the busiest layer, relative to an even share), and the mean cross-entropy of the last 20
steps (the same batches in every run); plus the "floor": the max/mean load the final model shows on 20
fresh batches with its parameters frozen, i.e. what batch-to-batch variation of the data alone gives at this
batch size. A PNG of load over steps (the three balancing modes side by side, one panel per model) is
written to `docs/images/moe_balance.png`, the per-step rows to `benchmarks/results/moe_balance.json`.

Measured 2026-12-01 for `moe_small` (shared 2-core CPU, load average 8-24, 63 s/step, so a cut-down run):
`--models moe_small --modes quantile` and `--modes aux_loss`, each `--batch 8 --seq 64 --steps 30 --warmup 10`:
quantile after step 10 mean 2.84, p95 3.92 (floor p95 2.22), last 10 steps 2.47, final CE 3.384; aux loss
mean 3.98, p95 4.00 (collapsed; floor 4.00), final CE 3.405. Not the goal's regime (see lib/model/README.md).

Usage:
    uv run python benchmarks/moe_balance.py                        # toy, 120 steps of 32 x 64 bytes (the PNG)
    uv run python benchmarks/moe_balance.py --models moe_small --steps 120 --batch 16 --seq 128
    uv run python benchmarks/moe_balance.py --batch 128 --seq 128 --steps 300 --warmup 50  # a lower floor
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

MODES = ("none", "aux_loss", "quantile")
HERE = os.path.dirname(os.path.abspath(__file__))


def byte_stream(limit: int = 6_000_000) -> np.ndarray:
    """UTF-8 bytes of the embedded corpus: prose first, then code."""
    from schooner.data.sources import iter_source

    parts, total = [], 0
    for source, share in (("python-docs", 0.5), ("python-code", 1.0)):
        for record in iter_source(source):
            parts.append(record["text"].encode("utf-8"))
            total += len(parts[-1])
            if total > limit * share:
                break
    return np.frombuffer(b"".join(parts), np.uint8).astype(np.int32)


def batches(stream: np.ndarray, batch: int, seq: int, seed: int):
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(stream) - seq, size=batch)
        tokens = np.stack([stream[s : s + seq] for s in starts])
        yield {"tokens": jnp.asarray(tokens), "segment_ids": jnp.zeros((batch, seq), jnp.int32)}


def model_config(name: str, mode: str):
    from schooner.model import MoEConfig, presets

    if name == "toy":
        cfg = MoEConfig(
            vocab_size=256, hidden_dim=64, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
            max_seq_len=512, num_experts=8, num_experts_per_token=2,
        )  # fmt: skip
    else:
        cfg = dataclasses.replace(presets.moe_small, vocab_size=256)
    return dataclasses.replace(cfg, load_balancing=mode, compute_dtype="float32")


def train(name: str, mode: str, args: argparse.Namespace, stream: np.ndarray) -> dict:
    from schooner.model import init, loss_fn
    from schooner.train import AdamConfig, build_optimizer, init_state, make_train_step

    cfg = model_config(name, mode)
    opt = AdamConfig(**({} if args.lr is None else {"learning_rate": args.lr}))
    model = init(cfg, key=jax.random.PRNGKey(args.seed))
    tx = build_optimizer(opt, model, args.steps)
    state = init_state(model, tx, jax.random.PRNGKey(args.seed + 1))
    step = make_train_step(tx, z_loss_weight=0.0, microbatches=1, lr_schedule=opt.lr_schedule(args.steps))
    step = jax.jit(step, donate_argnums=0)
    data = batches(stream, args.batch, args.seq, args.seed)
    rows, t0 = [], time.perf_counter()
    for i in range(args.steps):
        state, metrics = step(state, next(data))
        rows.append({k: float(v) for k, v in jax.device_get(metrics).items()})
        if (i + 1) % 10 == 0 or i + 1 == args.steps:
            print(
                f"  {name} {mode} step {i + 1}/{args.steps}: load {rows[-1]['moe/max_load_ratio']:.2f}, "
                f"CE {rows[-1]['ce_loss']:.3f}, {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    seconds = time.perf_counter() - t0
    loads = np.array([r["moe/max_load_ratio"] for r in rows])
    after = loads[args.warmup :]
    probe = jax.jit(lambda m, t: loss_fn(m, t)[1]["moe/max_load_ratio"])
    fresh = batches(stream, args.batch, args.seq, seed=10_000 + args.seed)
    floor = [float(probe(state.model, next(fresh)["tokens"])) for _ in range(20)]
    return {
        "model": name,
        "mode": mode,
        "load": loads.tolist(),
        "ce": [r["ce_loss"] for r in rows],
        "mean_after_warmup": float(after.mean()),
        "max_after_warmup": float(after.max()),
        "p95_after_warmup": float(np.percentile(after, 95)),
        "final_ce": float(np.mean([r["ce_loss"] for r in rows[-20:]])),
        "floor_p95": float(np.percentile(floor, 95)),
        "floor_max": float(max(floor)),
        "seconds_per_step": seconds / args.steps,
    }


def plot(results: list[dict], args: argparse.Namespace, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in results}, key=["toy", "moe_small"].index)
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4), dpi=110, squeeze=False)
    for ax, name in zip(axes[0], models):
        for r in (r for r in results if r["model"] == name):
            label = (
                f"{r['mode']} (after warm-up: mean {r['mean_after_warmup']:.2f}, p95 {r['p95_after_warmup']:.2f}, "
                f"data floor p95 {r['floor_p95']:.2f}; final CE {r['final_ce']:.3f})"
            )
            ax.plot(np.arange(1, len(r["load"]) + 1), r["load"], linewidth=1, label=label)
        ax.axhline(1.3, color="gray", linestyle="--", linewidth=0.8)
        ax.axvline(args.warmup, color="gray", linestyle=":", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_yticks([1, 1.3, 2, 3, 4])
        ax.set_yticklabels(["1", "1.3", "2", "3", "4"])
        ax.set_xlabel("step")
        ax.set_ylabel("max / mean expert load (busiest layer)")
        ax.set_title(f"{name}: batch {args.batch} x {args.seq} bytes, AdamW lr {args.lr or 3e-4:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="toy", help="comma-separated: toy, moe_small")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--warmup", type=int, default=30, help="steps left out of the after-warm-up figures")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=None, help="AdamW peak learning rate (default: AdamConfig's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--png", default=os.path.join(HERE, "..", "docs", "images", "moe_balance.png"))
    p.add_argument("--json", default=os.path.join(HERE, "results", "moe_balance.json"))
    args = p.parse_args()
    print(f"devices {jax.devices()}  cpus {os.cpu_count()}  load average {os.getloadavg()}")
    stream = byte_stream()
    results = []
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            r = train(name, mode, args, stream)
            results.append(r)
            print(
                f"{name:9s} {mode:9s} after step {args.warmup}: max/mean load mean {r['mean_after_warmup']:.2f}, "
                f"max {r['max_after_warmup']:.2f}, "
                f"p95 {r['p95_after_warmup']:.2f} | final CE {r['final_ce']:.4f} | floor (frozen model, fresh "
                f"batches) p95 {r['floor_p95']:.2f}, max {r['floor_max']:.2f} | {r['seconds_per_step']:.2f} s/step",
                flush=True,
            )
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "results": results}, f)
    plot(results, args, args.png)
    print(f"wrote {args.png} and {args.json}; load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
