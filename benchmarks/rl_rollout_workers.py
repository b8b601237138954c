"""Rollout time of one GRPO group with the trainer sampling it (N = 0) against N rollout workers of the cluster
layer (`Grpo(rollout_workers=N)`: `_rl_workers.RolloutPool`), the same chunks, so the same rollouts bitwise.

A randomly initialised `llama_nano`-shaped model samples `--prompts` prompts (8 to 48 tokens) x `--group`
samples x exactly `--new` tokens (no stop id), temperature 1, top-p 0.95, in chunks of `--chunk` prompts
(default: prompts / workers). N = 0 samples the chunks one after another in this process; N workers are
`LocalClient` processes (or Ray tasks with `--ray`), each sent the weights through a version-stamped file.
Each side runs once to warm up (JAX compiles, in every worker), then the best of `--repeats` timed groups
counts; the N > 0 time includes publishing the weights, the jobs' round trips and the check that the rows equal
N = 0's.

    uv run python benchmarks/rl_rollout_workers.py [--workers 2 --prompts 8 --group 4 --new 64 --repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ray", action="store_true", help="workers as Ray tasks on a local Ray")
    args = ap.parse_args()

    import jax
    import numpy as np

    from schooner.cluster import LocalClient, RayClient, using_client
    from schooner.model import SamplingConfig, init, presets
    from schooner.train import RolloutPool

    config = dataclasses.replace(presets.llama_nano, max_seq_len=48 + args.new)
    model = init(config, key=jax.random.key(0))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, config.vocab_size, rng.integers(8, 49)).tolist() for _ in range(args.prompts)]
    sampling = SamplingConfig(temperature=1.0, top_p=0.95, n=args.group, max_new_tokens=args.new)
    chunk = args.chunk or -(-args.prompts // args.workers)
    kw = dict(sampling=sampling, seed=0, max_prompt_tokens=48, pad_id=0, chunk=chunk)
    root = tempfile.mkdtemp(prefix="rl-workers-bench-")

    def timed(pool: RolloutPool) -> tuple[float, object]:
        out = pool.rollout(model, prompts, group=0, **kw)  # warm-up: compiles (in every worker)
        best = float("inf")
        for g in range(1, args.repeats + 1):
            start = time.perf_counter()
            out = pool.rollout(model, prompts, group=g, **kw)
            best = min(best, time.perf_counter() - start)
        return best, out

    here_s, here = timed(RolloutPool(0, root, config))
    client = RayClient() if args.ray else LocalClient(max_workers=args.workers)
    try:
        with using_client(client):
            there_s, there = timed(RolloutPool(args.workers, root, config))
    finally:
        client.shutdown()
    same = all(
        np.array_equal(getattr(here, f), getattr(there, f)) for f in ("tokens", "old_logprobs", "mask")
    )
    tokens = int(here.mask.sum())
    print(
        json.dumps(
            {
                "prompts": args.prompts,
                "group": args.group,
                "new": args.new,
                "chunk": chunk,
                "workers": args.workers,
                "backend": "ray" if args.ray else "local",
                "cores": os.cpu_count(),
                "load_average_1m": os.getloadavg()[0],
                "n0_seconds": round(here_s, 3),
                "workers_seconds": round(there_s, 3),
                "speedup": round(here_s / there_s, 2),
                "new_tokens": tokens,
                "bitwise_equal": same,
            }
        )
    )


if __name__ == "__main__":
    main()
