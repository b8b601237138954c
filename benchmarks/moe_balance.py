"""MoE load balance through the real train step: no balancing, the auxiliary loss, quantile balancing with
and without the post-step re-solve of the router bias (`MoEConfig.router_bias_resolve`, on by default).

Each configuration trains with `schooner.train.make_train_step` and `AdamConfig()`'s defaults (AdamW, lr 3e-4,
1% warm-up, cosine decay; `--lr` to change) on real text: the bytes of Schooner's embedded corpus (Python's
documentation and standard-library source), random windows drawn from a fixed seed, so every run sees the same
batches. Models: a toy MoE (2 layers, width 64, 8 experts, top-2) and `presets.moe_small` (8 layers, width
512, 8 experts, top-2) with a 256-id byte vocabulary.

Reported per run, after `--warmup` steps: the mean, largest and 95th-percentile max/mean expert load (the
busiest expert of the busiest layer, relative to an even share, of each step's batch, routed by the bias
set from earlier batches), and the mean cross-entropy of the last 20 steps (the same batches in every run).
For quantile runs also the data's noise floor against batch size: the trained router frozen with the best
FIXED bias (solved on `--pool` held-out sequences), its max/mean load on `--floor-n` fresh batches of each
size in `--floor-batches`: what batch-to-batch variation of the data alone gives, so what no bias taken from
past batches can beat. A PNG (load over steps, the modes side by side, one panel per model, and the noise
floor against tokens per batch) goes to `docs/images/moe_balance.png`, the per-step rows to
`benchmarks/results/moe_balance.json`.

Measured 2026-12-01/02 (toy, the defaults: 130 steps of 128 x 64 bytes, one process per mode, merged with
`--merge`), after step 30: none 4.00 (collapsed), CE 3.821; aux loss mean 1.55, p95 1.99, max 2.82, CE 3.817;
quantile without the re-solve mean 1.13, p95 1.25, max 1.35 (1.56 in steps 2-30: the bias lags the router's
inputs by a step), CE 3.816; quantile with the re-solve (the default; since 2026-12-02 solved layer by layer
at rate 0.5; none and aux loss rerun the same day, merged with the no-re-solve run of 2026-12-01) mean 1.09,
p95 1.16, max 1.20, every step from step 2 at or under 1.25, CE 3.816: at the data's noise floor (p95 1.15,
largest 1.22 at 8,192 bytes). `--cost N` times the re-solve's extra forward pass. Noise floor: see lib/model/README.md. `moe_small`: a cut-down run only (lib/model/README.md).

Usage:
    uv run python benchmarks/moe_balance.py                        # toy, 130 steps of 128 x 64 bytes (the PNG)
    uv run python benchmarks/moe_balance.py --modes quantile --json q.json   # one mode per process, then:
    uv run python benchmarks/moe_balance.py --merge none.json,aux.json,q.json
    uv run python benchmarks/moe_balance.py --cost 10                 # s/step with and without the re-solve
    uv run python benchmarks/moe_balance.py --models moe_small --modes aux_loss,quantile --steps 300 --warmup 50

The modes of a model train interleaved in one process on the same batches; every 10 steps the figures so far
go to `--json` (`steps_done`), so a long run stopped early leaves a record `--merge` can plot.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

MODES = ("none", "aux_loss", "quantile_no_resolve", "quantile")
RUN_ARGS = (
    "steps",
    "warmup",
    "batch",
    "seq",
    "lr",
    "rate",
    "seed",
    "pool",
    "floor_batches",
    "floor_n",
)  # shared by merged runs
LABELS = {"quantile_no_resolve": "quantile, no re-solve", "quantile": "quantile + re-solve (default)"}
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


def model_config(name: str, mode: str, rate: float | None = None):
    from schooner.model import MoEConfig, presets

    if name == "toy":
        cfg = MoEConfig(
            vocab_size=256, hidden_dim=64, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
            max_seq_len=512, num_experts=8, num_experts_per_token=2,
        )  # fmt: skip
    else:
        cfg = dataclasses.replace(presets.moe_small, vocab_size=256)
    balancing = "quantile" if mode.startswith("quantile") else mode
    cfg = dataclasses.replace(
        cfg,
        load_balancing=balancing,
        router_bias_resolve=mode != "quantile_no_resolve",
        compute_dtype="float32",
    )
    return cfg if rate is None else dataclasses.replace(cfg, router_bias_rate=rate)


def summarise(name: str, mode: str, rows: list[dict], args: argparse.Namespace, seconds: float) -> dict:
    """One run's figures from its per-step metrics (``rows``, as many steps as were done)."""
    loads = np.array([r["moe/max_load_ratio"] for r in rows])
    after = loads[args.warmup :] if len(loads) > args.warmup else loads[-1:]
    return {
        "model": name,
        "mode": mode,
        "label": LABELS.get(mode, mode) + ("" if args.rate is None else f" (rate {args.rate:g})"),
        "steps_done": len(rows),
        "load": loads.tolist(),
        "ce": [r["ce_loss"] for r in rows],
        "mean_after_warmup": float(after.mean()),
        "max_after_warmup": float(after.max()),
        "p95_after_warmup": float(np.percentile(after, 95)),
        "final_ce": float(np.mean([r["ce_loss"] for r in rows[-20:]])),
        "seconds_per_step": seconds / max(len(rows), 1),
    }


def train(
    name: str, modes: list[str], args: argparse.Namespace, stream: np.ndarray, finished: list[dict]
) -> list[dict]:
    """Train one model in every mode of ``modes``, the modes interleaved step by step in this process on the
    same batches (so a load change on the machine hits them alike, and a run stopped early has the same number
    of steps in every mode). Every 10 steps the figures so far are written to ``--json`` (``steps_done``),
    after the ``finished`` results of models trained before: an interrupted run leaves a usable, plottable
    record."""
    from schooner.model import init
    from schooner.train import AdamConfig, build_optimizer, init_state, make_train_step

    opt = AdamConfig(**({} if args.lr is None else {"learning_rate": args.lr}))
    states, steps = {}, {}
    for mode in modes:
        model = init(model_config(name, mode, args.rate), key=jax.random.PRNGKey(args.seed))
        tx = build_optimizer(opt, model, args.steps)
        states[mode] = init_state(model, tx, jax.random.PRNGKey(args.seed + 1))
        step = make_train_step(tx, z_loss_weight=0.0, microbatches=1, lr_schedule=opt.lr_schedule(args.steps))
        steps[mode] = jax.jit(step, donate_argnums=0)
    data = batches(stream, args.batch, args.seq, args.seed)
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    seconds = dict.fromkeys(modes, 0.0)
    t0 = time.perf_counter()
    for i in range(args.steps):
        batch = next(data)
        for mode in modes:
            t = time.perf_counter()
            states[mode], metrics = steps[mode](states[mode], batch)
            rows[mode].append({k: float(v) for k, v in jax.device_get(metrics).items()})
            seconds[mode] += time.perf_counter() - t
        if (i + 1) % 10 == 0 or i + 1 == args.steps:
            done = ", ".join(
                f"{m} load {rows[m][-1]['moe/max_load_ratio']:.2f} CE {rows[m][-1]['ce_loss']:.3f}"
                for m in modes
            )
            eta = (time.perf_counter() - t0) / (i + 1) * (args.steps - i - 1)
            print(f"  {name} step {i + 1}/{args.steps}: {done} | ETA {eta / 60:.0f} min", flush=True)
            write_json([*finished, *(summarise(name, m, rows[m], args, seconds[m]) for m in modes)], args)
    out = []
    for mode in modes:
        r = summarise(name, mode, rows[mode], args, seconds[mode])
        fresh = batches(stream, args.batch, args.seq, seed=10_000 + args.seed)
        floor = [float(max_load(states[mode].model, next(fresh)["tokens"])) for _ in range(20)]
        r["floor_p95"], r["floor_max"] = float(np.percentile(floor, 95)), float(max(floor))
        r["noise_floor"] = (
            noise_floor(states[mode].model, stream, args) if mode == "quantile" and args.floor_n else []
        )
        out.append(r)
    return out


def resolve_cost(name: str, args: argparse.Namespace, stream: np.ndarray) -> dict:
    """Seconds per train step of quantile balancing with and without the post-step re-solve, measured in one
    process on the same batches, the two steps interleaved (so load changes hit both alike), after compiling."""
    from schooner.model import init
    from schooner.train import AdamConfig, build_optimizer, init_state, make_train_step

    opt, steps, states, times = AdamConfig(), {}, {}, {"quantile_no_resolve": [], "quantile": []}
    for mode in times:
        model = init(model_config(name, mode), key=jax.random.PRNGKey(args.seed))
        tx = build_optimizer(opt, model, args.steps)
        steps[mode] = jax.jit(
            make_train_step(tx, z_loss_weight=0.0, microbatches=1, lr_schedule=opt.lr_schedule(args.steps))
        )
        states[mode] = init_state(model, tx, jax.random.PRNGKey(args.seed + 1))
    data = batches(stream, args.batch, args.seq, args.seed)
    for i in range(args.cost + 1):
        batch = next(data)
        for mode in times:
            t0 = time.perf_counter()
            states[mode], metrics = steps[mode](states[mode], batch)
            jax.block_until_ready(metrics)
            if i:  # step 0 compiles
                times[mode].append(time.perf_counter() - t0)
    off, on = (float(np.median(times[m])) for m in times)
    print(
        f"{name}: median s/step quantile {off:.3f}, with the re-solve {on:.3f}: ratio {on / off:.3f}",
        flush=True,
    )
    return {
        "model": name,
        "s_per_step_no_resolve": off,
        "s_per_step_resolve": on,
        "ratio": on / off,
        "n": args.cost,
    }


@jax.jit
def max_load(model, tokens: jax.Array) -> jax.Array:
    """max/mean expert load (busiest expert of the busiest layer) of one forward pass, the model frozen."""
    from schooner.model import loss_fn

    return loss_fn(model, tokens)[1]["moe/max_load_ratio"]


def noise_floor(model, stream: np.ndarray, args: argparse.Namespace) -> list[dict]:
    """The data's noise floor: max/mean load of the trained router, its bias solved once on a large held-out
    pool (``--pool`` sequences; the best FIXED bias), on ``--floor-n`` fresh batches of each size in
    ``--floor-batches`` (sequences of ``--seq`` bytes). No router whose bias comes from past batches does
    better on average: what is left is the batch-to-batch variation of the data."""
    from schooner.model import loss_and_balance

    shift = jax.jit(lambda m, t: loss_and_balance(m, t)[1][1].shift)
    pool = next(batches(stream, args.pool, args.seq, seed=20_000 + args.seed))["tokens"]
    for _ in range(4):  # the layers interact (layer 1 sees layer 0's output): a few rounds
        bias = model.layers.stacked.mlp.router_bias.array + shift(model, pool)
        model = eqx.tree_at(lambda m: m.layers.stacked.mlp.router_bias.array, model, bias)
    out = []
    for size in (int(b) for b in args.floor_batches.split(",")):
        fresh = batches(stream, size, args.seq, seed=30_000 + size + args.seed)
        loads = np.array([float(max_load(model, next(fresh)["tokens"])) for _ in range(args.floor_n)])
        out.append({"batch": size, "tokens": size * args.seq, "mean": float(loads.mean()),
                    "p95": float(np.percentile(loads, 95)), "max": float(loads.max())})  # fmt: skip
        print(
            f"  noise floor at {size} x {args.seq}: p95 {out[-1]['p95']:.3f}, max {out[-1]['max']:.3f}",
            flush=True,
        )
    return out


def plot(results: list[dict], args: argparse.Namespace, path: str) -> None:
    """Load over steps (one panel per model, the modes side by side) and the noise floor against batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in results}, key=["toy", "moe_small"].index)
    floors = {r["model"]: r["noise_floor"] for r in results if r.get("noise_floor")}
    panels = len(models) + bool(floors)
    fig, axes = plt.subplots(1, panels, figsize=(max(6.5 * panels, 11.0), 4.3), dpi=110, squeeze=False)
    for ax, name in zip(axes[0], models):
        for r in (r for r in results if r["model"] == name):
            label = (
                f"{r.get('label', r['mode'])}: after warm-up mean {r['mean_after_warmup']:.2f}, p95 {r['p95_after_warmup']:.2f}, "
                f"max {r['max_after_warmup']:.2f}; final CE {r['final_ce']:.3f}"
            )
            if len(r["load"]) < args.steps:
                label += f" (stopped at step {len(r['load'])} of {args.steps})"
            ax.plot(np.arange(1, len(r["load"]) + 1), r["load"], linewidth=1, label=label)
        here = [f for f in floors.get(name, []) if f["batch"] == args.batch]
        if here:
            ax.axhspan(
                1.0, here[0]["p95"], color="gray", alpha=0.15, label=f"noise floor p95 {here[0]['p95']:.2f}"
            )
        ax.axhline(1.3, color="gray", linestyle="--", linewidth=0.8)
        ax.axvline(args.warmup, color="gray", linestyle=":", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_yticks([1, 1.3, 2, 3, 4])
        ax.set_yticklabels(["1", "1.3", "2", "3", "4"])
        ax.set_xlabel("step")
        ax.set_ylabel("max / mean expert load (busiest layer)")
        lr = args.lr or 3e-4
        ax.set_title(f"{name}: batch {args.batch} x {args.seq} bytes, AdamW lr {lr:g}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if floors:
        ax = axes[0][-1]
        for name, rows in floors.items():
            tokens = [f["tokens"] for f in rows]
            ax.plot(tokens, [f["p95"] for f in rows], marker="o", label=f"{name}: p95")
            ax.plot(tokens, [f["max"] for f in rows], marker="^", linestyle=":", label=f"{name}: max")
        ax.axhline(1.3, color="gray", linestyle="--", linewidth=0.8)
        ax.axvline(
            args.batch * args.seq, color="gray", linestyle=":", linewidth=0.8, label="this run's batch"
        )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per batch")
        ax.set_ylabel("max / mean load, best fixed bias, fresh batches")
        ax.set_title(f"noise floor of the data ({args.floor_n} fresh batches per size)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="toy", help="comma-separated: toy, moe_small")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--steps", type=int, default=130)
    p.add_argument("--warmup", type=int, default=30, help="steps left out of the after-warm-up figures")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=None, help="AdamW peak learning rate (default: AdamConfig's)")
    p.add_argument("--rate", type=float, default=None, help="router_bias_rate (default: MoEConfig's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--pool", type=int, default=1024, help="sequences the noise floor's fixed bias is solved on"
    )
    p.add_argument("--floor-batches", default="32,128,256,512", help="batch sizes (sequences) of the floor")
    p.add_argument("--floor-n", type=int, default=30, help="fresh batches per floor size")
    p.add_argument(
        "--cost",
        type=int,
        default=0,
        help="instead of training: time this many interleaved steps of quantile balancing with and without "
        "the post-step re-solve (one process, same batches) and print the ratio",
    )
    p.add_argument("--png", default=os.path.join(HERE, "..", "docs", "images", "moe_balance.png"))
    p.add_argument("--json", default=os.path.join(HERE, "results", "moe_balance.json"))
    p.add_argument(
        "--merge",
        default=None,
        help="comma-separated JSON files of earlier runs (same --batch/--seq/--steps, e.g. one mode per process): "
        "plot and save their results together instead of training",
    )
    args = p.parse_args()
    if args.merge:
        results, runs = [], []
        for path in args.merge.split(","):
            with open(path) as f:
                record = json.load(f)
            results += record["results"]
            runs.append((path, {k: record["args"].get(k) for k in RUN_ARGS}))
        first_path, first = runs[0]
        differ = [
            f"{path} has " + ", ".join(f"{k}={run[k]!r}" for k in RUN_ARGS if run[k] != first[k])
            for path, run in runs[1:]
            if run != first
        ]
        if differ:
            raise SystemExit(
                f"--merge: runs made with other settings than {first_path} ({first}): "
                + "; ".join(differ)
                + ". Merge only runs made with the same settings."
            )
        vars(args).update(runs[0][1])  # the figure and the merged record describe the runs, not this command
        save(results, args)
        return
    print(f"devices {jax.devices()}  cpus {os.cpu_count()}  load average {os.getloadavg()}")
    stream = byte_stream()
    if args.cost:
        for name in args.models.split(","):
            print(json.dumps(resolve_cost(name, args, stream)))
        return
    results: list[dict] = []
    for name in args.models.split(","):
        for r in train(name, args.modes.split(","), args, stream, results):
            results.append(r)
            print(
                f"{name:9s} {r['mode']:9s} after step {args.warmup}: max/mean load mean {r['mean_after_warmup']:.2f}, "
                f"max {r['max_after_warmup']:.2f}, "
                f"p95 {r['p95_after_warmup']:.2f} | final CE {r['final_ce']:.4f} | frozen final model on fresh "
                f"batches: p95 {r['floor_p95']:.2f}, max {r['floor_max']:.2f} | {r['seconds_per_step']:.2f} s/step",
                flush=True,
            )
    save(results, args)


def write_json(results: list[dict], args: argparse.Namespace) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    tmp = args.json + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"args": vars(args), "results": results}, f)
    os.replace(tmp, args.json)


def save(results: list[dict], args: argparse.Namespace) -> None:
    write_json(results, args)
    plot(results, args, args.png)
    print(f"wrote {args.png} and {args.json}; load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
