"""Forward+backward throughput of schooner.model decoders, against a plain jitted matmul ceiling.

For each config it times a jitted ``value_and_grad(loss_fn)`` step and prints tokens/s and the achieved
model FLOP/s (``flops_per_token(config, seq_len) * tokens/s``). The ceiling is the FLOP/s of a plain jitted
float32 matmul measured in the same run on the same machine, so the printed ratio is an MFU against what
this machine can actually do (target for the ~30M config: >= 0.35).

Run:  uv run python benchmarks/model_throughput.py [--steps 5] [--only llama_30m]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import equinox as eqx
import jax
import jax.numpy as jnp

from schooner.model import flops_per_token, init, loss_fn, num_parameters, presets


def _best_time(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile + warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def matmul_ceiling(n: int, repeats: int) -> float:
    """FLOP/s of a jitted float32 [n, n] @ [n, n] matmul (best of ``repeats``)."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    seconds = _best_time(jax.jit(jnp.matmul), a, b, repeats=repeats)
    return 2.0 * n**3 / seconds


def train_step_throughput(config, batch: int, seq_len: int, repeats: int) -> tuple[float, float]:
    """(tokens/s, model FLOP/s) of one forward+backward step."""
    model = init(config, key=jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, seq_len), 0, config.vocab_size)
    segment_ids = jnp.zeros((batch, seq_len), jnp.int32)

    @eqx.filter_jit
    def step(m, t, s):
        return jax.value_and_grad(lambda mm: loss_fn(mm, t, segment_ids=s)[0])(m)

    seconds = _best_time(step, model, tokens, segment_ids, repeats=repeats)
    tokens_per_s = batch * seq_len / seconds
    return tokens_per_s, tokens_per_s * flops_per_token(config, seq_len)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed repetitions per measurement (best is kept)"
    )
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--only", choices=["llama_nano", "llama_30m"], default=None)
    args = parser.parse_args()

    runs = {
        "llama_nano": (dataclasses.replace(presets.llama_nano, compute_dtype="float32"), 16, 256),
        "llama_30m": (dataclasses.replace(presets.llama_30m, compute_dtype="float32"), 8, 256),
    }
    print(
        f"backend={jax.default_backend()} devices={jax.device_count()} cpus={os.cpu_count()} "
        f"loadavg(1m)={os.getloadavg()[0]:.1f}"
    )
    ceiling = matmul_ceiling(args.matmul_size, args.repeats)
    print(f"ceiling: jitted fp32 matmul {args.matmul_size}^3: {ceiling / 1e9:.2f} GFLOP/s")
    for name, (config, batch, seq_len) in runs.items():
        if args.only and name != args.only:
            continue
        tps, flops = train_step_throughput(config, batch, seq_len, args.repeats)
        print(
            f"{name}: params={num_parameters(config) / 1e6:.1f}M batch={batch} seq={seq_len} "
            f"fwd+bwd {tps:,.0f} tokens/s, {flops / 1e9:.2f} GFLOP/s, "
            f"{flops / ceiling:.3f} of the matmul ceiling"
        )
    print(f"loadavg(1m) at end={os.getloadavg()[0]:.1f} (other processes share the cores)")


if __name__ == "__main__":
    main()
