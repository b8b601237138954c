"""Forward+backward throughput of schooner.model decoders, against a plain jitted matmul ceiling.

For each config it times a jitted ``value_and_grad(loss_fn)`` step and prints tokens/s and the achieved
model FLOP/s (``flops_per_token(config, seq_len) * tokens/s``). The ceiling is the FLOP/s of a plain jitted
float32 matmul measured in the same run on the same machine, so the printed ratio is an MFU against what
this machine can actually do (target for the ~30M config: >= 0.35).

The machine may be shared, so load changes during a run: each round times one matmul and one train step
back to back, and the best of each is kept, so both are compared under the same conditions.

`--compare-kernels` instead times the two kernel paths of the backend switch (`LlamaConfig.kernels`:
"cpu", tuned for XLA:CPU, and "xla", the plain GPU/TPU path) on this machine, in float32 and bfloat16,
alternating them round by round, and prints what the CPU path saves.

Run:  uv run python benchmarks/model_throughput.py [--rounds 8] [--only llama_30m] [--compare-kernels]

Measured 2026-12-01 (issue 15), kernels="cpu" against "xla" on a shared 2-core CPU at load average 16-24
(other jobs), where wall times swing 1.5x between runs: instead of `--compare-kernels`' best-of wall time,
each path ran in its own process (jitted `value_and_grad(loss_fn)` of `presets.llama_nano`, bfloat16 compute,
16 x 256 tokens, as `compare_kernels` builds it), interleaved cpu, xla, xla, cpu, 6 timed steps after the
compile, timing the process CPU time (`time.process_time()`) of each step and reading `ru_maxrss`:
"cpu" 0.81 CPU-s per step (run medians 0.813, 0.843), "xla" 1.05 (1.093, 1.032): the CPU path does 1.29x the
tokens per CPU-second (1.22-1.34 over the four run pairs); wall-clock step medians 12.2, 16.0 s (cpu) against
21.8, 18.2 s (xla) under that load. Peak RSS equal (1028-1044 MiB either way; the jax runtime's, the model
has 0.7M parameters). float32 and the 30M model: not measured (no time at that load).
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


def _time_once(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def measure(config, batch: int, seq_len: int, matmul_size: int, rounds: int) -> tuple[float, float]:
    """(best train-step seconds, best matmul seconds), timed in alternation."""
    model = init(config, key=jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, seq_len), 0, config.vocab_size)
    segment_ids = jnp.zeros((batch, seq_len), jnp.int32)

    @eqx.filter_jit
    def step(m, t, s):
        return jax.value_and_grad(lambda mm: loss_fn(mm, t, segment_ids=s)[0])(m)

    a = jax.random.normal(jax.random.PRNGKey(2), (matmul_size, matmul_size), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(3), (matmul_size, matmul_size), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    jax.block_until_ready(step(model, tokens, segment_ids))  # compile + warm up
    jax.block_until_ready(matmul(a, b))
    best_step = best_matmul = float("inf")
    for _ in range(rounds):
        best_matmul = min(best_matmul, _time_once(matmul, a, b))
        best_step = min(best_step, _time_once(step, model, tokens, segment_ids))
    return best_step, best_matmul


def compare_kernels(runs: dict, rounds: int) -> None:
    """Step time of kernels="cpu" against kernels="xla", per config and compute dtype, interleaved."""
    for name, (config, batch, seq_len) in runs.items():
        for dtype in ("float32", "bfloat16"):
            steps = {}
            for kernels in ("cpu", "xla"):
                cfg = dataclasses.replace(config, compute_dtype=dtype, kernels=kernels)
                model = init(cfg, key=jax.random.PRNGKey(0))
                tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, seq_len), 0, cfg.vocab_size)
                segs = jnp.zeros((batch, seq_len), jnp.int32)
                fn = eqx.filter_jit(
                    lambda m, t, s: jax.value_and_grad(lambda mm: loss_fn(mm, t, segment_ids=s)[0])(m)
                )
                jax.block_until_ready(fn(model, tokens, segs))  # compile + warm up
                steps[kernels] = (fn, model, tokens, segs)
            best = {k: float("inf") for k in steps}
            for _ in range(rounds):
                for k, (fn, *args) in steps.items():
                    best[k] = min(best[k], _time_once(fn, *args))
            print(
                f"{name} {dtype}: kernels='cpu' {best['cpu'] * 1e3:7.1f} ms, kernels='xla' {best['xla'] * 1e3:7.1f} "
                f"ms per fwd+bwd (batch {batch} x {seq_len}); the CPU path takes {best['cpu'] / best['xla']:.2f}x "
                "the time of the plain path"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=8, help="alternating timed rounds (best of each is kept)"
    )
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--only", choices=["llama_nano", "llama_30m"], default=None)
    parser.add_argument("--compare-kernels", action="store_true", help="time kernels='cpu' against 'xla'")
    args = parser.parse_args()

    runs = {
        "llama_nano": (dataclasses.replace(presets.llama_nano, compute_dtype="float32"), 16, 256),
        "llama_30m": (dataclasses.replace(presets.llama_30m, compute_dtype="float32"), 8, 256),
    }
    print(
        f"backend={jax.default_backend()} devices={jax.device_count()} cpus={os.cpu_count()} "
        f"loadavg(1m)={os.getloadavg()[0]:.1f}"
    )
    if args.compare_kernels:
        compare_kernels({k: v for k, v in runs.items() if not args.only or k == args.only}, args.rounds)
        print(f"loadavg(1m) at end={os.getloadavg()[0]:.1f} (other processes share the cores)")
        return
    for name, (config, batch, seq_len) in runs.items():
        if args.only and name != args.only:
            continue
        step_s, matmul_s = measure(config, batch, seq_len, args.matmul_size, args.rounds)
        ceiling = 2.0 * args.matmul_size**3 / matmul_s
        tokens_per_s = batch * seq_len / step_s
        flops = tokens_per_s * flops_per_token(config, seq_len)
        print(
            f"{name}: params={num_parameters(config) / 1e6:.1f}M batch={batch} seq={seq_len} "
            f"fwd+bwd {tokens_per_s:,.0f} tokens/s, {flops / 1e9:.2f} GFLOP/s; "
            f"ceiling (fp32 matmul {args.matmul_size}^3) {ceiling / 1e9:.2f} GFLOP/s; "
            f"ratio {flops / ceiling:.3f}"
        )
    print(f"loadavg(1m) at end={os.getloadavg()[0]:.1f} (other processes share the cores)")


if __name__ == "__main__":
    main()
